"""cloudbuild.yaml's substitutions, resolved offline as Cloud Build would: a manual build that passes
_TAG and a triggered one (SHORT_SHA filled) tag, push and plan the same non-empty tag; a manual
build without _TAG is stopped by the first step; the README's command passes _TAG. Its Terraform
steps' scripts run here against a stand-in `terraform` that records its calls: plan and apply only
against the remote state, an apply without one refused before anything is built. Each of those
checks is shown to fail on a broken copy (tests/broken-cloudbuild/*.json)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess

import pytest
from ruamel.yaml import YAML

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = (ROOT / "cloudbuild.yaml").read_text()
BUILD = YAML(typ="safe").load(SOURCE)
BROKEN = sorted((pathlib.Path(__file__).parent / "broken-cloudbuild").glob("*.json"))


def resolve(text: str, values: dict[str, str]) -> str:
    """Cloud Build's substitution of $NAME and ${NAME} ($$ is a literal $); unknown names are ''."""
    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return values.get(match.group(1) or match.group(2), "")
    return re.sub(r"\$\$|\$\{(\w+)\}|\$(\w+)", one, text)


def substitutions(given: dict[str, str]) -> dict[str, str]:
    values = {"PROJECT_ID": "my-project", **given}
    for name, default in BUILD["substitutions"].items():
        if name not in given:
            values[name] = resolve(str(default), values)
    return values


def image_tags(values: dict[str, str]) -> set[str]:
    """Every tag the build, the push, the images list and the plan use."""
    texts = [arg for step in BUILD["steps"] for arg in step.get("args", [])] + BUILD["images"]
    tags = set()
    for text in texts:
        resolved = resolve(str(text), values)
        tags.update(re.findall(r"docker\.pkg\.dev/\S+/drip:([^\s/\\]*)", resolved))
        tags.update(re.findall(r"-var=image_tag=(\S*)", resolved))
    return tags


def test_manual_and_triggered_builds_use_one_non_empty_tag():
    # The build also moves `latest`; nothing else, and never an empty tag.
    assert image_tags(substitutions({"_TAG": "abc1234"})) == {"abc1234", "latest"}
    assert image_tags(substitutions({"SHORT_SHA": "def5678"})) == {"def5678", "latest"}


def test_a_manual_build_without_a_tag_stops_first():
    first = BUILD["steps"][0]
    assert first["id"] == "check-tag"
    script = resolve(first["args"][1], substitutions({}))
    assert script.startswith('test -n ""'), script
    assert "_TAG=$(git rev-parse --short HEAD)" in script
    build = next(step for step in BUILD["steps"] if step["id"] == "build")
    assert "check-tag" in build["waitFor"], "the image is not built without a tag"


def test_no_step_reads_short_sha_directly():
    for step in BUILD["steps"]:
        assert "SHORT_SHA" not in " ".join(map(str, step.get("args", []))), step["id"]
    assert all("SHORT_SHA" not in image for image in BUILD["images"])


def test_the_readme_command_passes_the_tag():
    readme = (ROOT / "README.md").read_text()
    command = readme[readme.index("gcloud builds submit --config cloudbuild.yaml"):].split("#", 1)[0]
    assert "_TAG=$(git rev-parse --short HEAD)" in command, command
    assert "_TF_STATE_BUCKET=" in command, "the README's build has no state bucket: " + command


def run_step(build: dict, step_id: str, given: dict[str, str], tmp_path: pathlib.Path) -> tuple[int, list[str]]:
    """Runs a step's script as its image would (sh or bash -c), with `terraform` a stand-in that
    records each call; returns the exit code and the terraform calls."""
    step = next(s for s in build["steps"] if s["id"] == step_id)
    values = substitutions(given)
    args = [resolve(str(a), values) for a in step["args"]]
    calls = tmp_path / "terraform-calls"
    fake = tmp_path / "bin" / "terraform"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    if step.get("entrypoint") in ("sh", "bash") or step["name"].startswith("bash"):
        command = [step.get("entrypoint", "bash"), *args]
    else:
        command = ["terraform", *args]
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)
    return result.returncode, calls.read_text().splitlines() if calls.exists() else []


