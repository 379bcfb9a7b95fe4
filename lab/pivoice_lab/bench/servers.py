"""Child processes the bench talks to: our server, and the peers, each on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import psutil

from wyoming_pivoice.compute_log import Compute, Load, read

from ..ports import free_port, wait_for_port
from . import procstats

MODELS = ("asr", "tts", "llm")  # what our server loads before the bench starts


@dataclass
class Child:
    """A server process listening on host:port (our child, or one already running)."""

    name: str
    proc: subprocess.Popen | None
    port: int
    log: Path | None
    compute_log: Path | None = None  # our server's (--compute-log)
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

    def compute(self) -> list[Load | Compute]:
        """What its compute log holds so far (nothing for a server we did not start)."""
        return read(self.compute_log) if self.compute_log is not None else []


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
    computed = log.with_suffix(".compute.jsonl")
    computed.unlink(missing_ok=True)  # a workdir reused: only this run's records
    argv = [
        sys.executable,
        "-m",
        "wyoming_pivoice",
        "server",
        "--uri",
        f"tcp://127.0.0.1:{port}",
        "--no-zeroconf",
        "--compute-log",
        str(computed),
        *(extra or []),
    ]
    with child("pivoice server", argv, port, log, timeout) as server:
        server.compute_log = computed
        proc = server.proc
        assert proc is not None  # a child we started
        deadline = time.monotonic() + timeout
        while True:
            server.load_s = load_times(server.compute())
            if len(server.load_s) == len(MODELS):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not load its models; see {log}")
            time.sleep(0.1)
        yield server


def load_times(records: list[Load | Compute]) -> dict[str, float]:
    """Model load seconds by kind (asr, tts, llm), from a compute log's records."""
    return {r.kind: r.seconds for r in records if isinstance(r, Load) and r.kind in MODELS}


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

    async def ask_each() -> None:
        for events, last in requests:
            async with AsyncClient.from_uri(uri) as client:
                for event in events:
                    await client.write_event(event)
                while (answer := await client.read_event()) is not None:
                    if last(answer.type) or answer.type == "error":
                        break

    await asyncio.wait_for(ask_each(), timeout)
