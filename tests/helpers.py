"""Shared test helpers: real speech made with espeak-ng + sox, a real server process, a client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wyoming.client import AsyncTcpClient
from wyoming.event import Event

from wyoming_pivoice.bench.servers import stop
from wyoming_pivoice.ports import free_port, wait_for_port

REPO = Path(__file__).resolve().parent.parent


def make_speech(
    text: str,
    path: Path,
    rate: int = 16000,
    channels: int = 1,
    pad_before: float = 0.3,
    pad_after: float = 1.0,
    voice: str = "en-us",
    speed: int = 150,
) -> Path:
    """Speak `text` with espeak-ng into a 16-bit WAV at `rate`, with silence around it."""
    raw = path.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text], check=True)
    subprocess.run(
        [
            "sox",
            str(raw),
            "-r",
            str(rate),
            "-c",
            str(channels),
            "-b",
            "16",
            str(path),
            "pad",
            str(pad_before),
            str(pad_after),
        ],
        check=True,
    )
    raw.unlink()
    return path


def read_wav(path: Path) -> tuple[bytes, int, int, int]:
    """(pcm, rate, width, channels)"""
    with wave.open(str(path), "rb") as wav:
        return (
            wav.readframes(wav.getnframes()),
            wav.getframerate(),
            wav.getsampwidth(),
            wav.getnchannels(),
        )


def spawn(port: int, *argv: str, out: Any = subprocess.DEVNULL) -> subprocess.Popen:
    """Start `python -m wyoming_pivoice *argv` and wait until it listens on `port`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wyoming_pivoice", *argv],
        stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        wait_for_port(port, proc=proc)
    except BaseException:
        proc.kill()
        raise
    return proc


def spawn_server(port: int, *extra: str, out: Any = subprocess.DEVNULL) -> subprocess.Popen:
    """Start a real `wyoming-pivoice server` on loopback (no zeroconf) and wait until it listens."""
    return spawn(
        port, "server", "--uri", f"tcp://127.0.0.1:{port}", "--no-zeroconf", *extra, out=out
    )


@contextlib.contextmanager
def server_process(*extra: str, port: int | None = None, log: Path | None = None) -> Iterator[int]:
    """A real server for the duration of the block; yields its port."""
    port = port or free_port()
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = spawn_server(port, *extra, out=out)
    try:
        yield port
    finally:
        stop(proc)
        if log:
            out.close()  # type: ignore[union-attr]


async def exchange(
    port: int, events: list[Event], until: str, timeout: float = 120.0
) -> list[Event]:
    """Send events on one connection; collect replies until an event of type `until` (inclusive)."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events:
            await client.write_event(event)
        replies: list[Event] = []
        async with asyncio.timeout(timeout):
            while True:
                event = await client.read_event()
                if event is None:
                    return replies
                replies.append(event)
                if event.type == until:
                    return replies