def state_problems(build: dict, tmp_path: pathlib.Path) -> list[str]:
    """What is wrong with how the build treats the Terraform state (empty when nothing is)."""
    problems = []
    tag, bucket = {"_TAG": "abc1234"}, {"_TF_STATE_BUCKET": "p-drip-tfstate"}
    if run_step(build, "check-state", {**tag, "_APPLY": "true"}, tmp_path)[0] == 0:
        problems.append("_APPLY=true without _TF_STATE_BUCKET is not refused")
    for given in ({**tag, **bucket, "_APPLY": "true"}, {**tag, "_APPLY": "false"}):
        if run_step(build, "check-state", given, tmp_path)[0] != 0:
            problems.append(f"check-state refuses a build it should let through: {given}")
    build_step = next(s for s in build["steps"] if s["id"] == "build")
    if "check-state" not in build_step.get("waitFor", []):
        problems.append("the image is built before the state check")
    (tmp_path / "terraform-calls").unlink(missing_ok=True)
    _, calls = run_step(build, "terraform-init", {**tag, **bucket}, tmp_path)
    if not any("init" in c and "-backend-config=bucket=p-drip-tfstate" in c for c in calls):
        problems.append(f"init does not use the bucket: {calls}")
    (tmp_path / "terraform-calls").unlink(missing_ok=True)
    _, calls = run_step(build, "terraform-init", tag, tmp_path)
    if not any("init" in c and "-backend=false" in c for c in calls):
        problems.append(f"without a bucket, init makes a local state: {calls}")
    (tmp_path / "terraform-calls").unlink(missing_ok=True)
    code, calls = run_step(build, "terraform-plan", tag, tmp_path)
    if code != 0 or any(c.startswith("plan") for c in calls):
        problems.append(f"without a bucket, a plan runs (or the step fails): {code} {calls}")
    (tmp_path / "terraform-calls").unlink(missing_ok=True)
    _, calls = run_step(build, "terraform-plan", {**tag, **bucket}, tmp_path)
    if not any(c.startswith("plan") and "-var=image_tag=abc1234" in c for c in calls):
        problems.append(f"with a bucket, no plan of the tag: {calls}")
    (tmp_path / "terraform-calls").unlink(missing_ok=True)
    code, calls = run_step(build, "terraform-apply", {**tag, "_APPLY": "true"}, tmp_path)
    if code == 0 or calls:
        problems.append(f"the apply step applies without a bucket: {code} {calls}")
    return problems


def test_plan_and_apply_only_against_the_remote_state(tmp_path):
    assert state_problems(BUILD, tmp_path) == []


@pytest.mark.parametrize("fixture", BROKEN, ids=[f.stem for f in BROKEN])
def test_each_state_check_fails_on_its_broken_copy(fixture, tmp_path):
    spec = json.loads(fixture.read_text())
    assert SOURCE.count(spec["replace"]) == 1, f"{fixture.name}: the text to break is not in cloudbuild.yaml exactly once"
    broken = YAML(typ="safe").load(SOURCE.replace(spec["replace"], spec["with"]))
    assert state_problems(broken, tmp_path), f"nothing found wrong: {spec['why']}"


def test_the_example_keeps_its_state_in_gcs():
    example = (ROOT / "terraform" / "examples" / "basic" / "main.tf").read_text()
    assert re.search(r'backend\s+"gcs"\s*\{', example), "the example has no gcs backend: each init would start empty"


