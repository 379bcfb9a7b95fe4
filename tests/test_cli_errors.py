"""A newcomer's mistakes, tried as a newcomer makes them: the real CLI as a subprocess.

Each one must end with its exit status, one ERROR line (or argparse's one `error:` line)
that says what to do, and no traceback. The offline `--asr-model base.en` and the ready
lines load real models (slow); the rest stop before any model loads.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import REPO, alsa_home, free_port, pivoice_env

TIMEOUT = 120.0  # seconds any of these may take, models loaded included


def pivoice(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wyoming_pivoice", *argv],
        capture_output=True, text=True, cwd=REPO, env=pivoice_env(env), timeout=TIMEOUT,
    )  # fmt: skip


def one_error(result: subprocess.CompletedProcess[str], code: int, *says: str) -> str:
    """The one error line of a run that ended with `code`; it says every one of `says`."""
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    assert result.returncode == code, out
    errors = [line for line in out.splitlines() if " ERROR " in line or ": error: " in line]
    assert len(errors) == 1, out
    for text in says:
        assert text in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_in_use(busy_port: int) -> None:
    result = pivoice("server", "--no-zeroconf", "--uri", f"tcp://127.0.0.1:{busy_port}")
    one_error(result, 1, "in use", f"--uri tcp://0.0.0.0:{busy_port + 1}")


def test_uri_without_scheme() -> None:
    result = pivoice("server", "--uri", "0.0.0.0:10800")
    one_error(result, 2, "--uri", "tcp://0.0.0.0:10800")


def test_satellite_server_without_scheme() -> None:
    result = pivoice("satellite", "--server", "127.0.0.1:10800")
    one_error(result, 2, "--server", "tcp://127.0.0.1:10800")


def test_satellite_uri_without_port() -> None:
    result = pivoice("satellite", "--uri", "tcp://0.0.0.0")
    one_error(result, 2, "--uri", "a host and a port")


def test_wrong_llm_model_path(tmp_path: Path) -> None:
    result = pivoice("server", "--no-zeroconf", "--llm-model", str(tmp_path / "phi3.gguf"))
    one_error(result, 2, "--llm-model", "phi3.gguf", ".gguf", "'embedded'")


def test_wrong_llm_model_ignored_with_a_remote_engine_alone(tmp_path: Path) -> None:
    """With --llm-url and no local fallback the local model is never loaded: not checked."""
    result = pivoice(
        "server", "--uri", "tcp://0.0.0.0", "--llm-url", "http://127.0.0.1:1/v1",
        "--llm-model", str(tmp_path / "none.gguf"),
    )  # fmt: skip
    one_error(result, 2, "--uri")  # the one mistake left


def test_wrong_voice(tmp_path: Path) -> None:
    result = pivoice(
        "server", "--no-zeroconf", "--voice", "en_GB-nobody", "--voice-dir", str(tmp_path)
    )
    one_error(result, 2, "--voice", "en_GB-nobody", str(tmp_path))


def test_wrong_asr_model_path(tmp_path: Path) -> None:
    result = pivoice("server", "--no-zeroconf", "--asr-model", str(tmp_path / "whisper"))
    one_error(result, 2, "--asr-model", "does not exist")


def test_missing_mic_device_lists_the_devices(tmp_path: Path) -> None:
    env = alsa_home(tmp_path, "pcm.pivoicemic { type null }\n")
    result = pivoice("satellite", "--server", "tcp://127.0.0.1:1", "--mic-device", "usb", env=env)
    line = one_error(result, 2, "--mic-device 'usb'", "no such input device")
    assert "'pivoicemic'" in line


def test_missing_speaker_device_lists_the_devices(tmp_path: Path) -> None:
    env = alsa_home(tmp_path, "pcm.pivoicespk { type null }\n")
    result = pivoice("satellite", "--uri", "tcp://127.0.0.1:1", "--snd-device", "hdmi", env=env)
    line = one_error(result, 2, "--snd-device 'hdmi'", "no such output device")
    assert "'pivoicespk'" in line


def test_log_options_after_the_subcommand(tmp_path: Path) -> None:
    """--debug and --log-level are taken after the subcommand too (and checked)."""
    missing = str(tmp_path / "x.gguf")
    for flags in (["--debug"], ["--log-level", "debug"], ["--log-level", "WARNING"]):
        one_error(pivoice("server", *flags, "--llm-model", missing), 2, "--llm-model")
    one_error(pivoice("--debug", "doctor", "--log-level", "LOUD"), 2, "--log-level", "DEBUG")
    result = pivoice("doctor", "--debug", "--no-audio", "--json")
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_asr_model_by_name_offline(tmp_path: Path) -> None:
    """`base.en` needs a download: offline the start stops with one line, exit 1 (it used to
    serve on and answer every transcription with an empty transcript and a traceback)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = pivoice(
        "server", "--no-zeroconf", "--uri", f"tcp://127.0.0.1:{free_port()}",
        "--asr-model", "base.en", "--llm-lazy", env=env,
    )  # fmt: skip
    one_error(result, 1, "ASR", "'base.en'", "failed to load", "internet", "'embedded'")
    assert "Ready" not in result.stderr


def wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = TIMEOUT) -> str:
    """The first line of `proc`'s output that holds `text` (its output so far if none)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"no {text!r} in:\n{''.join(seen)}")


def spawn(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "wyoming_pivoice", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env=pivoice_env(env),
    )  # fmt: skip


@pytest.mark.slow
def test_server_says_ready_and_how_to_add_it() -> None:
    port = free_port()
    proc = spawn("server", "--no-zeroconf", "--uri", f"tcp://0.0.0.0:{port}", "--llm-lazy")
    try:
        line = wait_for_line(proc, "Ready")
        assert "ASR tiny.en" in line and "voice en_US-joe-medium" in line, line
        assert "LLM on the first turn" in line, line
        assert "Wyoming Protocol" in line and f"port {port}" in line, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_ha_satellite_says_ready_and_how_to_add_it(tmp_path: Path) -> None:
    port = free_port()
    proc = spawn(
        "satellite", "--uri", f"tcp://0.0.0.0:{port}", "--no-zeroconf",
        "--mic-command", "exec sleep 60", "--snd-device", "null",
    )  # fmt: skip
    try:
        line = wait_for_line(proc, "Ready")
        assert "Wyoming Protocol" in line and f"port {port}" in line, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
