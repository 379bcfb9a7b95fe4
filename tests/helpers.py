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
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.pipeline import RunPipeline
from wyoming.server import AsyncTcpServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop
from wyoming.vad import VoiceStarted, VoiceStopped

from pivoice_lab.bench.servers import stop
from pivoice_lab.ports import free_port, wait_for_port

if TYPE_CHECKING:
    from wyoming_pivoice.server.services import Services

REPO = Path(__file__).resolve().parent.parent
ADDON = REPO / "addon"
CONSTRAINTS = ADDON / "constraints.txt"  # the pins of the add-on image and CI
POLL = 0.02  # seconds between two looks at a state that has no event to wait on


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Wait until `condition()` holds (a file, a log line, a socket's state), failing with
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(POLL)


async def until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """`wait_until` for a test on the event loop: the loop runs while it waits."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        await asyncio.sleep(POLL)


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
            "-R",  # repeatable dither: a test's speech is the same sample for sample every run
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


def pivoice_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a `wyoming-pivoice` child: `env` (or ours), output unbuffered so
    that its log lines arrive as they happen."""
    return {**(env or os.environ), "PYTHONUNBUFFERED": "1"}


def spawn(
    port: int, *argv: str, out: Any = subprocess.DEVNULL, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start `python -m wyoming_pivoice *argv` and wait until it listens on `port`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wyoming_pivoice", *argv],
        stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=pivoice_env(env),
    )  # fmt: skip
    return listening(proc, port)


def listening(proc: subprocess.Popen, port: int) -> subprocess.Popen:
    """`proc` once it listens on `port` (killed if it exits or never does)."""
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


@contextlib.asynccontextmanager
async def in_process_server(services: Services) -> AsyncIterator[int]:
    """The server's Wyoming handler on `services` in this process (where a test may swap in
    stand-in engines or wrap the real ones), on a loopback port; yields the port."""
    # Imported here: the processes that import this module for the rest need no server code.
    from wyoming_pivoice.server.handler import PivoiceEventHandler

    port = free_port()
    server = AsyncTcpServer("127.0.0.1", port)
    await server.start(partial(PivoiceEventHandler, services))
    try:
        yield port
    finally:
        await server.stop()


def turn_event(text: str, conversation_id: str | None = None, turn_id: str | None = None) -> Event:
    """A conversation turn (`transcript` to the server), with its context if given."""
    context = {k: v for k, v in (("conversation_id", conversation_id), ("turn_id", turn_id)) if v}
    return Event("transcript", {"text": text, **({"context": context} if context else {})})


async def read_until(client: AsyncTcpClient, *ends: str, timeout: float = 120) -> list[Event]:
    """Replies on `client` up to the first of the event types `ends` (inclusive)."""
    replies: list[Event] = []
    async with asyncio.timeout(timeout):
        while True:
            event = await client.read_event()
            assert event is not None, f"connection closed after {[e.type for e in replies]}"
            replies.append(event)
            if event.type in ends:
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


def wait_until_dropped(proc: psutil.Process, client_port: int, timeout: float) -> None:
    """Wait until the server `proc` has let go of (closed or aborted) our connection from
    `client_port`."""

    def dropped() -> bool:
        return not any(
            c.raddr and c.raddr.port == client_port and c.status == psutil.CONN_ESTABLISHED
            for c in proc.net_connections("tcp")
        )

    wait_until(dropped, f"drop of the connection from port {client_port}", timeout)


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


def healthcheck_command(port: int = 10800) -> str:
    """The add-on image's HEALTHCHECK (addon/healthcheck.sh) as a shell command on `port`."""
    _, _, final = dockerfile_stages()
    [health] = [a for w, a in final if w == "HEALTHCHECK"]
    assert "--start-period=" in health
    assert health.split(" CMD ", 1)[1] == '[ "/healthcheck.sh" ]'
    return f"{ADDON / 'healthcheck.sh'} {port}"


# ---- speech and audio for the satellite ---------------------------------------------------


def silence(seconds: float) -> bytes:
    """16 kHz mono s16le silence."""
    return bytes(int(seconds * 16000) * 2)


def spoken(text: str, path: Path, speed: int = 150) -> bytes:
    """espeak-ng speech at 16 kHz with its own leading and trailing silence trimmed."""
    raw = path.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(speed), "-w", str(raw), text], check=True)
    trim = ["silence", "1", "0.02", "0.5%"]
    subprocess.run(
        ["sox", "-R", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(path),
         *trim, "reverse", *trim, "reverse"],
        check=True,
    )  # fmt: skip
    raw.unlink()
    return read_wav(path)[0]


