"""Policy tests over the parsed Terraform module, each shown to fail on a deliberately broken copy
(tests/broken/*.json), and a check of every argument against the google provider's schema."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

import policies
from hcl import load_module, unquote
from provider_schema import ProviderSchema, load_assembly

TERRAFORM = pathlib.Path(__file__).resolve().parent.parent
BROKEN = sorted((TERRAFORM / "tests" / "broken").glob("*.json"))
EXAMPLE = TERRAFORM / "examples" / "basic"


@pytest.fixture(scope="session")
def schema() -> ProviderSchema:
    wheel = os.environ.get("DRIP_PROVIDER_WHEEL")
    if not wheel:
        pytest.fail("DRIP_PROVIDER_WHEEL must name the cdktn-provider-google wheel (terraform/tests/run downloads it)")
    return ProviderSchema(load_assembly(pathlib.Path(wheel)))


@pytest.fixture(scope="session")
def module():
    return load_module(TERRAFORM)


@pytest.mark.parametrize("policy", sorted(policies.POLICIES))
def test_the_module_complies(module, policy):
    assert policies.POLICIES[policy](module) == []


def broken_copy(fixture: pathlib.Path, tmp_path: pathlib.Path):
    spec = json.loads(fixture.read_text())
    for source in TERRAFORM.glob("*.tf"):
        shutil.copy(source, tmp_path / source.name)
    target = tmp_path / spec["file"]
    text = target.read_text()
    assert text.count(spec["replace"]) == 1, f"{fixture.name}: the text to break is not in {spec['file']} exactly once"
    target.write_text(text.replace(spec["replace"], spec["with"]))
    return spec["policy"], load_module(tmp_path)


@pytest.mark.parametrize("fixture", BROKEN, ids=[f.stem for f in BROKEN])
def test_each_check_fails_on_its_broken_copy(fixture, tmp_path, schema):
    policy, broken = broken_copy(fixture, tmp_path)
    problems = schema.unknown_arguments(broken) if policy == "provider_schema" else policies.POLICIES[policy](broken)
    assert problems, f"{policy} found nothing wrong with {fixture.name}"


def test_every_policy_has_a_broken_fixture():
    covered = {json.loads(f.read_text())["policy"] for f in BROKEN}
    assert set(policies.POLICIES) | {"provider_schema"} == covered


@pytest.mark.parametrize("directory", [TERRAFORM, EXAMPLE], ids=["module", "example"])
def test_every_argument_exists_in_the_google_provider(schema, directory):
    assert schema.resources, "no resource types were read from the provider package"
    assert schema.unknown_arguments(load_module(directory)) == []


def test_the_example_passes_exactly_the_module_s_variables(module):
    import hcl2

    with (EXAMPLE / "main.tf").open() as handle:
        document = hcl2.load(handle)
    arguments = {unquote(k) for call in document["module"] for body in call.values() for k in body if not k.startswith("__")}
    arguments.discard("source")
    required = {name for name, variable in module.variables.items() if "default" not in variable.arguments}
    assert arguments <= set(module.variables), f"unknown: {arguments - set(module.variables)}"
    assert required <= arguments, f"missing: {required - arguments}"
