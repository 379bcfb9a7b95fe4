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
import concurrent.futures
import contextlib
import fcntl
import logging
import os
import shlex
import signal
import subprocess
import termios
import threading
import time
import wave
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from wyoming.audio import AudioFormat

from ..realtime import timeout
from ..satellite.protocols import AudioSink, Tap
from .commands import end_command, start_command
from .mic import find_device
from .pacing import Pacer, raise_thread
from .pcm import bytes_per_second, duration, frame_bytes, plain_format

if TYPE_CHECKING:
    from ..satellite.settings import SndSettings

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
        # The reply's backend failed: the rest of it is dropped until its drain or stop.
        # Reopened for it instead, a speaker command with {n} got the next reply's number.
        self._dropping = False

    @property
    def playing(self) -> bool:
        """A reply is queued or playing."""
        return self._task is not None and not self._task.done()

    async def play(self, pcm: bytes, fmt: AudioFormat) -> None:
        fmt = plain_format(fmt)
        if self._dropping:
            return
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
            self._dropping = True
            with contextlib.suppress(Exception):
                await self._abort()
        except Exception:
            _LOGGER.exception("Playback failed; the rest of this reply is dropped")
            self._dropping = True
            with contextlib.suppress(Exception):
                await self._abort()

    async def drain(self) -> None:
        task, queue = self._task, self._queue
        if task is None or queue is None:
            self._dropping = False
            return
        queue.put_nowait(None)
        # wait() rather than await: a barge-in's stop() cancels the task, not our caller.
        await asyncio.wait({task})
        if self._task is task:
            self._task = None
            self._dropping = False  # the reply ends here: the next one opens the backend anew

    async def stop(self) -> None:
        task, self._task = self._task, None
        self._dropping = False
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
# How often a new speaker command is looked at until it has read the primer. Its first block
# plays once the primer has played out, 10 ms after the command took it; the timeline starts
# when we see it taken. Polled every 5 ms, that varied by 5 ms, and so did where each new
# command's reply (after a barge-in, a hold) stood against its reference: 4.6-10.1 ms before
# it played (bench --room, load 4.6), an echo delay that moved up to 5.5 ms between replies.
TAKING_POLL_S = 0.001


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


def open_output(pa: Any, device: str | None, fmt: AudioFormat, frames: int) -> Any:
    """A PortAudio output stream in `fmt` on the named device (both speakers open it so)."""
    return pa.open(
        format=pa.get_format_from_width(fmt.width),
        channels=fmt.channels,
        rate=fmt.rate,
        output=True,
        output_device_index=find_device(pa, device, want_input=False),
        frames_per_buffer=frames,
    )


def open_sink(snd: SndSettings) -> AudioSink:
    """The sink the settings name. A speaker (a device, or a command without {n}) is one
    continuous stream; a command with {n} is started per reply (a file per reply)."""
    if snd.wav:
        return WavSink(snd.wav, realtime=snd.realtime)
    if snd.command:
        if "{n}" in snd.command:
            return CommandSink(snd.command)
        return ContinuousSink(CommandDevice(snd.command))
    if snd.device in ("null", "none"):
        return NullSink(realtime=snd.realtime)
    return ContinuousSink(PyAudioDevice(snd.device))


# ---- continuous playout: the speaker stream stays open across replies ----------------------

BLOCK_SECONDS = 0.02  # the speaker thread writes blocks this long, audio or silence
# How far ahead of its due time a block goes to the device: enough to ride out a late
# wake-up of the speaker thread, short enough that a barge-in is silent within it.
CONTINUOUS_LEAD = 0.04
KEEP_REFERENCE_SECONDS = 30.0  # bound on audio queued for the speaker (a drain waits for it)
# What a hold that kills a speaker command may put back: written, not yet played (the lead,
# the command's pipe and its device's buffer).
WRITTEN_KEEP_SECONDS = 0.5
HOLD_MAX_SECONDS = 3.0  # a hold nobody releases ends by itself
# The speaker thread this late for a block (past its due time: everything before it has
# played, the lead is used up): the device ran dry.
UNDERRUN_LATE = 0.005