def write_wav(path: Path, pcm: bytes, rate: int = 16000, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setframerate(rate)
        wav.setsampwidth(2)
        wav.setnchannels(channels)
        wav.writeframes(pcm)
    return path


def check_reply_audio(pcm: bytes, rate: int, reply: str) -> None:
    """`pcm` is speech of about the length `reply` takes to say."""
    seconds = len(pcm) / 2 / rate
    # Piper speaks roughly 8–25 characters of prose a second. SmolLM2 sometimes answers with a
    # code block, which Piper reads at no predictable pace (330 characters of it took 7.2 s),
    # so the lower bound counts the prose outside ``` fences only.
    prose = re.sub(r"```.*?(?:```|$)", " ", reply, flags=re.DOTALL)
    assert len(prose) / 30 < seconds < len(reply) / 5 + 1.0, (seconds, reply)
    assert np.abs(np.frombuffer(pcm, dtype="<i2")).max() > 1000  # audio, not silence


def voiced_span(pcm: bytes, rate: int = 16000) -> tuple[int, int]:
    """Byte offsets of the first and last sample louder than 2 % of full scale."""
    samples = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.int32))
    loud = np.flatnonzero(samples > 0.02 * 32768)
    return int(loud[0]) * 2, int(loud[-1]) * 2 + 2


def assert_covers_speech(streamed: bytes, mic_pcm: bytes) -> None:
    """The streamed audio is a piece of the mic's audio that holds all of the speech."""
    offset = mic_pcm.find(streamed)
    assert offset >= 0 and offset % 2 == 0, "streamed audio is not a slice of the microphone's"
    first, last = voiced_span(mic_pcm)
    assert offset <= first, (
        f"speech starts at {first / 32000:.2f} s, streaming at {offset / 32000:.2f} s"
    )
    end = offset + len(streamed)
    assert end >= last, f"speech ends at {last / 32000:.2f} s, streaming at {end / 32000:.2f} s"
    # Not much more than the speech: pre-speech (300 ms) + silence window (300 ms) + a frame.
    assert len(streamed) - (last - first) <= int(0.7 * 32000) + 1024


def mic_on_cue(folder: Path, speech: bytes) -> str:
    """A --mic-command (a shell loop, as in the README) that reads silence, 3 VAD frames at a
    time, and says `speech` once each time the file folder/go appears (see `cue`)."""
    (folder / "speech.raw").write_bytes(speech)
    (folder / "gap.raw").write_bytes(silence(0.096))
    go = folder / "go"
    return (
        f"while :; do if [ -e {go} ]; then rm -f {go}; cat {folder}/speech.raw; "
        f"else cat {folder}/gap.raw; fi; done"
    )


def cue(folder: Path) -> None:
    """The `mic_on_cue` microphone in `folder` says its speech once."""
    (folder / "go").touch()


def assert_all_gone(processes: list[psutil.Process]) -> None:
    """None of `processes` (a satellite's children, say) is still running.

    A killed child may still be on its way out when its parent has gone (CI saw a `cat` not
    yet a zombie, a zombie a moment later): each gets up to 5 s to end (a bounded wait on the
    process, not a sleep); a zombie counts as gone (only its parent's reaping is left)."""
    _, waiting = psutil.wait_procs([p for p in processes if _running(p)], timeout=5)
    alive = []
    for proc in waiting:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.cmdline())
    assert not alive, f"left running: {alive}"


