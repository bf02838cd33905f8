"""cloudbuild.yaml's substitutions, resolved offline as Cloud Build would: a manual build that passes
_TAG and a triggered one (SHORT_SHA filled) tag, push and plan the same non-empty tag; a manual
build without _TAG is stopped by the first step; the README's command passes _TAG."""

from __future__ import annotations

import pathlib
import re

from ruamel.yaml import YAML

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = YAML(typ="safe").load((ROOT / "cloudbuild.yaml").read_text())


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
        if resolved.startswith("-var=image_tag="):
            tags.add(resolved.removeprefix("-var=image_tag="))
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
    assert build["waitFor"] == ["check-tag"], "the image is not built without a tag"


def test_no_step_reads_short_sha_directly():
    for step in BUILD["steps"]:
        assert "SHORT_SHA" not in " ".join(map(str, step.get("args", []))), step["id"]
    assert all("SHORT_SHA" not in image for image in BUILD["images"])


def test_the_readme_command_passes_the_tag():
    readme = (ROOT / "README.md").read_text()
    command = readme[readme.index("gcloud builds submit --config cloudbuild.yaml"):].split("#", 1)[0]
    assert "_TAG=$(git rev-parse --short HEAD)" in command, command