class SpeakerDevice(Protocol):
    """A blocking output stream (the speaker thread's only contact with the device)."""

    def open(self, fmt: AudioFormat) -> None: ...

    def write(self, pcm: bytes) -> None:
        """Returns once the device has taken `pcm` (blocks while its buffer is full)."""

    def wait_taking(self, primer: bytes, timeout: float) -> None:
        """Write `primer` and return once the device has taken it (bounded by `timeout`):
        a command's start-up is not counted as playing."""

    def close(self) -> None: ...


class CommandDevice:
    """A speaker command (`aplay …`) fed through a small pipe, started once."""

    def __init__(self, command: str) -> None:
        self.command = command
        self._proc: subprocess.Popen[bytes] | None = None

    def open(self, fmt: AudioFormat) -> None:
        command = self.command
        for key, value in (
            ("rate", fmt.rate),
            ("width", fmt.width),
            ("channels", fmt.channels),
            ("bits", fmt.width * 8),
            ("n", 1),
        ):
            command = command.replace("{" + key + "}", str(value))
        # Its own process group: closing ends everything it started (sh -c 'aplay …').
        self._proc = subprocess.Popen(
            command,
            shell=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._proc.stdin.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        _LOGGER.debug("Speaker command started (pid %s): %s", self._proc.pid, command)

    def wait_taking(self, primer: bytes, timeout: float) -> None:
        self.write(primer)
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        fd = proc.stdin.fileno()
        deadline = time.monotonic() + timeout
        count = array.array("i", [0])
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                fcntl.ioctl(fd, termios.FIONREAD, count)
            except OSError:
                return
            if count[0] < len(primer):
                return
            time.sleep(TAKING_POLL_S)

    def write(self, pcm: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise OSError("the speaker command is not running")
        try:
            proc.stdin.write(pcm)
            proc.stdin.flush()
        except (BrokenPipeError, ValueError) as err:
            raise OSError(f"the speaker command stopped taking audio ({err})") from None

    def drop(self) -> None:
        """Silence now: the command's whole group is killed, and with it whatever it holds
        (its pipe, aplay's ALSA buffer, a room's device buffer): the next write fails and
        the sink opens the command anew. Measured in the room (headset, load 11): the sound
        ran on 158-222 ms after a barge-in was decided while the command was left to play
        out what it held."""
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=SPEAKER_MARGIN)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)


class PyAudioDevice:
    """An output device through PortAudio, opened once."""

    FRAMES = 512

    def __init__(self, device: str | None = None) -> None:
        self.device = device
        self._pa: Any = None
        self._stream: Any = None

    def open(self, fmt: AudioFormat) -> None:
        import pyaudio

        self._pa = pa = pyaudio.PyAudio()
        self._stream = open_output(pa, self.device, fmt, self.FRAMES)

    def wait_taking(self, primer: bytes, timeout: float) -> None:
        self.write(primer)

    def write(self, pcm: bytes) -> None:
        if self._stream is None:
            raise OSError("the speaker device is closed")
        try:
            self._stream.write(pcm)
        except Exception as err:  # PortAudio's own errors: the device vanished
            raise OSError(f"the speaker device failed ({err})") from None

    def close(self) -> None:
        stream, self._stream = self._stream, None
        pa, self._pa = self._pa, None
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.stop_stream()
                stream.close()
        with contextlib.suppress(Exception):
            if pa is not None:
                pa.terminate()


class _Reply:
    """One reply on the continuous stream, as the loop waits for it."""

    def __init__(self) -> None:
        self.pending = bytearray()  # stream-format audio not written yet
        self.ended = False  # drain(): nothing more comes
        self.started = False
        self.first_due: float | None = None
        self.last_due: float | None = None  # when its last sample plays
        self.done = threading.Event()


