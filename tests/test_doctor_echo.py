"""`doctor` on echo cancellation: is it active, and is barge-in on without it."""

from __future__ import annotations

import re
import subprocess
import sys

from wyoming_pivoice.doctor.audio import EchoChoice, check_echo, probe_echo_canceller
from wyoming_pivoice.doctor.base import Status

from .helpers import REPO


def test_the_real_canceller_loads_here():
    assert probe_echo_canceller() is None


def test_barge_in_without_echo_cancellation_is_a_warning():
    finding = check_echo(EchoChoice(aec=False, barge_in=True), lambda: None)
    assert finding.status is Status.WARN and finding.fix
    assert check_echo(EchoChoice(aec=False, barge_in=False), lambda: None).status is Status.INFO


def test_a_canceller_that_cannot_load_is_reported():
    finding = check_echo(EchoChoice(), lambda: "OSError: no liblivekit_ffi.so")
    assert finding.status is Status.WARN
    assert "liblivekit_ffi" in finding.message and finding.fix
    quiet = check_echo(EchoChoice(barge_in=False), lambda: "OSError: x")
    assert quiet.status is Status.INFO


def test_doctor_cli_reports_it():
    def line(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "wyoming_pivoice", "doctor", "--no-audio", *args],
            capture_output=True, text=True, cwd=REPO, check=False,
        )  # fmt: skip
        match = re.search(r"^(\w+)\s+echo-cancellation\s+(.*)$", done.stdout, re.M)
        assert match, done.stdout
        return match.group(1)

    assert line() == "OK"
    assert line("--no-aec") == "WARN"
    assert line("--no-aec", "--no-barge-in") == "INFO"
