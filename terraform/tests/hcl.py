"""Terraform files as data, through python-hcl2: every resource with its arguments and blocks."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

import hcl2


def unquote(text):
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text


@dataclass
class Block:
    """A resource or a nested block: its arguments and its blocks (each a list, in file order)."""

    arguments: dict = field(default_factory=dict)
    blocks: dict = field(default_factory=dict)

    def block(self, name):
        return self.blocks.get(name, [])

    def has_block(self, *path):
        blocks = [self]
        for name in path:
            blocks = [child for block in blocks for child in block.block(name)]
        return bool(blocks)

    def arg(self, name, default=None):
        return unquote(self.arguments.get(name, default))


def to_block(raw: dict) -> Block:
    block = Block()
    for key, value in raw.items():
        key = unquote(key)
        if key.startswith("__"):
            continue
        if key == "dynamic" and isinstance(value, list):
            # dynamic "label" { for_each = ..., content { ... } }: kept as a block per label.
            for labelled in value:
                dynamic = Block()
                for label, body in labelled.items():
                    if not label.startswith("__"):
                        dynamic.blocks.setdefault(unquote(label), []).append(to_block(body))
                block.blocks.setdefault("dynamic", []).append(dynamic)
        elif isinstance(value, list) and value and all(isinstance(v, dict) and v.get("__is_block__") for v in value):
            block.blocks.setdefault(key, []).extend(to_block(v) for v in value)
        else:
            block.arguments[key] = value
    return block


@dataclass
class Module:
    directory: pathlib.Path
    resources: dict  # type -> {name: Block}
    locals: dict
    variables: dict

    def resolve(self, value):
        """`${local.a.b}` → the value of that local (followed through maps), else `value`."""
        import re

        match = re.fullmatch(r"\$\{local\.([\w.]+)\}", str(value))
        if not match:
            return value
        current = self.locals
        for part in match.group(1).split("."):
            if not isinstance(current, dict):
                return value
            current = {unquote(k): v for k, v in current.items()}.get(part)
        return self.resolve(current) if current is not None else value

    def of_type(self, resource_type):
        return self.resources.get(resource_type, {})

    def all_resources(self):
        for resource_type, named in self.resources.items():
            for name, block in named.items():
                yield resource_type, name, block


def load_module(directory) -> Module:
    directory = pathlib.Path(directory)
    resources, local_values, variables = {}, {}, {}
    for path in sorted(directory.glob("*.tf")):
        with path.open() as handle:
            document = hcl2.load(handle)
        for entry in document.get("resource", []):
            for resource_type, named in entry.items():
                for name, body in named.items():
                    resources.setdefault(unquote(resource_type), {})[unquote(name)] = to_block(body)
        for entry in document.get("locals", []):
            local_values.update({unquote(k): v for k, v in entry.items() if not k.startswith("__")})
        for entry in document.get("variable", []):
            for name, body in entry.items():
                variables[unquote(name)] = to_block(body)
    return Module(directory, resources, local_values, variables)
