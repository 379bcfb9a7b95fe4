"""Child processes the bench talks to: our server, and the peers, each on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import psutil

from ..ports import free_port, wait_for_port
from . import procstats

# The server logs "Loaded <slot name> in <seconds> s" when a model slot has loaded.
_LOADED = re.compile(r"Loaded (?P<name>.+?) in (?P<seconds>[0-9.]+) s")
_SLOTS = {"asr": "ASR", "tts": "TTS", "llm": "LLM"}


@dataclass
class Child:
    """A server process listening on host:port (our child, or one already running)."""

    name: str
    proc: subprocess.Popen | None
    port: int
    log: Path | None
    load_s: dict[str, float] = field(default_factory=dict)
    host: str = "127.0.0.1"
    pid: int | None = None

    def __post_init__(self) -> None:
        if self.pid is None and self.proc is not None:
            self.pid = self.proc.pid

    @property
    def uri(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def sample(self) -> procstats.ProcSample | None:
        """Its figures, if it runs on this machine and we may look at it."""
        if self.pid is None:
            return None
        try:
            return procstats.sample(self.pid)
        except (psutil.Error, OSError):
            return None

    def log_text(self) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        return self.log.read_text(errors="replace")


def attach(uri: str) -> Child:
    """A server that is already running; its pid is found when it listens on this machine."""
    parsed = urlparse(uri)
    if parsed.scheme != "tcp" or parsed.port is None:
        raise ValueError(f"--server takes tcp://HOST:PORT, not {uri!r}")
    host = parsed.hostname or "127.0.0.1"
    pid = None
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        with contextlib.suppress(psutil.Error, OSError):
            for conn in psutil.net_connections(kind="tcp"):
                if (
                    conn.status == psutil.CONN_LISTEN
                    and conn.laddr
                    and conn.laddr.port == parsed.port
                ):
                    pid = conn.pid
                    break
    return Child("pivoice server (running)", None, parsed.port, None, host=host, pid=pid)


@contextlib.contextmanager
def child(
    name: str,
    argv: list[str],
    port: int,
    log: Path,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
) -> Iterator[Child]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    running = Child(name, proc, port, log)
    try:
        wait_for_port(port, proc, timeout)
        yield running
    finally:
        stop(proc)


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Terminate a child, kill it if it has not gone after `grace` seconds, and reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def pivoice_server(
    log: Path, extra: list[str] | None = None, timeout: float = 300.0
) -> Iterator[Child]:
    """`wyoming-pivoice server` on loopback without zeroconf, returned once all models loaded."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "wyoming_pivoice",
        "--log-clock",
        "monotonic",  # serverlog lines its entries up with the turns' stamps
        "server",
        "--uri",
        f"tcp://127.0.0.1:{port}",
        "--no-zeroconf",
        *(extra or []),
    ]
    with child("pivoice server", argv, port, log, timeout) as server:
        deadline = time.monotonic() + timeout
        while True:
            server.load_s = load_times(server.log_text())
            if len(server.load_s) == len(_SLOTS):
                break
            if server.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not load its models; see {log}")
            time.sleep(0.1)
        yield server


def load_times(log_text: str) -> dict[str, float]:
    """Model load seconds by engine (asr, tts, llm), from the server's log."""
    found: dict[str, float] = {}
    for match in _LOADED.finditer(log_text):
        for key, prefix in _SLOTS.items():
            if match["name"].startswith(prefix):
                found[key] = float(match["seconds"])
    return found


async def warm(uri: str, timeout: float = 300.0) -> None:
    """One request per model (waiting while they load), so no timed turn pays a load."""
    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncClient
    from wyoming.handle import HandledStop
    from wyoming.tts import Synthesize

    silence = bytes(16000)  # 0.5 s
    requests = [
        (
            [
                Transcribe(language="en").event(),
                AudioStart(rate=16000, width=2, channels=1).event(),
                AudioChunk(rate=16000, width=2, channels=1, audio=silence).event(),
                AudioStop().event(),
            ],
            Transcript.is_type,
        ),
        ([Synthesize(text="Ready.").event()], AudioStop.is_type),
        ([Transcript(text="Hello.").event()], HandledStop.is_type),
    ]
    async with asyncio.timeout(timeout):
        for events, last in requests:
            async with AsyncClient.from_uri(uri) as client:
                for event in events:
                    await client.write_event(event)
                while (event := await client.read_event()) is not None:
                    if last(event.type) or event.type == "error":
                        break