BROKEN_TEST_STEP = sorted((pathlib.Path(__file__).parent / "broken-cloudbuild-test-step").glob("*.json"))
PACKAGES = [line.split()[0] for line in (ROOT / "tools" / "debian-packages.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def problems_of_the_test_step(build: dict) -> list[str]:
    """What keeps cloudbuild.yaml's test step from running `./run test` in Google's emulators image
    (Debian 12): packages from anywhere but the one list `./run deps` installs, a Rust toolchain
    without what `./run test` runs, or another Rust than the Dockerfile's (empty when nothing)."""
    problems = []
    script = resolve(next(s for s in build["steps"] if s["id"] == "test")["args"][1], substitutions({"_TAG": "t"}))
    lines = [line.strip() for line in script.splitlines()]
    if "apt-get install" in script:
        problems.append("the test step installs packages of its own instead of tools/debian-packages.txt")
    if "./run deps" not in lines or "./run test" not in lines or lines.index("./run deps") > lines.index("./run test"):
        problems.append("the test step does not run ./run deps before ./run test")
    rustup = next((line for line in lines if "sh.rustup.rs" in line), "")
    components = re.search(r"--component (\S+)", rustup)
    if "--profile minimal" in rustup and not (components and {"rustfmt", "clippy"} <= set(components.group(1).split(","))):
        problems.append("the toolchain lacks rustfmt or clippy, which ./run test runs")
    image_rust = re.search(r"^FROM rust:(\d+\.\d+)", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    tests_rust = re.search(r"--default-toolchain (\d+\.\d+)", rustup)
    if not tests_rust or tests_rust.group(1) != image_rust:
        problems.append(f"the tests run on Rust {tests_rust and tests_rust.group(1)}, the image is built with {image_rust}")
    return problems


def test_the_test_step_installs_what_run_test_needs_from_the_one_list():
    assert problems_of_the_test_step(BUILD) == []
    assert {"python3-venv", "redis-server", "build-essential", "curl"} <= set(PACKAGES), PACKAGES


@pytest.mark.parametrize("fixture", BROKEN_TEST_STEP, ids=[f.stem for f in BROKEN_TEST_STEP])
def test_each_test_step_check_fails_on_its_broken_copy(fixture):
    spec = json.loads(fixture.read_text())
    assert SOURCE.count(spec["replace"]) == 1, f"{fixture.name}: the text to break is not in cloudbuild.yaml exactly once"
    assert problems_of_the_test_step(YAML(typ="safe").load(SOURCE.replace(spec["replace"], spec["with"]))), spec["why"]


def test_every_probe_of_the_package_list_passes_here():
    """`./run test` ran `./run deps` before this suite: every package's probe now succeeds."""
    for line in (ROOT / "tools" / "debian-packages.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            package, probe = line.split(None, 1)
            assert subprocess.run(["sh", "-c", probe], capture_output=True).returncode == 0, package


@pytest.mark.skipif(not os.environ.get("DRIP_STAGE_ROOT"), reason="the Dockerfile's build stage did not run before this suite (./run test runs it)")
def test_the_rules_topics_step_runs_with_the_image_s_drip():
    """The rules-topics step's command, run with the `drip` the Dockerfile's build stage made, writes
    the rules-topics.json the example commits (so the file Terraform reads is what the image says)."""
    step = next(s for s in BUILD["steps"] if s["id"] == "rules-topics")
    script = resolve(step["args"][1], substitutions({"_TAG": "t"}))
    command = re.search(r"docker run .*?--entrypoint (\S+) .*?drip:t\s+(.*?)\s*>\s*(\S+)", script, re.S)
    assert command, script
    binary = pathlib.Path(os.environ["DRIP_STAGE_ROOT"]) / "src/target/release" / pathlib.Path(command.group(1)).name
    args = command.group(2).replace("\\\n", " ").replace("/workspace/", str(ROOT) + "/").split()
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, check=True).stdout
    committed = (ROOT / resolve("${_TF_DIR}", substitutions({"_TAG": "t"})) / pathlib.Path(command.group(3)).name).read_text()
    assert json.loads(out) == json.loads(committed)


def run_check_vars(tfvars: str, given: dict[str, str], tmp_path: pathlib.Path) -> int:
    example = tmp_path / substitutions(given)["_TF_DIR"]
    example.mkdir(parents=True, exist_ok=True)
    (example / "terraform.tfvars").write_text(tfvars)
    return run_step(BUILD, "check-vars", given, tmp_path)[0]


def test_the_build_refuses_another_project_or_region_than_the_variables_file(tmp_path):
    committed = (ROOT / "terraform" / "examples" / "basic" / "terraform.tfvars").read_text()
    tag = {"_TAG": "abc1234"}
    assert run_check_vars(committed, tag, tmp_path) == 0, "the file's own project and region pass"
    assert run_check_vars(committed, {**tag, "PROJECT_ID": "another-project"}, tmp_path) != 0
    assert run_check_vars(committed, {**tag, "_REGION": "us-central1"}, tmp_path) != 0
    build = next(s for s in BUILD["steps"] if s["id"] == "build")
    assert "check-vars" in build["waitFor"], "the image is not built for the wrong project"


def test_one_set_of_variables_whatever_applies():
    """Cloud Build's plan and every apply the docs show pass the image's tag and nothing else: the
    rest is terraform.tfvars, read by both, so neither undoes the other's operators or channels."""
    plan = resolve(next(s for s in BUILD["steps"] if s["id"] == "terraform-plan")["args"][1], substitutions({"_TAG": "t"}))
    assert re.findall(r"-var(?:-file)?[= ](\w+)", plan) == ["image_tag"], plan
    for doc in ["README.md", "docs/operations.md"]:
        text = (ROOT / doc).read_text()
        applies = re.findall(r"terraform (?:apply|plan)\b[^\n]*(?:\\\n[^\n]*)*", text)
        assert applies, doc
        for command in applies:
            assert set(re.findall(r"-var(?:-file)?[= ]'?(\w+)", command)) <= {"image_tag"}, f"{doc}: {command}"
