"""Microphone sources: 16 kHz mono s16le, handed out 512 samples (one Silero VAD frame) at a time.

Every source has the same three calls (`open`, `read`, `close`). `read` returns exactly
CHUNK_BYTES, or None at the end of the stream (a file or command that finished). A live
source that fails (a command that dies, a device that vanishes) is reopened with backoff
instead of ending the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import sys
import threading
import wave
from concurrent.futures import CancelledError
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from wyoming.audio import AudioFormat

from ..realtime import Backoff, timeout
from ..satellite.protocols import AudioSource
from .commands import end_command, start_command, wait_command
from .format import CHANNELS, CHUNK_BYTES, CHUNK_SAMPLES, CHUNK_SECONDS, MIC_FORMAT, RATE
from .pacing import Pacer
from .pcm import StreamingConverter, float_to_pcm16

if TYPE_CHECKING:
    from ..satellite.settings import MicSettings

_LOGGER = logging.getLogger(__name__)

# A file or `cat` would otherwise arrive in one burst; a live microphone is never this far
# ahead of the wall clock, so limiting the lead paces the first and never delays the second.
DEFAULT_MAX_LEAD = 0.25
# The pace's timeline stays put when a read comes late (a CPU stall, a stopped process):
# the backlog is then read at once and the lag is gone, where moving the timeline to "now"
# kept every stall's lag for good (1.5 s stall → 1.28 s late on every later turn). Only a
# gap longer than this (a command that restarted) moves it, so a file fed after one cannot
# burst by more.
CATCH_UP_SECONDS = 5.0


def mic_pacer(lead: float) -> Pacer:
    """The pace of a command or stdin microphone: at most `lead` ahead of real time, and a
    late reader catches up."""
    return Pacer(lead=lead, late=CATCH_UP_SECONDS)


# A live mic command writes 32 kB/s; one that writes nothing for this long is stuck.
MIC_STALL_SECONDS = 10.0
EXIT_WAIT = 2.0  # a mic command that closed its output gets this long to exit


class _Chunker:
    """Cuts a byte stream into CHUNK_BYTES pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def add(self, data: bytes) -> None:
        self._buffer += data

    def take(self) -> bytes | None:
        if len(self._buffer) < CHUNK_BYTES:
            return None
        chunk = bytes(self._buffer[:CHUNK_BYTES])
        del self._buffer[:CHUNK_BYTES]
        return chunk

    def realign(self) -> None:
        """The stream just ended half-way through a sample: drop the lone byte (whole chunks
        are even, so it is always still here), so later audio stays on 2-byte samples."""
        del self._buffer[-1:]

    def rest(self) -> bytes | None:
        """The last partial chunk, padded with silence (or None if nothing is left)."""
        if not self._buffer:
            return None
        chunk = bytes(self._buffer).ljust(CHUNK_BYTES, b"\0")
        self._buffer.clear()
        return chunk


def read_wav_16k(path: str | Path) -> bytes:
    """A WAV file as 16 kHz mono s16le (converted with soxr if it is in another format)."""
    with wave.open(str(path), "rb") as wav:
        fmt = AudioFormat(wav.getframerate(), wav.getsampwidth(), wav.getnchannels())
        pcm = wav.readframes(wav.getnframes())
    if fmt == MIC_FORMAT:
        return pcm
    converter = StreamingConverter(fmt, RATE)
    samples = np.concatenate([converter.convert(pcm), converter.flush()])
    return float_to_pcm16(samples)


class WavSource:
    """A WAV file as the microphone.

    `realtime` paces it at 32 ms per chunk like a device, on a fixed timeline: chunk i is
    captured at start + i × 32 ms (`chunk_time`), and a late reader catches up instead of
    shifting the timeline. Otherwise it goes as fast as it is read.
    """

    def __init__(self, path: str | Path, realtime: bool = True) -> None:
        self.path = Path(path)
        self.realtime = realtime
        self.chunk_time: float | None = None
        self._chunker = _Chunker()
        self._pacer = Pacer(late=None)
        self._done = False

    async def open(self) -> None:
        pcm = await asyncio.to_thread(read_wav_16k, self.path)
        self._chunker = _Chunker()
        self._chunker.add(pcm)
        self._pacer.reset()
        self._done = False

    async def read(self) -> bytes | None:
        if self._done:
            return None
        chunk = self._chunker.take() or self._chunker.rest()
        if chunk is None:
            self._done = True
            return None
        if self.realtime:
            self.chunk_time = await self._pacer.advance(CHUNK_SECONDS)
        return chunk

    async def close(self) -> None:
        self._done = True


