"""The Dockerfile's dependency layer builds the workspace from manifests alone: it must copy every
workspace member's Cargo.toml and stub its sources, or `cargo build` stops at the first member it
cannot load (no Docker engine runs here, so this is checked by reading the file)."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
MEMBERS = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]


def test_every_workspace_member_s_manifest_is_copied_before_the_dependency_build():
    copied = set(re.findall(r"^COPY (\S+)/Cargo\.toml \1/$", DOCKERFILE, re.M))
    assert copied == set(MEMBERS), (set(MEMBERS) - copied, copied - set(MEMBERS))


def test_every_workspace_member_gets_stub_sources():
    loop = re.search(r"for crate in ([^;]+); do", DOCKERFILE)
    assert loop, "the stub loop"
    assert set(loop.group(1).split()) == set(MEMBERS)


def test_the_image_builds_the_services_and_the_cli_but_not_the_demo():
    builds = re.findall(r"cargo build --release --locked ((?:-p \S+ ?)+)", DOCKERFILE)
    assert builds and all(set(b.split()[1::2]) == {"drip-limiter", "drip-dispatcher", "drip-cli"} for b in builds), builds
    cli = tomllib.loads((ROOT / "cli/Cargo.toml").read_text())
    assert "pubsub-emulator-client" not in cli["dependencies"], "the shipped drip links no test crate"
