"""`wyoming-pivoice bench` comes from the lab through the entry-point group
wyoming_pivoice.subcommands (the runtime names no lab module). With the lab installed (this
checkout's venv) it is there; without it (tests/test_wheel_install.py runs the runtime wheel
alone) it is one line saying what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wyoming_pivoice import __main__ as cli

BIN = Path(sys.executable).parent


def test_the_installed_lab_gives_the_bench_its_options() -> None:
    done = subprocess.run(
        [BIN / "wyoming-pivoice", "bench", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--rounds" in done.stdout and "--room" in done.stdout
    listing = subprocess.run(
        [BIN / "wyoming-pivoice", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "bench" in listing.stdout and "needs the lab" not in " ".join(listing.stdout.split())


def test_without_the_lab_bench_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_plugins", dict)  # as where no distribution registers one
    assert cli.run(["--log-level", "DEBUG", "bench", "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the lab" in err and "script/setup" in err
    with pytest.raises(SystemExit):  # the rest of the CLI is unchanged
        cli.build_parser().parse_args(["--help"])
    assert "needs the lab" in " ".join(capsys.readouterr().out.split())  # however it wraps