class ContinuousSink:
    """The speaker stream stays open across replies; silence is written between them.

    One thread, started with the first reply, writes BLOCK_SECONDS blocks to the device on
    a timeline of the stream's own sample count, each CONTINUOUS_LEAD before it is due:
    reply audio when there is some, silence otherwise. So the echo's delay never moves from
    reply to reply, a late event loop cannot open a gap inside a reply (the audio is queued
    ahead), and each block goes to the echo canceller's reference with the time it plays.
    When the thread itself is late (the device ran dry), the timeline moves on by that
    much: silence in the reference too. A stop drops the queued audio; the stream and AEC3
    go on. The stream's format is the first reply's (mono 16-bit); later replies in another
    format are converted to it.
    """

    def __init__(self, device: SpeakerDevice, lead: float = CONTINUOUS_LEAD) -> None:
        self.device = device
        self.lead = lead
        self.first_sample_at: float | None = None
        self.tap: Tap | None = None
        self.replies = 0
        self.underruns = 0
        self._format: AudioFormat | None = None
        self._converters: dict[AudioFormat, Any] = {}
        self._lock = threading.Lock()
        self._reply: _Reply | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._failed: BaseException | None = None
        self._cut = False  # a barge-in cut the reply: drop its audio until stop/drain
        self._dropped = False  # a cut killed the device's command: it opens anew
        self._generation = 0  # a speaker thread left stuck in the device sees it change
        self.cut_at: float | None = None  # when the audio core last cut a reply (take_cut)
        # A hold (the audio core: a voice over the reply, maybe): nothing of the reply is
        # written until `release` (or a cut ends it); `held_at` when it began.
        self.held_at: float | None = None
        self.holds = 0
        self._released = threading.Event()
        self._held_s = 0.0  # time the replies have spent held (a drain's bound grows by it)
        # What went to the device lately, with when it plays: a hold that drops a command's
        # buffer puts back what had not played yet.
        self._written: deque[tuple[float, bytes]] = deque()
        self._hold_dropped = False  # a hold killed the command: the thread reopens it
        self._dropped_at = 0.0  # …at this time: what was written for later did not play

    @property
    def playing(self) -> bool:
        reply = self._reply
        return reply is not None and not reply.done.is_set()

    def _stream_pcm(self, pcm: bytes, fmt: AudioFormat) -> bytes:
        assert self._format is not None
        if fmt == self._format:
            return pcm
        from .pcm import StreamingConverter, float_to_pcm16

        converter = self._converters.get(fmt)
        if converter is None:
            converter = self._converters[fmt] = StreamingConverter(fmt, self._format.rate)
        return float_to_pcm16(converter.convert(pcm))

    async def play(self, pcm: bytes, fmt: AudioFormat) -> None:
        fmt = plain_format(fmt)
        if self._format is None:
            self._format = AudioFormat(fmt.rate, 2, 1)
        if self._thread is None or self._failed is not None or self._dropped:
            await self._start()
        with self._lock:
            if self._cut:
                return
            reply = self._reply
            if reply is None or reply.ended or reply.done.is_set():
                reply = self._reply = _Reply()
                self.replies += 1
                self.first_sample_at = None
            if len(reply.pending) < KEEP_REFERENCE_SECONDS * bytes_per_second(self._format):
                reply.pending += self._stream_pcm(pcm, fmt)

    async def _start(self) -> None:
        assert self._format is not None
        if self._thread is not None:  # the last device failed: a new one
            await asyncio.to_thread(self._thread.join, STOP_WAIT)
        self._generation += 1
        self._failed = None
        self._dropped = self._hold_dropped = False
        self._closing.clear()
        fmt = self._format
        opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run,
            args=(fmt, self._generation, opened),
            name="pivoice speaker",
            daemon=True,
        )
        self._thread.start()
        await asyncio.wrap_future(opened)  # the device's own errors are raised here

    def take_cut(self) -> float | None:
        """When the audio core cut the reply playing (a barge-in the loop has not seen yet),
        once; None if it did not."""
        with self._lock:
            at, self.cut_at = self.cut_at, None
            if at is not None:
                self._cut = False  # the loop knows now: its next reply plays
        return at

    async def drain(self) -> None:
        self._cut = False
        reply = self._reply
        if reply is None:
            return
        assert self._format is not None
        with self._lock:
            reply.ended = True
            left = len(reply.pending) / bytes_per_second(self._format)
        # Bounded: the reply's own length, the lead, the margin a device gets, and the time
        # it spends held meanwhile (each hold is bounded: turn_policy.TurnPolicy.hold_frames).
        held = self._held_s
        played = await asyncio.to_thread(reply.done.wait, left + self.lead + SPEAKER_MARGIN)
        while not played and (self.held_at is not None or self._held_s > held):
            more = self._held_s - held + (1.0 if self.held_at is not None else 0.0)
            held = self._held_s
            played = await asyncio.to_thread(reply.done.wait, more)
        if not played and self._thread is not None and self._thread.is_alive():
            # The speaker thread is stuck in the device (it stopped taking audio): it is
            # left behind, and the next reply opens the device on a new thread.
            _LOGGER.warning(
                "Playback: the speaker device stopped taking audio; it opens with the next reply"
            )
            self._generation += 1
            self._thread = None
            self._failed = OSError("the speaker device stopped taking audio")
        if reply.first_due is not None:
            self.first_sample_at = reply.first_due
        if reply.last_due is not None:
            delay = reply.last_due - time.monotonic()
            if delay > 0:  # written, and plays within the lead: wait until it has played
                await asyncio.sleep(delay)
        reply.done.set()

    async def stop(self) -> None:
        self.cut()
        self._cut = False

    def hold(self) -> bool:
        """Thread-safe pause (the audio core: a voice over the reply, maybe): silence from now
        on, the reply's audio kept. A speaker command is killed, as by a cut (what it holds
        would play on for 100-200 ms), and what it had not played yet is put back; it opens
        anew on `release`. Returns whether a reply was playing to hold."""
        now = time.monotonic()
        with self._lock:
            reply = self._reply
            if reply is None or reply.done.is_set() or self._cut or self.held_at is not None:
                return False
            if not reply.started and not reply.pending:
                return False
            self.held_at = now
            self.holds += 1
            self._released.clear()
            drop = getattr(self.device, "drop", None)
            if drop is not None:
                # The speaker thread puts back what had not played (it alone knows what it
                # wrote) and opens the command anew once the reply is released.
                self._hold_dropped = True
                self._dropped_at = now
                self._dropped = True
                drop()
        if drop is not None and self.tap is not None:
            self.tap.hold(now)  # nothing handed over plays from now on
        return True

    def release(self) -> None:
        """Thread-safe: a held reply plays on where it stopped."""
        with self._lock:
            self._end_hold()

    def _end_hold(self) -> bool:
        """Under the lock: the hold (if any) is over; its time counts for a drain's bound and
        the speaker thread waiting on it goes on. Returns whether there was one."""
        held_at, self.held_at = self.held_at, None
        if held_at is None:
            return False
        self._held_s += time.monotonic() - held_at
        self._released.set()
        return True

    def cut(self, hold: bool = False) -> bool:
        """Thread-safe stop: the current reply's queued audio is dropped at once (what is
        written already, the lead, still plays). The audio core calls it on a barge-in with
        `hold`: the rest of that reply is dropped too, until the loop's own stop (or the
        reply's drain) has caught up. Returns whether there was a reply to cut."""
        with self._lock:
            reply = self._reply
            if reply is None or reply.done.is_set():
                # Nothing to cut (the reply has all been written; its last lead still plays).
                # Holding now would drop the next reply's audio, which no stop would release.
                return False
            if hold:
                self._cut = True
                # A held reply stopped sounding when it was held.
                self.cut_at = self.held_at or time.monotonic()
            was_held = self._end_hold()
            reply.pending.clear()
            reply.ended = True
            if reply.first_due is not None:
                self.first_sample_at = reply.first_due
            drop = getattr(self.device, "drop", None)
            if drop is not None:
                # What the command holds would play on (the lead, its pipe, its own buffer):
                # it is killed instead, and opened again with the next reply.
                self._dropped = True
                drop()
        reply.done.set()
        if was_held and self._dropped and self.tap is not None:
            # Silent since the hold; the canceller starts its barge-in's fresh filter now.
            barge_in = getattr(self.tap, "barge_in", None)
            if barge_in is not None:
                barge_in()
            return True
        if self._dropped and self.tap is not None:
            self.tap.cut(time.monotonic())  # nothing handed over plays from now on
            return True
        barge_in = getattr(self.tap, "barge_in", None)
        if barge_in is not None:
            barge_in()  # the echo canceller: see EchoCanceller.barge_in
        return True

    async def close(self) -> None:
        await self.stop()
        self._closing.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, STOP_WAIT + SPEAKER_MARGIN)
        await asyncio.to_thread(self.device.close)

    # ---- the speaker thread ---------------------------------------------------------------

    def _keep_written(self, due: float, pcm: bytes) -> None:
        written = self._written
        written.append((due, pcm))
        while written and written[0][0] < due - WRITTEN_KEEP_SECONDS:
            written.popleft()

    def _put_back(self, pcm: bytes) -> None:
        """After a hold killed the command: what was written for after the hold, and `pcm`
        (not written), go back to the front of the reply."""
        with self._lock:
            reply, at = self._reply, self._dropped_at
            written = list(self._written)
            self._written.clear()
            if reply is None or reply.done.is_set() or self._cut:
                return
            unplayed = [_after(block, due, at, self._format) for due, block in written]
            reply.pending[:0] = b"".join(unplayed) + pcm

    def _reopen_after_hold(self, fmt: AudioFormat, generation: int, primer: bytes) -> bool:
        """After a hold killed the command: wait for the release (bounded: HOLD_MAX_SECONDS,
        in case the audio thread that holds never releases), then open the device again.
        False when the reply was cut meanwhile (the thread then ends as after any cut)."""
        with contextlib.suppress(Exception):
            self.device.close()
        if not self._released.wait(HOLD_MAX_SECONDS):
            _LOGGER.warning("Playback held for %.0f s: it plays on", HOLD_MAX_SECONDS)
            self.release()
        if not self._plays_on(generation):
            return False
        self.device.open(fmt)
        with self._lock:
            # A cut while it opened killed the old command, not this one: it goes too, or it
            # would stay open with nobody writing to it.
            plays_on = self._plays_on(generation)
            if plays_on:
                self._dropped = self._hold_dropped = False
        if not plays_on:
            drop = getattr(self.device, "drop", None)
            if drop is not None:
                drop()
            with contextlib.suppress(Exception):
                self.device.close()
            return False
        self.device.wait_taking(primer, COMMAND_START_TIMEOUT)
        return True

    def _plays_on(self, generation: int) -> bool:
        """The held reply is still to be played (not cut, the sink not closing)."""
        reply = self._reply
        if self._cut or reply is None or reply.done.is_set():
            return False
        return not self._closing.is_set() and generation == self._generation

    def _next_block(self, size: int) -> tuple[bytes, _Reply | None, bool]:
        """The next block (audio or silence), the reply it belongs to, and whether it ends it."""
        with self._lock:
            reply = self._reply
            if self.held_at is not None:
                return bytes(size), None, False
            if reply is None or reply.done.is_set() or not reply.pending:
                last = reply is not None and reply.ended and not reply.done.is_set()
                return bytes(size), (reply if last else None), last
            block = bytes(reply.pending[:size])
            del reply.pending[:size]
            ends = reply.ended and not reply.pending
        return block.ljust(size, b"\0"), reply, ends

    def _run(
        self, fmt: AudioFormat, generation: int, opened: concurrent.futures.Future[None]
    ) -> None:
        raise_thread("speaker")
        try:
            # Opened on this thread, after its priority was raised: a speaker command
            # inherits it, as the microphone command inherits the audio thread's. At normal
            # priority the command fell behind under load (the room's speaker, load 4-6: its
            # device ran dry 13-200 ms at a time, at replies' starts above all), and each
            # time the echo came that much later against the reference: the delay AEC3 had
            # found moved 286 → 405 ms between two replies of one stream.
            self.device.open(fmt)
        except BaseException as err:
            self._failed = err
            opened.set_exception(err)
            return
        opened.set_result(None)
        rate = fmt.rate
        block_samples = max(1, round(BLOCK_SECONDS * rate))
        size = block_samples * frame_bytes(fmt)
        primer = bytes(round(rate * PRIMER_SECONDS) * frame_bytes(fmt))
        self.device.wait_taking(primer, COMMAND_START_TIMEOUT)
        start = time.monotonic()  # when sample 0 of the timeline plays
        samples = 0
        write_s = 0.0
        try:
            while not self._closing.is_set() and generation == self._generation:
                pcm, reply, ends = self._next_block(size)
                due = start + samples / rate
                wait = due - self.lead - time.monotonic()
                if wait > 0 and self._closing.wait(wait):
                    break
                late = time.monotonic() - due
                if late > UNDERRUN_LATE:
                    # This thread came after the device had played everything written (a
                    # late wake-up, a full device): it played silence meanwhile. The
                    # timeline moves on by that much and the reference gets the same
                    # silence, so it stays the device's own; writing the missed blocks in a
                    # burst instead would turn every late wake-up into latency for good.
                    gap = round(late * rate)
                    start += gap / rate
                    due = start + samples / rate
                    if self.tap is not None:
                        self.tap.reference(bytes(gap * frame_bytes(fmt)), fmt, due - gap / rate)
                    self.underruns += 1
                    _LOGGER.debug(
                        "Speaker: %.0f ms late (the last write took %.0f ms): timeline moved",
                        late * 1000,
                        write_s * 1000,
                    )
                written = time.monotonic()
                try:
                    if self._hold_dropped:
                        raise OSError("held")
                    self.device.write(pcm)
                except OSError:
                    if not self._hold_dropped:
                        raise
                    # A hold killed the command: what it had not played goes back to the
                    # reply, and it opens anew once the reply plays on.
                    self._put_back(pcm if reply is not None else b"")
                    if not self._reopen_after_hold(fmt, generation, primer):
                        raise
                    start, samples = time.monotonic(), 0
                    continue
                write_s = time.monotonic() - written
                if reply is not None:
                    self._keep_written(due, pcm)
                if self.tap is not None:
                    # No sample plays before it is written: the reference never comes after
                    # its echo, even from a device faster than our clock (it is early by at
                    # most the lead, a delay AEC3 finds).
                    self.tap.reference(pcm, fmt, min(due, written))
                samples += block_samples
                if reply is not None:
                    if not reply.started and any(pcm):
                        reply.started = True
                        reply.first_due = due
                    if ends:
                        reply.last_due = due + block_samples / rate
                        reply.done.set()
        except OSError as err:
            if self._dropped:
                _LOGGER.debug("The speaker command was ended by a barge-in; it opens anew")
            else:
                _LOGGER.warning(
                    "Playback failed (%s); the speaker reopens with the next reply", err
                )
            self._failed = err
        except Exception as err:
            _LOGGER.exception("Playback failed")
            self._failed = err
        finally:
            if generation == self._generation:  # not a thread left behind: its device
                with self._lock:
                    if self._reply is not None:
                        self._reply.done.set()
                if self._failed is not None:
                    with contextlib.suppress(Exception):
                        self.device.close()


def _after(block: bytes, due: float, now: float, fmt: AudioFormat | None) -> bytes:
    """What of `block` (due to start playing at `due`) plays after `now`."""
    if fmt is None:
        return b""
    size = frame_bytes(fmt)
    skip = max(0, round((now - due) * fmt.rate)) * size
    return block[skip:] if skip < len(block) else b""
