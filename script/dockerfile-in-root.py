"""Runs addon/Dockerfile's steps in Debian roots made with debootstrap, where no Docker daemon
runs: each stage a copy of the base root, each RUN in a chroot, COPY and COPY --from as files.
Used by script/check-addon-image; reports each stage's size.

Handles what our Dockerfile uses: ARG, FROM ... [AS name], SHELL, ENV, WORKDIR, COPY
[--from=stage], RUN, HEALTHCHECK, CMD.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    name: str
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    shell: list[str] = field(default_factory=lambda: ["/bin/sh", "-c"])
    workdir: str = "/"
    healthcheck: str = ""
    cmd: str = ""


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    lines = [ln for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), ""), text)


def mounted(root: Path, extra_binds: dict[str, Path]) -> list[Path]:
    points = []
    for target, source in [("proc", None), ("dev", Path("/dev")), *extra_binds.items()]:
        point = root / target.lstrip("/")
        point.mkdir(parents=True, exist_ok=True)
        if source is None:
            subprocess.run(["mount", "-t", "proc", "proc", str(point)], check=True)
        else:
            subprocess.run(["mount", "--bind", str(source), str(point)], check=True)
        points.append(point)
    return points


def unmount(points: list[Path]) -> None:
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], check=False)


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's image


def run_in(stage: Stage, command: str, binds: dict[str, Path], drop_env: set[str]) -> None:
    env = {"PATH": DEFAULT_PATH, "HOME": "/root"}
    env.update(stage.args)
    env.update(stage.env)
    for name in drop_env:
        env.pop(name, None)
    if Path("/etc/ssl/certs/ca-certificates.crt").exists():
        env["PIP_CERT"] = "/etc/ssl/certs/host-ca.crt"
    shutil.copy("/etc/resolv.conf", stage.root / "etc" / "resolv.conf")
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", stage.root / "etc/ssl/certs/host-ca.crt")
    points = mounted(stage.root, binds)
    try:
        argv = ["chroot", str(stage.root), "/usr/bin/env", "-i"]
        argv += [f"{k}={v}" for k, v in env.items()]
        argv += [*stage.shell, f"cd {shlex.quote(stage.workdir)} && {command}"]
        subprocess.run(["nice", "-n", "19", "ionice", "-c3", *argv], check=True)
    finally:
        unmount(points)


def copy_into(stage: Stage, sources: list[Path], dest: str) -> None:
    target = stage.root / dest.lstrip("/")
    if dest.endswith("/") or len(sources) > 1 or any(s.is_dir() for s in sources):
        target.mkdir(parents=True, exist_ok=True)
        for source in sources:
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target / source.name)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(sources[0], target)


def size_mib(path: Path) -> float:
    done = subprocess.run(
        ["du", "-sx", "--block-size=1M", "--exclude=./proc", "--exclude=./dev", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.split()[0])


def build(args: argparse.Namespace) -> dict:
    build_args = dict(a.split("=", 1) for a in args.build_arg)
    binds = {"/root/.cache/pip": args.pip_cache} if args.pip_cache else {}
    drop_env = {"PIP_NO_CACHE_DIR"} if args.pip_cache else set()
    globals_: dict[str, str] = {}
    stages: list[Stage] = []
    report: dict = {"base_mib": size_mib(args.base), "stages": [], "deviations": []}
    if args.pip_cache:
        report["deviations"].append(
            "PIP_NO_CACHE_DIR dropped and the host's pip cache mounted, so llama-cpp-python's "
            "wheel comes from the cache instead of a fresh compile"
        )
    for word, rest in instructions(args.dockerfile):
        stage = stages[-1] if stages else None
        started = time.monotonic()
        if word == "ARG":
            name, _, default = rest.partition("=")
            value = build_args.get(name, default.strip('"'))
            (stage.args if stage else globals_)[name] = value
        elif word == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            assert match, rest
            name = match.group(2) or f"stage{len(stages)}"
            root = args.work / name
            if root.exists():
                shutil.rmtree(root)
            print(f"== FROM {expand(match.group(1), globals_)} → a copy of {args.base}", flush=True)
            subprocess.run(["cp", "-a", f"{args.base}/.", str(root)], check=True)
            stages.append(Stage(name, root, args={k: v for k, v in globals_.items()}))
        elif stage is None:
            raise SystemExit(f"{word} before FROM")
        elif word == "SHELL":
            stage.shell = json.loads(rest)
        elif word == "ENV":
            values = {"PATH": DEFAULT_PATH, **stage.args, **stage.env}
            for item in shlex.split(expand(rest, values)):
                key, _, value = item.partition("=")
                stage.env[key] = value
        elif word == "WORKDIR":
            stage.workdir = expand(rest, {**stage.args, **stage.env})
            (stage.root / stage.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif word == "COPY":
            parts = rest.split()
            source_root = args.context
            if parts[0].startswith("--from="):
                source_root = next(s.root for s in stages if s.name == parts[0][7:])
                parts = parts[1:]
            *sources, dest = parts
            copy_into(stage, [source_root / s.lstrip("/") for s in sources], dest)
        elif word == "RUN":
            print(f"== RUN {rest[:100]}…", flush=True)
            run_in(stage, rest, binds, drop_env)
        elif word == "HEALTHCHECK":
            stage.healthcheck = rest.split(" CMD ", 1)[1]
        elif word == "CMD":
            stage.cmd = rest
        else:
            raise SystemExit(f"{word}: not handled")
        if word in ("RUN", "COPY"):
            print(f"   {word} took {time.monotonic() - started:.0f} s", flush=True)
    for stage in stages:
        report["stages"].append(
            {"name": stage.name, "root": str(stage.root), "mib": size_mib(stage.root)}
        )
    final = stages[-1]
    report["final"] = {
        "root": str(final.root),
        "env": final.env,
        "healthcheck": final.healthcheck,
        "cmd": final.cmd,
    }
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dockerfile", type=Path, required=True)
    parser.add_argument("--context", type=Path, required=True)
    parser.add_argument("--base", type=Path, required=True, help="the debootstrapped base root")
    parser.add_argument("--work", type=Path, required=True, help="where the stage roots go")
    parser.add_argument("--build-arg", action="append", default=[])
    parser.add_argument("--pip-cache", type=Path, help="mount this pip cache in the build")
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    report = build(args)
    args.report.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