class _PacedStream:
    """A byte stream cut into 512-sample chunks and, when paced, handed out at real time:
    what the command and stdin sources share; each says how to `_fill` the chunker."""

    def __init__(self, max_lead: float | None) -> None:
        self._pacer = mic_pacer(max_lead) if max_lead is not None else None
        self._chunker = _Chunker()
        self._ended = False  # no more bytes will come: hand out the rest

    async def read(self) -> bytes | None:
        while True:
            chunk = self._chunker.take()
            if chunk is not None:
                if self._pacer is not None:
                    await self._pacer.advance(CHUNK_SECONDS)
                return chunk
            if self._ended:
                return self._chunker.rest()
            await self._fill()

    async def _fill(self) -> None:
        raise NotImplementedError


class CommandSource(_PacedStream):
    """A command that writes raw s16le 16 kHz mono to stdout (e.g. `arecord … -t raw`).

    Exit status 0 at end of output ends the stream; any other exit (or a failure to
    start) is a fault: the command is restarted with backoff and the stream goes on.
    """

    def __init__(self, command: str, max_lead: float | None = DEFAULT_MAX_LEAD) -> None:
        super().__init__(max_lead)
        self.command = command
        self._proc: asyncio.subprocess.Process | None = None
        self._backoff = Backoff()
        self._closed = False
        self._proc_bytes = 0  # from the running command: odd means it stopped mid-sample
        self.stall_seconds = MIC_STALL_SECONDS
        self.restarts = 0

    async def open(self) -> None:
        self._closed = False
        self._ended = False
        await self._start()

    async def _start(self) -> None:
        self._proc = await start_command(
            self.command, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
        )
        self._proc_bytes = 0
        _LOGGER.debug("Microphone command started (pid %s): %s", self._proc.pid, self.command)

    async def _fill(self) -> None:
        proc = self._proc
        data = b""
        stalled = False
        if proc is not None and proc.stdout is not None:
            try:
                # timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that comes as data arrives, and a stopping satellite would read on.
                async with timeout(self.stall_seconds):
                    data = await proc.stdout.read(CHUNK_BYTES * 4)
            except asyncio.TimeoutError:
                stalled = True
        if data:
            self._chunker.add(data)
            self._proc_bytes += len(data)
            self._backoff.reset()
            return
        if self._proc_bytes % 2:
            _LOGGER.debug("Microphone command ended mid-sample: re-aligning")
            self._chunker.realign()
        self._proc_bytes = 0
        # End of output: a clean exit ends the stream, anything else is restarted.
        returncode = None
        if proc is not None:
            if stalled:
                _LOGGER.warning("Microphone command gave no audio for %.0f s", self.stall_seconds)
                await end_command(proc)
                returncode = -1
            else:
                returncode = await wait_command(proc, EXIT_WAIT)
        if self._closed:
            return
        if returncode == 0:
            _LOGGER.info("Microphone command finished: %s", self.command)
            self._ended = True
            return
        self.restarts += 1
        _LOGGER.warning(
            "Microphone command exited with %s; restarting in %.1f s: %s",
            returncode,
            self._backoff.delay,
            self.command,
        )
        await self._backoff.wait()
        if self._pacer is not None:
            self._pacer.reset()
        try:
            await self._start()
        except OSError as err:
            _LOGGER.warning("Microphone command could not start: %s", err)
            self._proc = None

    async def close(self) -> None:
        self._closed = self._ended = True
        proc, self._proc = self._proc, None
        if proc is not None:
            await end_command(proc)  # its whole group: the shell's children too


class StdinSource(_PacedStream):
    """Raw s16le 16 kHz mono on our own standard input (a pipe, or a file redirected in)."""

    def __init__(self, max_lead: float | None = DEFAULT_MAX_LEAD) -> None:
        super().__init__(max_lead)
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.BaseTransport | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        try:
            self._transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer
            )
            self._reader = reader
        except ValueError:  # a regular file: no pipe transport, read it from a thread
            self._reader = None

    async def _read_some(self) -> bytes:
        if self._reader is not None:
            return await self._reader.read(CHUNK_BYTES * 4)
        stdin = cast(io.BufferedReader, sys.stdin.buffer)  # a buffered binary stream
        return await asyncio.to_thread(stdin.read1, CHUNK_BYTES * 4)

    async def _fill(self) -> None:
        data = await self._read_some()
        if data:
            self._chunker.add(data)
        else:
            self._ended = True

    async def close(self) -> None:
        self._ended = True
        if self._transport is not None:
            self._transport.close()
            self._transport = None


