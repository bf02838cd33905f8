"""The Dockerfile's build stage, run here as plain commands (tools/docker/run_stage.py): these are
the quick parts, up to the point where cargo has loaded the workspace. `./run test` runs the whole
stage, builds included, after this suite. Each check is shown to fail on a broken copy
(tests/broken-dockerfile/: the Dockerfile as it was when its dependency layer did not load)."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
MEMBERS = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]
BROKEN = sorted((Path(__file__).parent / "broken-dockerfile").glob("*.Dockerfile"))
sys.path.insert(0, str(ROOT / "tools" / "docker"))
import run_stage  # noqa: E402


def dependency_layer(dockerfile: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Runs the builder stage's instructions up to its first RUN, with that RUN's cargo build
    swapped for a `cargo fetch` of this machine's target (which loads every manifest and target,
    offline, and compiles nothing), in a scratch root; returns how that went."""
    stage = next(s for s in run_stage.stages(dockerfile) if s.name == "builder")
    first_run = next(i for i, step in enumerate(stage.instructions) if step.keyword == "RUN")
    steps = stage.instructions[: first_run + 1]
    host = re.search(r"^host: (\S+)", subprocess.run(["rustc", "-vV"], capture_output=True, text=True).stdout, re.M).group(1)
    build = re.compile(r"cargo build [^&]*")
    steps[-1] = run_stage.Instruction(steps[-1].line, "RUN", build.sub(f"cargo fetch --locked --target {host} ", steps[-1].args))
    runner = run_stage.StageRunner(ROOT, tmp_path / "root", {})
    try:
        runner.run(run_stage.Stage("builder", stage.base, steps))
    except subprocess.CalledProcessError as error:
        return subprocess.CompletedProcess(error.cmd, error.returncode)
    return subprocess.CompletedProcess("dependency layer", 0)


def test_the_dependency_layer_loads_the_workspace(tmp_path):
    assert dependency_layer(DOCKERFILE, tmp_path).returncode == 0


@pytest.mark.parametrize("fixture", BROKEN, ids=[f.stem for f in BROKEN])
def test_a_dependency_layer_that_lacks_a_target_fails(fixture, tmp_path):
    assert dependency_layer(fixture.read_text(), tmp_path).returncode != 0


def test_every_workspace_member_s_manifest_is_copied_before_the_dependency_build():
    copied = set(re.findall(r"^COPY (\S+)/Cargo\.toml \1/$", DOCKERFILE, re.M))
    assert copied == set(MEMBERS), (set(MEMBERS) - copied, copied - set(MEMBERS))


def test_the_image_builds_the_services_and_the_cli_but_not_the_demo():
    builds = re.findall(r"cargo build --release --locked ((?:-p \S+ ?)+)", DOCKERFILE)
    assert builds and all(set(b.split()[1::2]) == {"drip-limiter", "drip-dispatcher", "drip-cli"} for b in builds), builds
    cli = tomllib.loads((ROOT / "cli/Cargo.toml").read_text())
    assert "pubsub-emulator-client" not in cli["dependencies"], "the shipped drip links no test crate"


def test_the_runner_honours_dockerignore_and_refuses_what_it_cannot_stand_in_for(tmp_path):
    context = tmp_path / "context"
    (context / "kept").mkdir(parents=True)
    (context / "kept" / "a.txt").write_text("a")
    (context / "kept" / "b.svg").write_text("b")
    (context / "target").mkdir()
    (context / "target" / "big").write_text("x")
    (context / ".dockerignore").write_text("target\n**/*.svg\n")
    runner = run_stage.StageRunner(context, tmp_path / "root", {})
    runner.run(run_stage.Stage("s", "debian", run_stage.instructions("WORKDIR /src\nCOPY . .\n")))
    copied = sorted(p.relative_to(tmp_path / "root").as_posix() for p in (tmp_path / "root").rglob("*") if p.is_file())
    assert copied == ["src/.dockerignore", "src/kept/a.txt"]
    with pytest.raises(run_stage.Unsupported):
        runner.run(run_stage.Stage("s", "debian", run_stage.instructions("ADD https://example.com/x /x\n")))
    with pytest.raises(FileNotFoundError):
        runner.run(run_stage.Stage("s", "debian", run_stage.instructions("COPY missing.toml ./\n")))