def _running(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


# ---- ALSA stand-in devices (no sound card: ALSA's `file` plugin over its `null` device) ----

# A capture device reading `infile` and a playback device writing `outfile`.
ALSA_FILE_DEVICES = """
pcm.pivoicemic {{
    type file
    slave.pcm null
    file "/dev/null"
    infile "{infile}"
    format "raw"
}}
pcm.pivoicespk {{
    type file
    slave.pcm null
    file "{outfile}"
    format "raw"
}}
"""

# A capture device that fails like a pulled USB mic: its data also goes to a pipe command
# (whose pid goes to `pidfile`), and while that command is gone (killed, and `present` is
# absent) every read fails with an I/O error.
ALSA_VANISHING_MIC = """
pcm.pivoicemic {{
    type file
    slave.pcm null
    file "|exec sh -c 'echo $$ > {pidfile}; test -e {present} && exec cat > /dev/null'"
    infile "{infile}"
    format "raw"
}}
"""


def alsa_home(tmp_path: Path, asoundrc: str) -> dict[str, str]:
    """An environment whose ALSA config (~/.asoundrc) is `asoundrc`."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".asoundrc").write_text(asoundrc)
    return {**os.environ, "HOME": str(home)}


# ---- the satellite process -----------------------------------------------------------------


def satellite_argv(*args: str) -> list[str]:
    """`python -m wyoming_pivoice satellite *args` logging at DEBUG."""
    return [sys.executable, "-m", "wyoming_pivoice", "--log-level", "DEBUG", "satellite", *args]


def spawn_satellite(
    *args: str,
    stdout: Any = subprocess.DEVNULL,
    stderr: Any = subprocess.STDOUT,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> subprocess.Popen:
    """Start a satellite (text output); with `port` (Home Assistant mode, `--uri` on it),
    wait until it listens."""
    proc = subprocess.Popen(
        satellite_argv(*args),
        stdout=stdout, stderr=stderr, text=True, cwd=REPO, env=pivoice_env(env),
    )  # fmt: skip
    return proc if port is None else listening(proc, port)


def run_satellite(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run a standalone satellite to its end; its output captured."""
    return subprocess.run(
        satellite_argv(*args),
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env=pivoice_env(env),
    )  # fmt: skip


HA_TIMEOUT = 60.0  # seconds the Home Assistant stand-in waits for anything


@dataclass
class Satellite:
    """A satellite in Home Assistant mode, listening on `port`, logging to `log`."""

    port: int
    proc: subprocess.Popen
    log: Path

    def wait(self, timeout: float = HA_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"satellite still running after {timeout} s\n{self.log.read_text()}")

    def log_text(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def ha_mode_satellite(tmp_path: Path, *extra: str) -> Iterator[Satellite]:
    """A satellite for Home Assistant (no zeroconf) for the duration of the block."""
    port = free_port()
    log = tmp_path / f"satellite-{port}.log"
    with open(log, "w") as out:
        proc = spawn_satellite(
            "--uri", f"tcp://127.0.0.1:{port}", "--no-zeroconf", *extra, stdout=out, port=port
        )
        try:
            yield Satellite(port, proc, log)
        finally:
            stop(proc)


# ---- Home Assistant's side of a satellite --------------------------------------------------

HA_CHUNK_BYTES = 2048  # HA's _AUDIO_CHUNK_BYTES: 1024 samples


@dataclass
class Stream:
    """One run the satellite streamed: run-pipeline, audio-start, chunks, audio-stop."""

    run: RunPipeline
    start: AudioStart
    pcm: bytes
    others: list[Event] = field(default_factory=list)  # pongs etc. in between

    @property
    def seconds(self) -> float:
        return len(self.pcm) / (self.start.rate * self.start.width * self.start.channels)


HA_PING_TIMEOUT = 5.0  # assist_satellite.py's _PING_TIMEOUT: no event for this long drops it
HA_PING_SEND_DELAY = 2.0  # _PING_SEND_DELAY: its next ping goes this long after a pong


class FakeHomeAssistant:
    """What homeassistant/components/wyoming/assist_satellite.py does on a satellite's
    connection: run-satellite, pings, the pipeline events HA forwards, the reply's audio.

    The satellite's own pings are answered with a pong, as HA's loop does, and not handed
    to the test. With `ping_timeout` (HA's 5 s) the stand-in also keeps HA's deadline: while
    the test reads, no event from the satellite for that long drops the connection, as HA's
    `asyncio.timeout(_PING_TIMEOUT)` around each wait does; and `keep_pinging` then sends
    each ping 2 s after the last pong, as HA does, instead of every 2 s."""

    def __init__(self, port: int, ping_timeout: float | None = None) -> None:
        self.client = AsyncTcpClient("127.0.0.1", port)
        self._pinger: asyncio.Task[None] | None = None
        self.ping_timeout = ping_timeout
        self.last_event_at: float | None = None
        self.max_gap = 0.0  # longest wait for an event from the satellite while reading
        self.satellite_pings = 0
        self.pong_waits: list[float] = []  # seconds from each of our pings to its pong
        self.ping_sent: float | None = None
        self._pong = asyncio.Event()

    async def __aenter__(self) -> FakeHomeAssistant:
        await self.client.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
        with contextlib.suppress(ConnectionError):
            await self.client.disconnect()

    def keep_pinging(self) -> None:
        """HA's keepalive: a ping every 2 s (with `ping_timeout`: 2 s after each pong)."""

        async def pinger() -> None:
            with contextlib.suppress(ConnectionError, AssertionError, RuntimeError):
                while True:
                    await asyncio.sleep(HA_PING_SEND_DELAY)  # HA's pace, not synchronisation
                    self._pong.clear()
                    self.ping_sent = time.monotonic()
                    await self.send(Ping().event())
                    if self.ping_timeout is not None:
                        await self._pong.wait()

        self._pinger = asyncio.create_task(pinger())

    async def send(self, *events: Event) -> None:
        for event in events:
            await self.client.write_event(event)

    async def read(self, timeout: float = HA_TIMEOUT) -> Event | None:
        while True:
            event = await self._read_one(timeout)
            if event is None or event.type != "ping":
                return event
            self.satellite_pings += 1  # HA answers it and reads on
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.send(Event("pong", event.data))

    async def _read_one(self, timeout: float) -> Event | None:
        waited = time.monotonic()
        if self.ping_timeout is not None:
            try:
                event = await asyncio.wait_for(self.client.read_event(), self.ping_timeout)
            except asyncio.TimeoutError:
                await self.client.disconnect()
                raise AssertionError(
                    f"Home Assistant drops the satellite: no event for {self.ping_timeout} s"
                ) from None
        else:
            event = await asyncio.wait_for(self.client.read_event(), timeout)
        now = time.monotonic()
        self.max_gap = max(self.max_gap, now - max(waited, self.last_event_at or waited))
        self.last_event_at = now
        if event is not None and event.type == "pong" and self.ping_sent is not None:
            self.pong_waits.append(now - self.ping_sent)
            self.ping_sent = None
            self._pong.set()
        return event

    async def read_until(self, kind: str, timeout: float = HA_TIMEOUT) -> tuple[Event, list[Event]]:
        before: list[Event] = []
        deadline = time.monotonic() + timeout  # in all: the satellite's pings never extend it
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind} within {timeout:.0f} s: {[e.type for e in before]}"
            event = await self.read(left)
            assert event is not None, f"connection closed while waiting for {kind}: {before}"
            if event.type == kind:
                return event, before
            before.append(event)

    async def describe(self) -> Info:
        await self.send(Describe().event())
        event, _ = await self.read_until("info")
        return Info.from_event(event)

    async def receive_stream(self, run: Event | None = None) -> Stream:
        """Everything of one run up to the satellite's audio-stop (from its `run-pipeline`,
        or after it if that was read already)."""
        others: list[Event] = []
        if run is None:
            run, others = await self.read_until("run-pipeline")
        pipeline = RunPipeline.from_event(run)
        event, more = await self.read_until("audio-start")
        others += more
        start = AudioStart.from_event(event)
        pcm = bytearray()
        while True:
            event = await self.read()
            assert event is not None, "satellite closed the connection mid-stream"
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                assert (chunk.rate, chunk.width, chunk.channels) == (16000, 2, 1)
                pcm += chunk.audio
            elif AudioStop.is_type(event.type):
                return Stream(pipeline, start, bytes(pcm), others)
            else:
                others.append(event)

    async def pipeline_events(self, transcript: str) -> None:
        """What HA forwards from its pipeline between STT start and TTS (research table 3a)."""
        await self.send(
            Transcribe(language="en").event(),
            VoiceStarted(timestamp=300).event(),
            VoiceStopped(timestamp=2000).event(),
            Transcript(text=transcript).event(),
        )

    async def send_reply(self, pcm: bytes, rate: int, stop: bool = True) -> None:
        """Stream TTS audio the way HA's _stream_tts does (with timestamps)."""
        await self.send(AudioStart(rate=rate, width=2, channels=1, timestamp=0).event())
        timestamp = 0
        for offset in range(0, len(pcm), HA_CHUNK_BYTES):
            chunk = AudioChunk(
                rate=rate,
                width=2,
                channels=1,
                audio=pcm[offset : offset + HA_CHUNK_BYTES],
                timestamp=timestamp,
            )
            await self.send(chunk.event())
            timestamp += chunk.milliseconds
        if stop:
            await self.send(AudioStop(timestamp=timestamp).event())


async def stt(server_port: int, pcm: bytes) -> str:
    """HA's STT step, done by the real pivoice server."""
    events = transcribe_events(pcm, 16000, chunk=8192)
    replies = await exchange(server_port, events, until="transcript")
    return replies[-1].data["text"]


async def tts(server_port: int, text: str) -> tuple[bytes, int]:
    """HA's TTS step (preferred format: 22050 Hz mono 16-bit WAV), by the real server."""
    replies = await exchange(server_port, [Synthesize(text=text).event()], until="audio-stop")
    start = next(AudioStart.from_event(e) for e in replies if AudioStart.is_type(e.type))
    assert (start.rate, start.width, start.channels) == (22050, 2, 1)
    pcm = b"".join(e.payload or b"" for e in replies if AudioChunk.is_type(e.type))
    return pcm, start.rate


FFMPEG_HOLD_S = 4.6  # HA pipes a satellite's TTS through ffmpeg: nothing until this much or the end


async def ha_turn(
    ha: FakeHomeAssistant,
    server_port: int,
    stream: Stream,
    satellite_id: str | None,
    conversation_id: str = "ha-conversation",
) -> str:
    """What HA's pipeline does after a satellite's stream when our server is its STT, agent and
    TTS (HA 2026.10): STT; `transcript` to the satellite; the turn to our server with
    `context{conversation_id, satellite_id, device_id}`, read until `handled`; `synthesize`
    to the satellite; TTS by the streaming protocol (HA 2026 with a streaming TTS); the audio
    held as ffmpeg holds it, then sent to the satellite unpaced. Returns the reply."""
    text = await stt(server_port, stream.pcm)
    await ha.pipeline_events(text)
    context: dict[str, Any] = {"conversation_id": conversation_id, "device_id": "ha-device-1"}
    if satellite_id is not None:
        context["satellite_id"] = satellite_id
    replies = await exchange(
        server_port, [Event("transcript", {"text": text, "context": context})], until="handled"
    )
    reply = replies[-1].data["text"]
    await ha.send(Synthesize(text=reply).event())
    events = [
        SynthesizeStart().event(),
        SynthesizeChunk(text=reply).event(),
        Synthesize(text=reply).event(),
        SynthesizeStop().event(),
    ]
    async with AsyncTcpClient("127.0.0.1", server_port) as client:
        for event in events:
            await client.write_event(event)
        pcm, rate, started = bytearray(), 22050, False
        async with asyncio.timeout(120):
            while (event := await client.read_event()) is not None:
                if AudioStart.is_type(event.type) and not started:
                    rate = AudioStart.from_event(event).rate
                elif AudioChunk.is_type(event.type):
                    pcm += event.payload or b""
                    if not started and len(pcm) >= FFMPEG_HOLD_S * rate * 2:
                        started = True
                        await ha.send(AudioStart(rate=rate, width=2, channels=1).event())
                    if started:
                        await _send_held(ha, pcm, rate)
                        pcm.clear()
                elif event.type == "synthesize-stopped":
                    break
    if not started:
        await ha.send(AudioStart(rate=rate, width=2, channels=1).event())
    await _send_held(ha, pcm, rate)
    await ha.send(AudioStop().event())
    return reply


async def _send_held(ha: FakeHomeAssistant, pcm: bytes | bytearray, rate: int) -> None:
    for offset in range(0, len(pcm), HA_CHUNK_BYTES):
        chunk = bytes(pcm[offset : offset + HA_CHUNK_BYTES])
        await ha.send(AudioChunk(rate=rate, width=2, channels=1, audio=chunk).event())