def find_device(pa: Any, spec: str | None, want_input: bool) -> int | None:
    """A PortAudio device index from an index or part of a name (None: the default device)."""
    if spec is None or spec == "" or spec == "default":
        return None
    if spec.isdigit():
        return int(spec)
    kind = "maxInputChannels" if want_input else "maxOutputChannels"
    for index in range(pa.get_device_count()):
        info = pa.get_device_info_by_index(index)
        if spec.lower() in str(info.get("name", "")).lower() and info.get(kind, 0) > 0:
            return index
    raise LookupError(f"no {'input' if want_input else 'output'} audio device matches {spec!r}")


class PyAudioSource:
    """A capture device through PortAudio at 16 kHz mono 16-bit, 512 frames per buffer.

    The device delivers the rate we need (no resampling here). A reader thread keeps
    capturing while the event loop is busy; if the device vanishes it is reopened with
    backoff.
    """

    def __init__(self, device: str | None = None, max_queue_seconds: float = 2.0) -> None:
        self.device = device
        self._queue: asyncio.Queue[bytes | BaseException] | None = None
        self._max_chunks = int(max_queue_seconds / CHUNK_SECONDS)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._backoff = Backoff()
        # PyAudio has no type information: its objects are Any.
        self._pa: Any = None
        self._stream: Any = None
        self.restarts = 0

    async def open(self) -> None:
        self._queue = asyncio.Queue(self._max_chunks)
        self._stop.clear()
        await asyncio.to_thread(self._open_stream)
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._capture, args=(loop, self._queue), name="pivoice mic", daemon=True
        )
        self._thread.start()

    def _open_stream(self) -> None:
        import pyaudio

        if self._pa is None:
            self._pa = pyaudio.PyAudio()
        pa = self._pa
        self._stream = pa.open(
            format=pyaudio.paInt16,
            channels=CHANNELS,
            rate=RATE,
            input=True,
            input_device_index=find_device(pa, self.device, want_input=True),
            frames_per_buffer=CHUNK_SAMPLES,
        )
        _LOGGER.info("Microphone device open: %s", self.device or "default")

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.stop_stream()
            with contextlib.suppress(Exception):
                stream.close()

    def _capture(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        while not self._stop.is_set():
            try:
                if self._stream is None:
                    self._open_stream()
                    self._backoff.reset()
                data = self._stream.read(CHUNK_SAMPLES, exception_on_overflow=False)
            except Exception as err:  # the device vanished or refused to open
                if self._stop.is_set():
                    break
                self.restarts += 1
                _LOGGER.warning(
                    "Microphone device failed (%s); reopening in %.1f s", err, self._backoff.delay
                )
                self._close_stream()
                self._terminate()  # PortAudio lists devices once: a fresh instance finds it again
                self._stop.wait(self._backoff.next())
                continue
            # Wait for room: a live device drops audio itself (overflow) if we ever stall,
            # and a device faster than real time (a file) is read at our pace.
            try:
                asyncio.run_coroutine_threadsafe(queue.put(data), loop).result()
            except (RuntimeError, CancelledError):  # the loop closed during shutdown
                break

    async def read(self) -> bytes | None:
        if self._queue is None:
            return None
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def close(self) -> None:
        self._stop.set()
        if self._queue is not None:
            while not self._queue.empty():  # unblock the reader thread
                self._queue.get_nowait()
        thread, self._thread = self._thread, None
        if thread is not None:
            # A read takes 32 ms; a device stuck in one is left to the (daemon) thread.
            await asyncio.to_thread(thread.join, 0.5)
            if thread.is_alive():
                _LOGGER.warning("The microphone device does not return: leaving it open")
                return
        self._close_stream()
        self._terminate()

    def _terminate(self) -> None:
        pa, self._pa = self._pa, None
        if pa is not None:
            with contextlib.suppress(Exception):
                pa.terminate()


def open_source(mic: MicSettings) -> AudioSource:
    """The source that the settings name (not opened yet)."""
    pace = mic.pace
    if mic.wav:
        return WavSource(mic.wav, realtime=pace != "none")
    lead = {"auto": DEFAULT_MAX_LEAD, "realtime": 0.0, "none": None}[pace]
    if mic.command:
        return CommandSource(mic.command, max_lead=lead)
    if mic.stdin:
        return StdinSource(max_lead=lead)
    return PyAudioSource(mic.device)
