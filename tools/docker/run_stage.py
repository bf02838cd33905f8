#!/usr/bin/env python3
"""Runs one stage of a Dockerfile on this machine, without a container runtime: each COPY as a copy
from the build context into a scratch root (honouring .dockerignore), each RUN as `sh -c` in the
stage's WORKDIR there, with the stage's ENV, offline. The base image is not pulled: a `rust:X.Y-…`
base is stood in for by this machine's toolchain of the same version (refused when it differs).
After the stage, every `COPY --from=<stage>` of the later stages must find its files.

    run_stage.py [--dockerfile Dockerfile] [--stage builder] [--root DIR]
                 [--cache /src/target=HOSTDIR] [--parse-only]

`--cache` stands in for a build cache: the container path is a link to HOSTDIR, so a build that
runs again reuses what the last one compiled (what Docker's layer cache does for an unchanged
dependency layer). Exit codes: 0 the stage ran and its outputs exist, 1 a step failed, 2 the
Dockerfile uses what this runner cannot stand in for, 3 the toolchain the base image names is not
installed here (skipped, saying so)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


class Unsupported(Exception):
    """The Dockerfile uses what cannot be stood in for here."""


@dataclass
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions with their line numbers: comments dropped, continuations joined."""
    out, pending, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, args = whole.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
    return out


def stages(text: str) -> list[Stage]:
    result: list[Stage] = []
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(result))
            result.append(Stage(name, words[0]))
        elif result:
            result[-1].instructions.append(instruction)
    return result


def flags_and_words(args: str) -> tuple[dict[str, str], list[str]]:
    flags, words = {}, []
    if args.startswith("["):
        return {}, json.loads(args)
    for word in shlex.split(args):
        if word.startswith("--") and not words:
            key, _, value = word[2:].partition("=")
            flags[key] = value
        else:
            words.append(word)
    return flags, words


def ignore_patterns(context: Path) -> list[tuple[bool, re.Pattern]]:
    """.dockerignore's patterns, in order, each (is an exception, regex)."""
    path = context / ".dockerignore"
    patterns = []
    if not path.exists():
        return patterns
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line.lstrip("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/?|\*|\?)", line):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        patterns.append((negate, re.compile(regex + "(/.*)?$")))
    return patterns


def ignored(relative: str, patterns: list[tuple[bool, re.Pattern]]) -> bool:
    verdict = False
    for negate, regex in patterns:
        if regex.match(relative):
            verdict = not negate
    return verdict


class StageRunner:
    def __init__(self, context: Path, root: Path, caches: dict[str, Path]):
        self.context = context
        self.root = root
        self.caches = caches
        self.workdir = PurePosixPath("/")
        self.env: dict[str, str] = {}
        self.patterns = ignore_patterns(context)

    def host(self, container_path: PurePosixPath | str) -> Path:
        path = PurePosixPath(self.workdir) / container_path
        return self.root / str(path).lstrip("/")

    def run(self, stage: Stage) -> None:
        for container_path, host_dir in self.caches.items():
            host_dir.mkdir(parents=True, exist_ok=True)
            link = self.root / container_path.lstrip("/")
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(host_dir.resolve(), target_is_directory=True)
        for instruction in stage.instructions:
            handler = getattr(self, f"do_{instruction.keyword.lower()}", None)
            if handler is None:
                raise Unsupported(f"line {instruction.line}: {instruction.keyword} is not stood in for here")
            print(f"--> line {instruction.line}: {instruction.keyword} {instruction.args[:120]}", flush=True)
            handler(instruction)

    def do_workdir(self, instruction: Instruction) -> None:
        self.workdir = PurePosixPath(self.workdir) / instruction.args
        self.host(".").mkdir(parents=True, exist_ok=True)

    def do_env(self, instruction: Instruction) -> None:
        words = shlex.split(instruction.args)
        if len(words) == 2 and "=" not in words[0]:
            self.env[words[0]] = words[1]
            return
        for word in words:
            key, _, value = word.partition("=")
            self.env[key] = value

    def do_arg(self, instruction: Instruction) -> None:
        key, _, value = instruction.args.partition("=")
        self.env.setdefault(key, value)

    def do_copy(self, instruction: Instruction) -> None:
        flags, words = flags_and_words(instruction.args)
        if "from" in flags:
            raise Unsupported(f"line {instruction.line}: COPY --from inside the stage that is run")
        *sources, dest = words
        into_dir = dest.endswith("/") or len(sources) > 1 or dest == "."
        target = self.host(dest)
        for source in sources:
            matches = sorted(self.context.glob(source)) if any(c in source for c in "*?[") else [self.context / source]
            if not matches or not all(m.exists() for m in matches):
                raise FileNotFoundError(f"line {instruction.line}: COPY {source}: no such file in the build context")
            for match in matches:
                relative = match.relative_to(self.context).as_posix()
                if relative != "." and ignored(relative, self.patterns):
                    raise FileNotFoundError(f"line {instruction.line}: COPY {source}: excluded by .dockerignore")
                if match.is_dir():
                    self.copy_tree(match, target)
                else:
                    destination = target / match.name if into_dir else target
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(match, destination)

    def copy_tree(self, source: Path, target: Path) -> None:
        """A directory's contents (not the directory itself), as COPY does, less what is ignored."""
        for dirpath, dirnames, filenames in os.walk(source):
            here = Path(dirpath)
            relative_dir = here.relative_to(self.context).as_posix()
            dirnames[:] = [d for d in dirnames if not ignored(f"{relative_dir}/{d}".lstrip("./"), self.patterns)]
            for name in filenames:
                relative = f"{relative_dir}/{name}".lstrip("./") if relative_dir != "." else name
                if ignored(relative, self.patterns):
                    continue
                destination = target / (here / name).relative_to(source)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(here / name, destination, follow_symlinks=False)

    def do_run(self, instruction: Instruction) -> None:
        flags, _ = flags_and_words(instruction.args) if instruction.args.startswith("--") else ({}, [])
        if flags:
            raise Unsupported(f"line {instruction.line}: RUN {' '.join('--' + f for f in flags)}")
        env = {**os.environ, **self.env, "CARGO_NET_OFFLINE": "true"}
        result = subprocess.run(["sh", "-c", instruction.args], cwd=self.host("."), env=env)
        if result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, f"line {instruction.line}: RUN")


