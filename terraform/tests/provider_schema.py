"""The google provider's resource schemas, read offline from the jsii assembly that the PyPI
package cdktn-provider-google ships (no provider can be downloaded here), and a check that every
argument and block the module uses exists there."""

from __future__ import annotations

import io
import json
import pathlib
import re
import tarfile
import zipfile

from hcl import Block, Module

# Arguments every resource takes (Terraform's own, not the provider's).
META_ARGUMENTS = {"count", "for_each", "depends_on", "provider", "lifecycle", "provisioner", "connection"}
DOC_ANCHOR = re.compile(r"/docs/resources/([a-z0-9_]+)#([a-z0-9_]+)")
RESOURCE_OF_CLASS = re.compile(r"/docs/resources/([a-z0-9_]+)\s+(google_[a-z0-9_]+)")


def load_assembly(wheel: pathlib.Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(archive.read(name))) as tar:
            return json.load(tar.extractfile("package/.jsii"))


class ProviderSchema:
    def __init__(self, assembly: dict):
        self.types = assembly["types"]
        self.version = re.search(r"hashicorp/google/([0-9.]+)/", json.dumps(next(iter(self.types.values()))["docs"])) if self.types else None
        self.resources = {}  # google_x -> config struct fqn
        for fqn, kind in self.types.items():
            if kind.get("kind") != "class":
                continue
            match = RESOURCE_OF_CLASS.search(kind.get("docs", {}).get("summary", ""))
            parameters = kind.get("initializer", {}).get("parameters", [])
            config = next((p["type"].get("fqn") for p in parameters if p["name"] == "config"), None)
            if match and config and "/docs/resources/" in kind["docs"]["summary"]:
                self.resources[match.group(2)] = config
        self._fields = {}

    def fields(self, fqn: str) -> dict:
        """Argument and block names of a struct, each with the struct of its block (or None)."""
        if fqn in self._fields:
            return self._fields[fqn]
        fields = {}
        for prop in self.types.get(fqn, {}).get("properties", []):
            anchor = DOC_ANCHOR.search(prop.get("docs", {}).get("remarks", ""))
            name = anchor.group(2) if anchor else re.sub(r"(?<!^)(?=[A-Z])", "_", prop["name"]).lower()
            fields[name] = self._struct_in(prop["type"])
        self._fields[fqn] = fields
        return fields

    def _struct_in(self, type_ref) -> str | None:
        if isinstance(type_ref, dict):
            fqn = type_ref.get("fqn")
            if fqn and self.types.get(fqn, {}).get("kind") == "interface" and self.types[fqn].get("datatype"):
                return fqn
            for value in type_ref.values():
                found = self._struct_in(value)
                if found:
                    return found
        if isinstance(type_ref, list):
            for value in type_ref:
                found = self._struct_in(value)
                if found:
                    return found
        return None

    def unknown_arguments(self, module: Module) -> list[str]:
        problems = []
        for resource_type, name, block in module.all_resources():
            config = self.resources.get(resource_type)
            if config is None:
                problems.append(f"{resource_type}.{name}: no such resource type in the google provider")
                continue
            problems += self._check(block, config, f"{resource_type}.{name}", top=True)
        return problems

    def _check(self, block: Block, fqn: str, where: str, top=False) -> list[str]:
        fields = self.fields(fqn)
        problems = []
        for argument in block.arguments:
            if top and argument in META_ARGUMENTS:
                continue
            if argument not in fields:
                problems.append(f"{where}: unknown argument {argument}")
        for name, children in block.blocks.items():
            if top and name in META_ARGUMENTS:
                continue
            if name == "dynamic":
                for dynamic in children:
                    for label, bodies in dynamic.blocks.items():
                        problems += self._check_nested(label, [c for b in bodies for c in b.block("content")], fields, where)
                continue
            problems += self._check_nested(name, children, fields, where)
        return problems

    def _check_nested(self, name, children, fields, where):
        if name not in fields:
            return [f"{where}: unknown block {name}"]
        if fields[name] is None:
            return [f"{where}: {name} is an argument, not a block"]
        problems = []
        for child in children:
            problems += self._check(child, fields[name], f"{where}.{name}")
        return problems
