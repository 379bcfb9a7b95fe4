"""Speaker sinks: play a reply's PCM at its own rate, as it arrives.

A reply is everything `play`ed between two `drain`/`stop` calls. Its first `play`
opens the output at that audio's rate; `drain` waits until the reply has really
been played (or written); `stop` drops what is queued and stops at once (barge-in).
`first_sample_at` is the monotonic time the reply's first sample went out.

A speaker is handed audio at real-time pace, never more than `lead` seconds ahead of
when it plays: a barge-in then silences it within that lead, and the echo canceller's
`tap` (the echo canceller) learns when each piece plays (its due time) within that margin,
and when a stop cut off what was handed over but not yet played.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import logging
import shlex
import termios
import time
import wave
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from wyoming.audio import AudioFormat

from ..audio import bytes_per_second, duration, frame_bytes, plain_format
from ..realtime import Pacer, timeout
from .audio_in import find_device
from .commands import end_command, start_command
from .protocols import AudioSink

if TYPE_CHECKING:
    from .settings import SndSettings

_LOGGER = logging.getLogger(__name__)

STOP_WAIT = 1.0  # a stopped reply's task gets this long to wind down; it is dropped after
# A speaker must take and play a reply within the reply's own length plus this margin
# (device start-up, its buffer); one that does not is killed and the next reply reopens it.
SPEAKER_MARGIN = 2.0
# How far ahead of real time a speaker is fed: enough to ride out an event-loop stall,
# short enough that a barge-in is heard at once.
SPEAKER_LEAD = 0.1
PIECE_SECONDS = 0.02  # audio is handed over in pieces this long (so the lead holds)
PLAYS_LATE = 0.05  # a piece this late finds the device run dry: it plays when it comes


class Tap(Protocol):
    """Who hears of what a sink plays (the echo canceller's reference)."""

    def reference(self, pcm: bytes, fmt: AudioFormat, due: float) -> None:
        """`pcm` is due to start playing at monotonic time `due`."""

    def cut(self, at: float) -> None:
        """Nothing handed over plays after monotonic time `at` (a stop)."""


class QueuedSink:
    """The queueing every sink shares: one writer task per reply feeds the backend.

    Subclasses implement `_open`, `_write` (returns once the bytes are with the device),
    `_finish` (returns once everything written has been played) and `_abort`, and set
    `lead`: None hands audio over as fast as it is taken (a file), a number paces it.
    """

    lead: float | None = SPEAKER_LEAD

    def __init__(self) -> None:
        self.first_sample_at: float | None = None
        self.tap: Tap | None = None
        self.replies = 0
        self._queue: asyncio.Queue[bytes | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._format: AudioFormat | None = None

    @property
    def playing(self) -> bool:
        """A reply is queued or playing."""
        return self._task is not None and not self._task.done()

    async def play(self, pcm: bytes, fmt: AudioFormat) -> None:
        fmt = plain_format(fmt)
        if self.playing and fmt != self._format:
            await self.drain()  # a new format mid-reply: finish what we have, reopen
        if not self.playing:
            self.first_sample_at = None
            self.replies += 1
            self._format = fmt
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._run(fmt, self._queue), name="playback")
        assert self._queue is not None
        if pcm:
            self._queue.put_nowait(pcm)

    async def _run(self, fmt: AudioFormat, queue: asyncio.Queue[bytes | None]) -> None:
        # Like a device: a piece may go `lead` before it plays; one that comes more than
        # PLAYS_LATE after it was due finds the device run dry, which starts again with it.
        clock = Pacer(self.lead, late=PLAYS_LATE) if self.lead is not None else None
        piece_bytes = max(1, round(PIECE_SECONDS * fmt.rate)) * frame_bytes(fmt)
        try:
            await self._open(fmt)
            while (pcm := await queue.get()) is not None:
                for offset in range(0, len(pcm), piece_bytes):
                    piece = pcm[offset : offset + piece_bytes]
                    if clock is None:
                        await self._write(piece)
                    else:
                        due = await clock.advance(duration(fmt, len(piece)))
                        await self._write(piece)
                        due = clock.taken(due)
                        # Only what plays in real time can be heard: a file is no speaker.
                        if self.tap is not None:
                            self.tap.reference(piece, fmt, due)
                    if self.first_sample_at is None:
                        self.first_sample_at = self._written_at
            if clock is not None:
                await clock.finish()
            await self._finish()
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._abort()
            raise
        except OSError as err:  # the device vanished, the command died…
            _LOGGER.warning("Playback failed (%s); the rest of this reply is dropped", err)
            with contextlib.suppress(Exception):
                await self._abort()
        except Exception:
            _LOGGER.exception("Playback failed; the rest of this reply is dropped")
            with contextlib.suppress(Exception):
                await self._abort()

    async def drain(self) -> None:
        task, queue = self._task, self._queue
        if task is None or queue is None:
            return
        queue.put_nowait(None)
        # wait() rather than await: a barge-in's stop() cancels the task, not our caller.
        await asyncio.wait({task})
        if self._task is task:
            self._task = None

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        if self.tap is not None:
            self.tap.cut(time.monotonic())
        task.cancel()
        # wait() rather than await: bounded, even for a backend that does not return.
        await asyncio.wait({task}, timeout=STOP_WAIT)

    async def close(self) -> None:
        await self.stop()

    # ---- backend ------------------------------------------------------------------------

    _written_at: float = 0.0  # set by _write: when the first byte of its data went out

    async def _open(self, fmt: AudioFormat) -> None:
        pass

    async def _write(self, pcm: bytes) -> None:
        self._written_at = time.monotonic()

    async def _finish(self) -> None:
        pass

    async def _abort(self) -> None:
        pass


class NullSink(QueuedSink):
    """Discards audio (optionally taking as long as playing it would)."""

    def __init__(self, realtime: bool = False) -> None:
        super().__init__()
        self.lead = 0.0 if realtime else None


class WavSink(QueuedSink):
    """Writes replies into a WAV file.

    All replies go into one file (the header is patched after every write, so the file
    is valid at any moment) unless `path` contains `{n}`, which gives each reply its own
    file (n = 1, 2, …). A reply at another format than the file's starts a new file
    `NAME-N.wav`. `realtime` paces writing like a speaker.
    """

    def __init__(self, path: str | Path, realtime: bool = False) -> None:
        super().__init__()
        self.path = str(path)
        self.lead = 0.0 if realtime else None
        self.paths: list[Path] = []
        self._file: BinaryIO | None = None  # ours, so we can flush it (wave does not)
        self._wav: wave.Wave_write | None = None
        self._wav_format: AudioFormat | None = None

    def _next_path(self) -> Path:
        if "{n}" in self.path:
            return Path(self.path.replace("{n}", str(self.replies)))
        if not self.paths:
            return Path(self.path)
        base = Path(self.path)
        return base.with_name(f"{base.stem}-{len(self.paths) + 1}{base.suffix}")

    async def _open(self, fmt: AudioFormat) -> None:
        await super()._open(fmt)
        if self._wav is not None and ("{n}" in self.path or fmt != self._wav_format):
            self._close_wav()
        if self._wav is None:
            path = self._next_path()
            self._file = open(path, "wb")  # noqa: SIM115 — kept open across replies
            wav = wave.open(self._file, "wb")  # noqa: SIM115 — closed with the file
            wav.setframerate(fmt.rate)
            wav.setsampwidth(fmt.width)
            wav.setnchannels(fmt.channels)
            self._wav, self._wav_format = wav, fmt
            self.paths.append(path)

    async def _write(self, pcm: bytes) -> None:
        self._written_at = time.monotonic()
        assert self._wav is not None
        self._wav.writeframes(pcm)  # small and buffered: fine on the loop

    async def _finish(self) -> None:
        if self._file is not None:
            self._file.flush()

    async def _abort(self) -> None:
        if self._file is not None:
            self._file.flush()

    def _close_wav(self) -> None:
        wav, self._wav = self._wav, None
        file, self._file = self._file, None
        if wav is not None:
            wav.close()  # patches the header; the file is ours to close
        if file is not None:
            file.close()

    async def close(self) -> None:
        await super().close()
        self._close_wav()


F_SETPIPE_SZ = 1031  # Linux fcntl
PIPE_BYTES = 4096  # the smallest pipe: 93 ms at 22050 Hz mono 16-bit
PRIMER_SECONDS = 0.01
COMMAND_START_TIMEOUT = 2.0  # a speaker command that reads nothing this long is not waited for


class CommandSink(QueuedSink):
    """Pipes each reply into a new process (e.g. `aplay -r {rate} -c {channels} -f S16_LE -t raw`).

    Each reply starts with 10 ms of silence: the reply's clock starts once the command has
    read it.

    {rate}, {channels}, {width} and {bits} are substituted for the reply's format, {n} for
    the reply's number (1, 2, …). The reply has been played when the command exits after
    its standard input closes.
    """

    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command
        self._proc: asyncio.subprocess.Process | None = None
        self._pipe_fd: int | None = None

    def format_command(self, fmt: AudioFormat) -> str:
        # Plain replacement, not str.format: shell commands may hold other braces (awk …).
        command = self.command
        values = {
            "rate": fmt.rate,
            "width": fmt.width,
            "channels": fmt.channels,
            "bits": fmt.width * 8,
            "n": self.replies,
        }
        for key, value in values.items():
            command = command.replace("{" + key + "}", str(value))
        return command

    async def _open(self, fmt: AudioFormat) -> None:
        await super()._open(fmt)
        command = self.format_command(fmt)
        # Its own process group: a stop silences everything it started (sh -c 'aplay …').
        self._proc = await start_command(
            command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL
        )
        self._bytes_per_second = bytes_per_second(fmt)  # for the bound, whatever paces us
        self._played_by = time.monotonic()  # when what was written so far has played
        _LOGGER.debug("Speaker command started (pid %s): %s", self._proc.pid, command)
        assert self._proc.stdin is not None
        pipe = self._proc.stdin.get_extra_info("pipe")
        self._pipe_fd = pipe.fileno() if pipe is not None else None
        if self._pipe_fd is not None:
            # A small pipe: what sits in it plays after a barge-in, and it hides when the
            # command really plays each piece from the echo canceller.
            with contextlib.suppress(OSError):
                fcntl.fcntl(self._pipe_fd, F_SETPIPE_SZ, PIPE_BYTES)
        await self._until_taking(fmt)

    async def _until_taking(self, fmt: AudioFormat) -> None:
        """Hand the command a moment of silence and wait (bounded) until it reads it: only
        then does the reply's clock start, so the command's start-up is not counted as
        playing (the echo canceller's reference would run ahead of the echo)."""
        assert self._proc is not None and self._proc.stdin is not None
        primer = bytes(round(fmt.rate * PRIMER_SECONDS) * frame_bytes(fmt))
        self._proc.stdin.write(primer)
        if self._pipe_fd is None:
            return
        deadline = time.monotonic() + COMMAND_START_TIMEOUT
        while self._unread() >= len(primer) and time.monotonic() < deadline:
            if self._proc.returncode is not None:
                return
            await asyncio.sleep(0.005)

    def _unread(self) -> int:
        """Bytes handed to the command that it has not read yet."""
        if self._pipe_fd is None:
            return 0
        count = array.array("i", [0])
        try:
            fcntl.ioctl(self._pipe_fd, termios.FIONREAD, count)
        except OSError:
            return 0
        return count[0]

    def _time_left(self) -> float:
        return self._played_by + SPEAKER_MARGIN - time.monotonic()

    async def _write(self, pcm: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._written_at = time.monotonic()
        self._played_by = max(self._played_by, self._written_at) + len(pcm) / self._bytes_per_second
        self._proc.stdin.write(pcm)
        try:  # timeout: wait_for (3.11) can swallow a barge-in's cancellation
            async with timeout(max(self._time_left(), 0.01)):
                await self._proc.stdin.drain()
        except asyncio.TimeoutError:
            raise OSError("the speaker command stopped taking audio") from None

    async def _finish(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with timeout(max(self._time_left(), 0.01)):
                code = await proc.wait()
        except asyncio.TimeoutError:
            raise OSError("the speaker command did not finish the reply in time") from None
        self._proc = None
        await end_command(proc)  # anything its group left running
        if code != 0:
            _LOGGER.warning("Speaker command exited with %s: %s", code, shlex.quote(self.command))

    async def _abort(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            await end_command(proc, grace=0)  # SIGKILL at once: a barge-in must be silent now


class PyAudioSink(QueuedSink):
    """An output device through PortAudio, opened at each reply's own rate."""

    PIECE_FRAMES = 1024  # write in small pieces so a barge-in stops within ~50 ms

    def __init__(self, device: str | None = None) -> None:
        super().__init__()
        self.device = device
        # PyAudio has no type information: its objects are Any.
        self._pa: Any = None
        self._stream: Any = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="pivoice speaker")
        self._aborted = False

    async def _call(self, fn, *args):  # a tiny thread hop
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open_stream(self, fmt: AudioFormat) -> None:
        import pyaudio

        if self._pa is None:
            self._pa = pyaudio.PyAudio()
        pa = self._pa
        self._stream = pa.open(
            format=pa.get_format_from_width(fmt.width),
            channels=fmt.channels,
            rate=fmt.rate,
            output=True,
            output_device_index=find_device(pa, self.device, want_input=False),
            frames_per_buffer=self.PIECE_FRAMES,
        )

    async def _open(self, fmt: AudioFormat) -> None:
        await super()._open(fmt)
        self._aborted = False
        self._frame_bytes = frame_bytes(fmt)
        self._bytes_per_second = bytes_per_second(fmt)  # for the bound, whatever paces us
        self._played_by = time.monotonic()  # when what was written so far has played
        await self._device(self._open_stream, fmt)

    async def _device(self, fn: Callable[..., object], *args: object) -> None:
        """A call into PortAudio, bounded by the reply's own length plus the margin."""
        left = max(self._played_by + SPEAKER_MARGIN - time.monotonic(), 0.01)
        try:
            async with timeout(left):
                await self._call(fn, *args)
        except asyncio.TimeoutError:
            # The device thread is stuck in PortAudio: leave it behind; the next reply
            # opens the device on a new thread and a new PortAudio instance.
            self._aborted = True
            self._executor.shutdown(wait=False)
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="pivoice speaker")
            self._stream = self._pa = None
            raise OSError("the speaker device stopped taking audio") from None

    def _write_blocking(self, pcm: bytes) -> None:
        step = self.PIECE_FRAMES * self._frame_bytes
        for offset in range(0, len(pcm), step):
            if self._aborted:
                return
            self._stream.write(pcm[offset : offset + step])

    async def _write(self, pcm: bytes) -> None:
        self._written_at = time.monotonic()
        self._played_by = max(self._played_by, self._written_at) + len(pcm) / self._bytes_per_second
        await self._device(self._write_blocking, pcm)

    def _close_stream(self, play_out: bool) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        with contextlib.suppress(Exception):
            # stop_stream lets the buffered audio play out; abort drops it.
            if play_out:
                stream.stop_stream()
            stream.close()

    async def _finish(self) -> None:
        await self._device(self._close_stream, True)  # plays out what the device holds

    async def _abort(self) -> None:
        self._aborted = True
        await self._call(self._close_stream, False)

    async def close(self) -> None:
        await super().close()
        pa, self._pa = self._pa, None
        if pa is not None:
            await self._call(pa.terminate)
        self._executor.shutdown(wait=False)


def open_sink(snd: SndSettings) -> AudioSink:
    if snd.wav:
        return WavSink(snd.wav, realtime=snd.realtime)
    if snd.command:
        return CommandSink(snd.command)
    if snd.device in ("null", "none"):
        return NullSink(realtime=snd.realtime)
    return PyAudioSink(snd.device)
