"""`./run verify-gcp --dry-run`: every command it would run against the project, run here with
nothing touched. What it does on a real project cannot run here; this checks what it would do:
each command aims at the project and region given, the image it builds is the one it applies,
the deployment is destroyed after the checks (the queues, which Terraform may not destroy, by
gcloud), and every row of the docs' "verified on GCP" table names one of its checks."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry_run() -> str:
    result = subprocess.run(
        [str(ROOT / "run"), "verify-gcp", "--dry-run", "--project", "sandbox-proj-7", "--region", "us-east4"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def commands(output: str) -> list[str]:
    return [line[2:] for line in output.splitlines() if line.startswith("+ ")]


def test_it_says_what_it_costs_and_asks_first():
    result = subprocess.run([str(ROOT / "run"), "verify-gcp", "--project", "sandbox-proj-7"],
                            input="n\n", capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode != 0 and "total" in result.stdout and "nothing done" in result.stderr, result
    assert not commands(result.stdout), "nothing runs before the answer"


def test_every_cloud_command_aims_at_the_project_and_region_given(dry_run):
    for command in commands(dry_run):
        if command.startswith(("gcloud", "curl -sf")) and "auth print" not in command and "config get-value" not in command:
            assert "sandbox-proj-7" in command or "--project" not in command, command
            assert "europe-west1" not in command, command
    assert any("--region us-east4" in c for c in commands(dry_run))


def test_it_applies_the_image_it_built_then_checks_then_destroys(dry_run):
    lines = commands(dry_run)
    build = next(i for i, c in enumerate(lines) if c.startswith("gcloud builds submit"))
    tag = re.search(r"drip:(\S+)", lines[build]).group(1)
    apply = next(i for i, c in enumerate(lines) if " apply " in c and c.startswith("terraform"))
    assert f"image_tag={tag}" in lines[apply]
    destroy = next(i for i, c in enumerate(lines) if " destroy " in c)
    report = dry_run.index("verify-gcp report")
    checks = [line for line in dry_run[report:].splitlines() if line.startswith("DRY ")]
    assert len(checks) >= 8, checks
    assert build < apply < destroy
    assert any(c.startswith("gcloud tasks queues delete") for c in lines[destroy:]), "the queues go too"
    assert any("state rm" in c for c in lines[apply:destroy + 1])
    assert any(c.startswith("gcloud artifacts docker images delete") and tag in c for c in lines[destroy:])


def test_every_verified_on_gcp_row_names_a_check(dry_run):
    checks = set(re.findall(r"^DRY\s+(\S+)", dry_run, re.M))
    operations = (ROOT / "docs" / "operations.md").read_text()
    table = operations[operations.index("| what | verified on GCP |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert rows
    for row in rows:
        named = set(re.findall(r"`verify-gcp: ([a-z0-9-]+)`", row))
        assert named & checks or "not checked by verify-gcp" in row, row
