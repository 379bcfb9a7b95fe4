"""Shared test helpers, the one place for them (test modules import nothing from each other):
real speech made with espeak-ng + sox, real server and satellite processes, Wyoming clients
(polite, raw-frame and Home-Assistant-like), and the server process's sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe
from wyoming.tts import Synthesize

from wyoming_pivoice.bench.servers import stop
from wyoming_pivoice.ports import free_port, wait_for_port

REPO = Path(__file__).resolve().parent.parent
ADDON = REPO / "addon"
CONSTRAINTS = ADDON / "constraints.txt"  # the pins of the add-on image and CI


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


def words(text: str) -> set[str]:
    """The lower-case words of a transcript or reply, punctuation dropped."""
    return set("".join(c if c.isalnum() else " " for c in text.lower()).split())


def transcribe_events(
    pcm: bytes, rate: int, width: int = 2, channels: int = 1, chunk: int = 4096
) -> list[Event]:
    """A whole transcription request as Home Assistant sends it."""
    events = [
        Transcribe(language="en").event(),
        AudioStart(rate=rate, width=width, channels=channels).event(),
    ]
    events += [
        AudioChunk(rate=rate, width=width, channels=channels, audio=pcm[i : i + chunk]).event()
        for i in range(0, len(pcm), chunk)
    ]
    return [*events, AudioStop().event()]


async def describe_works(port: int) -> None:
    """The server still answers `describe` on a new connection."""
    async with asyncio.timeout(30):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await async_write_event(Describe().event(), writer)
            event = await async_read_event(reader)
            assert event is not None and event.type == "info", "server stopped answering"
        finally:
            writer.close()


# ---- raw frames and clients that misbehave ------------------------------------------------


def encode(
    event_type: Any,
    data: Any,
    payload: bytes | None,
    placement: str = "block",
    version: bool = True,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """A frame as the wyoming library writes it, with the data in the header or a block; any
    field may be of any type (the library's own writer insists on valid events)."""
    header: dict[str, Any] = {"type": event_type}
    if version:
        header["version"] = "1.10.2"
    header.update(extra or {})
    block = b""
    if placement == "header":
        header["data"] = data
    elif placement == "split" and isinstance(data, dict) and data:
        keys = list(data)
        header["data"] = {k: data[k] for k in keys[: len(keys) // 2]}
        block = json.dumps({k: data[k] for k in keys[len(keys) // 2 :]}).encode()
    elif data or data == []:
        block = json.dumps(data).encode()
    if block:
        header["data_length"] = len(block)
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header).encode() + b"\n" + block + (payload or b"")


def synthesize(text: object, **extra: object) -> bytes:
    """A `synthesize` frame; `text` may be anything."""
    return encode("synthesize", {"text": text, **extra}, None)


def turn(text: object, context: object = None) -> bytes:
    """A conversation turn (`transcript`) frame; `text` and `context` may be anything."""
    data: dict[str, object] = {"text": text}
    if context is not None:
        data["context"] = context
    return encode("transcript", data, None)


async def open_raw(port: int, rcvbuf: int | None = None):
    """A connection to the server, with a small receive buffer if asked."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def non_reader(port: int, describes: int = 4000, bound: float = 240.0):
    """Asks for eight sentences of speech, and once the voice has started on them, for
    thousands of `describe`s; then never reads again.

    The `info` replies (megabytes) fill the socket buffers while the voice is still on its
    first sentence, so the server's writes of the speech block: the voice must not stay
    taken while they do.
    """
    reader, writer = await open_raw(port, rcvbuf=4096)
    text = "This reply is never read by anybody. " * 8
    await async_write_event(Synthesize(text=text).event(), writer)
    async with asyncio.timeout(bound):
        while (await async_read_event(reader)).type != "audio-start":
            pass
    writer.write(encode("describe", {}, None) * describes)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await writer.drain()
    return reader, writer


# ---- a client that reads as Home Assistant does -------------------------------------------

RELEASE_S = 1.0  # HA-like clients must be let go within this
# What HA reads until, by request: the first of these event types, or EOF.
STT = {"transcript"}
TTS = {"audio-stop"}
STREAM = {"synthesize-stopped"}
TURN = {"handled", "not-handled"}

PCM_SECOND = b"\0\1" * 16000
AUDIO = {"rate": 16000, "width": 2, "channels": 1}


async def ha_reads(
    port: int, frames: list[bytes], until: set[str], bound: float = 10.0
) -> tuple[float, list[Event], str]:
    """Send the request as HA does; read as HA does (it ignores `error`: STT reads until
    `transcript`, TTS until `audio-stop` or `synthesize-stopped`, a conversation until
    `handled`/`not-handled`, or EOF). Returns (seconds from the last byte sent to release,
    replies, how it was released: an event type or "eof")."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for frame in frames:
            writer.write(frame)
        await writer.drain()
        sent = time.monotonic()
        replies: list[Event] = []
        async with asyncio.timeout(bound):
            while True:
                try:
                    event = await async_read_event(reader)
                except ConnectionError:
                    event = None
                if event is None:
                    return time.monotonic() - sent, replies, "eof"
                replies.append(event)
                if event.type in until:  # `error` is not among them: HA ignores it
                    return time.monotonic() - sent, replies, event.type
    finally:
        writer.close()


# ---- the server process: its sockets -------------------------------------------------------


def server_process_of(port: int) -> psutil.Process:
    """The `wyoming-pivoice server` child listening on `port`."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if f"tcp://127.0.0.1:{port}" in " ".join(child.cmdline()):
                return child
    raise LookupError(f"no server process for port {port}")


def open_connections(proc: psutil.Process, timeout: float = 30.0) -> list[str]:
    """The server's client connections once it has let go of every finished one (it may
    lag a little behind the client's close): polled until none is left or the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        held = [
            f"{c.raddr.port} {c.status}"
            for c in proc.net_connections("tcp")
            if c.status != "LISTEN"
        ]
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


# ---- the add-on image ----------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The add-on Dockerfile's stages: (INSTRUCTION, arguments), continuations joined,
    comments gone."""
    text = (ADDON / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result: list[list[tuple[str, str]]] = [[]]
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            if word.upper() == "FROM":
                result.append([])
            result[-1].append((word.upper(), " ".join(rest.split())))
    return result


def healthcheck_command() -> str:
    """The shell command of the add-on image's HEALTHCHECK."""
    _, _, final = dockerfile_stages()
    [health] = [a for w, a in final if w == "HEALTHCHECK"]
    assert "--start-period=" in health
    return health.split(" CMD ", 1)[1]