def toolchain_for(base: str) -> str | None:
    """The Rust version a `rust:X.Y…` base image holds, or None for another base."""
    match = re.match(r"(?:docker\.io/)?(?:library/)?rust:(\d+\.\d+)", base)
    return match.group(1) if match else None


def installed_rustc() -> str:
    result = subprocess.run(["rustc", "--version"], capture_output=True, text=True)
    return result.stdout.split()[1] if result.returncode == 0 else ""


def copies_from(stages_list: list[Stage], name: str) -> list[tuple[int, str]]:
    """Every source path a later stage copies from the stage `name`."""
    sources = []
    for stage in stages_list:
        for instruction in stage.instructions:
            if instruction.keyword != "COPY":
                continue
            flags, words = flags_and_words(instruction.args)
            if flags.get("from") == name:
                sources += [(instruction.line, source) for source in words[:-1]]
    return sources


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dockerfile", default="Dockerfile", type=Path)
    parser.add_argument("--context", default=".", type=Path)
    parser.add_argument("--stage", default="builder")
    parser.add_argument("--root", type=Path, default=Path("target/dockerfile-stage/root"))
    parser.add_argument("--cache", action="append", default=[], help="CONTAINER_PATH=HOST_DIR")
    args = parser.parse_args(argv)

    all_stages = stages(args.dockerfile.read_text())
    stage = next((s for s in all_stages if s.name == args.stage), None)
    if stage is None:
        print(f"{args.dockerfile}: no stage named {args.stage}", file=sys.stderr)
        return 2
    wanted = toolchain_for(stage.base)
    if wanted:
        have = installed_rustc()
        if not have.startswith(wanted + "."):
            print(f"SKIPPED the Dockerfile's {args.stage} stage: its base {stage.base} holds Rust {wanted}, "
                  f"this machine has {have or 'no rustc'} (rustup toolchain install {wanted})", file=sys.stderr)
            return 3
    if args.root.exists():
        shutil.rmtree(args.root)  # removes a cache's link, never what it points to
    args.root.mkdir(parents=True)
    caches = {}
    for cache in args.cache:
        container_path, _, host_dir = cache.partition("=")
        caches[container_path] = Path(host_dir)
    runner = StageRunner(args.context.resolve(), args.root.resolve(), caches)
    try:
        runner.run(stage)
    except Unsupported as error:
        print(f"{args.dockerfile}: {error}", file=sys.stderr)
        return 2
    except (FileNotFoundError, subprocess.CalledProcessError) as error:
        print(f"{args.dockerfile}: the {args.stage} stage failed at {error}", file=sys.stderr)
        return 1
    missing = []
    for line, source in copies_from(all_stages, args.stage):
        path = args.root / source.lstrip("/")
        if not path.exists():
            missing.append(f"line {line}: COPY --from={args.stage} {source}")
    if missing:
        print(f"{args.dockerfile}: the {args.stage} stage does not make what later stages copy: {missing}", file=sys.stderr)
        return 1
    print(f"{args.dockerfile}: the {args.stage} stage ran; later stages find {len(copies_from(all_stages, args.stage))} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
