"""A room between the satellite's speaker and microphone commands, at real-time pace.

The room ticks every 32 ms. Each tick the speaker plays 512 samples (16 kHz) of what its
commands handed it, the echo path turns that into what reaches the microphone, the
scripted user's voice and the noise floor are added, and the block goes to every
microphone command. The speaker takes audio only while its device buffer has room, so a
speaker command is held back the way a sound card holds back `aplay`, and plays no sample
before its command handed it over (silence where it ran dry); when a speaker
command's input ends, the room plays what it holds, then lets the command exit; when a
speaker command is killed, the sound stops at once (within a tick), as a device's does.

A reply is a run of sound: it starts with a sound (after REPLY_GAP_S of silence, or from a
new speaker command) and ends with its last sound once REPLY_GAP_S of silence follow, or
when its command is killed. So a speaker command may play one reply (opened per reply) or
many (a stream kept open, silence between them).

Scripted speech (`Say`) starts at a time after the microphone opened, or a number of
milliseconds after the speaker first makes a sound in a given reply (a user talking over
it), or after a reply has ended. Every reply and every utterance is logged with its
times, so a test or the bench can tell what happened when.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import struct
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio import AUDIO_RT_PRIORITY, Pacer

from .acoustics import RATE, EchoPath, NoiseFloor, RoomAcoustics, SpeakerPath
from .client import HEADER, HEADER_BYTES

_LOGGER = logging.getLogger(__name__)

BLOCK = 512  # one tick: 32 ms, one VAD frame
BLOCK_SECONDS = BLOCK / RATE
SPEAKER_BUFFER_S = 0.06  # the speaker's device buffer
SOUND_RMS = 10 ** (-60 / 20)  # a block louder than −60 dBFS makes a sound
MIC_BACKLOG_S = 2.0  # a microphone reader further behind than this is dropped
# Silence this long ends a reply: Piper's pauses between sentences are ~0.2-0.3 s, but a
# phrase synthesized late under load leaves a gap inside a reply (0.8 s split replies at
# load 12); the bench asks its next question once a reply has ended.
REPLY_GAP_S = 1.5
# A reply held by the satellite comes back within its hold (0.8-1.1 s) and a command's start;
# the answer to a barge-in takes the rest of the user's words, an endpoint and a turn (≥ 2 s).
RESUME_S = 2.0
# Recordings keep at most this much (then stop growing): 10 min at 16 kHz is 38 MB of float32
# a stream, and a bench room runs ≤ 6 min.
RECORD_LIMIT_S = 600.0


def _raise_priority() -> tuple[int, int] | None:
    """This thread to real-time round-robin (where permitted); returns what to restore."""
    try:
        old = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(AUDIO_RT_PRIORITY))
        return old
    except (AttributeError, OSError):
        return None


def _restore_priority(old: tuple[int, int] | None) -> None:
    if old is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, old[0], os.sched_param(old[1]))


@dataclass
class Say:
    """Something the user says, and when."""

    text: str
    audio: np.ndarray  # float32, 16 kHz mono
    at: float | None = None  # seconds after the microphone opened
    reply: int | None = None  # …or during/after reply N (1-based, in the order they play)
    after_ms: float = 0.0  # this long after that reply first makes a sound (or ends)
    after_end: bool = False  # count after_ms from the reply's end instead
    gain_db: float = 0.0
    onset: float | None = None  # monotonic time the voice started (set by the room)

    @property
    def seconds(self) -> float:
        return len(self.audio) / RATE


@dataclass
class Reply:
    """One reply of the satellite: a run of sound from one speaker command."""

    number: int
    fmt: AudioFormat
    opened: float  # its first sound (or its command's start, for a command's first reply)
    first_sound: float | None = None
    last_sound: float | None = None
    closed: float | None = None  # it ended: its silence began, or its command ended
    killed: bool = False  # its command died while it played
    ended: float | None = None  # the room played the last of it
    seconds: float = 0.0  # audio played (sound and the pauses inside it)
    # Times it went on after its command was killed: a reply the satellite held (a voice
    # over it, maybe) and played on through a command opened anew is still this reply.
    resumed: int = 0


@dataclass
class _Speaker:
    """One speaker command's connection: its device buffer."""

    fmt: AudioFormat
    opened: float
    closed: bool = False
    killed: bool = False
    reply: Reply | None = None  # the reply it plays now
    quiet_s: float = 0.0  # silence since its last sound
    done_at: float | None = None
    playing: bool = False  # it has played its first sample
    _fifo: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    # The same audio as handed over (16 kHz, before the speaker's clock and distortion),
    # taken in step with _fifo: the reference placed by hand where it played.
    _source: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    # [monotonic time its command handed it over, samples left] for each piece in _fifo
    _arrivals: deque[list[float]] = field(default_factory=deque)
    _space: asyncio.Event = field(default_factory=asyncio.Event)
    _done: asyncio.Event = field(default_factory=asyncio.Event)


class Room:
    """Run with `async with Room(...) as room:`; hand the satellite `room.mic_command` and
    `room.speaker_command`."""

    def __init__(
        self,
        acoustics: RoomAcoustics | None = None,
        script: list[Say] | None = None,
        folder: str | Path | None = None,
        speaker_buffer_s: float = SPEAKER_BUFFER_S,
        record: bool = False,
    ) -> None:
        self.acoustics = acoustics = acoustics or RoomAcoustics()
        self.script = list(script or [])
        self.speaker_buffer = round(speaker_buffer_s * RATE)
        self.record = record
        self._tmp = None
        if folder is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pivoice-room-")
            folder = self._tmp.name
        folder = Path(folder)
        self.mic_path = folder / "mic.sock"
        self.speaker_path = folder / "speaker.sock"
        self.replies: list[Reply] = []
        # (room time, samples): ticks where an open speaker had less than a block to play
        # (its command came late): the device ran dry and played that much silence.
        self.underruns: list[tuple[float, int]] = []
        self._speakers: list[_Speaker] = []
        self.mic_opened: float | None = None  # room time of the first block a mic got
        # With `record`, from the microphone's first block, one block per tick: the echo, the
        # user's voice, what the microphone got, and `source` — what the speakers played as
        # their commands handed it over (16 kHz, before the speaker's own clock, high-pass and
        # clipping; silence where nothing played): the satellite's reference, aligned by hand.
        self.recordings: dict[str, list[np.ndarray]] = {
            "echo": [], "voice": [], "mic": [], "source": []
        }  # fmt: skip
        self._echo = EchoPath(acoustics)
        self._noise = NoiseFloor(acoustics.noise_dbfs, acoustics.seed)
        self._mics: list[asyncio.StreamWriter] = []
        self._voices: list[tuple[Say, int]] = []  # (utterance, samples already said)
        self._servers: list[asyncio.AbstractServer] = []
        self._ticker: asyncio.Task[None] | None = None
        self._tick = asyncio.Condition()
        self.now = time.monotonic()
        self._recorded = 0.0  # seconds in the recordings

    # ---- commands for the satellite ------------------------------------------------------

    @property
    def _client(self) -> str:
        return f"{sys.executable} -m pivoice_lab.room.client"

    @property
    def mic_command(self) -> str:
        return f"exec {self._client} mic {self.mic_path}"

    @property
    def speaker_command(self) -> str:
        return f"exec {self._client} speaker {self.speaker_path} {{rate}} {{width}} {{channels}}"

    # ---- life ---------------------------------------------------------------------------

    async def __aenter__(self) -> Room:
        self._servers = [
            await asyncio.start_unix_server(self._on_mic, path=str(self.mic_path)),
            await asyncio.start_unix_server(self._on_speaker, path=str(self.speaker_path)),
        ]
        self._ticker = asyncio.create_task(self._run(), name="room")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for server in self._servers:
            server.close()
        for writer in self._mics:
            writer.close()
        for speaker in self._speakers:
            speaker._done.set()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait (in room time, tick by tick) until `condition()`; False on timeout."""
        with contextlib.suppress(asyncio.TimeoutError):
            async with self._tick:
                await asyncio.wait_for(self._tick.wait_for(condition), timeout)
            return True
        return False

    # ---- connections ----------------------------------------------------------------------

    async def _on_mic(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        self._mics.append(writer)

    async def _on_speaker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        header = (await reader.readline()).decode().split()
        try:
            fmt = AudioFormat(*(int(value) for value in header[1:4]))
        except (TypeError, ValueError):
            writer.close()
            return
        speaker = _Speaker(fmt, self.now)
        self._speakers.append(speaker)
        converter = SpeakerPath(fmt, self.acoustics)
        speaker._space.set()
        try:
            while True:
                await speaker._space.wait()
                sent, size = struct.unpack(HEADER, await reader.readexactly(HEADER_BYTES))
                if not size:  # the command's input ended: play out what it handed over
                    self._hand_over(speaker, sent, *converter.flush_with_source())
                    break
                data = await reader.readexactly(size)
                self._hand_over(speaker, sent, *converter.convert_with_source(data))
                if len(speaker._fifo) >= self.speaker_buffer:
                    speaker._space.clear()
        except (ConnectionError, asyncio.IncompleteReadError):
            # The command died (killed on barge-in): the device stops, its buffer is lost.
            speaker._fifo = speaker._fifo[:0]
            speaker._source = speaker._source[:0]
            speaker._arrivals.clear()
            speaker.killed = True
        speaker.closed = True
        await speaker._done.wait()  # the room played the rest
        with contextlib.suppress(ConnectionError):
            writer.close()
            await writer.wait_closed()

    @staticmethod
    def _hand_over(speaker: _Speaker, sent: float, source: np.ndarray, played: np.ndarray) -> None:
        speaker._fifo = np.concatenate([speaker._fifo, played])
        speaker._source = np.concatenate([speaker._source, source])
        if len(played):
            speaker._arrivals.append([sent, len(played)])

    def _take(self, speaker: _Speaker) -> tuple[np.ndarray, np.ndarray, int, int]:
        """What `speaker` plays in this tick's block, [now − BLOCK, now]: each sample no sooner
        than its command handed it over (as a device plays nothing before it is written), and
        silence where the next has not come yet (the device ran dry). Returns the block, the
        source in step with it, the samples taken, and where the last one lies in the block.

        Taking the whole block from what had come by the tick's end played audio up to 32 ms
        before it was written: a new stream started up to 22 ms ahead of the satellite's due
        times, its 40 ms lead then covered 18 ms of lateness, and each shortfall (13-44 ms at
        every speaker command's start, load 4-12) was silence the reference did not have."""
        played = np.zeros(BLOCK, dtype=np.float32)
        source = np.zeros(BLOCK, dtype=np.float32)
        begin = self.now - BLOCK_SECONDS
        pos = taken = 0
        while pos < BLOCK and speaker._arrivals:
            arrival = speaker._arrivals[0]
            pos = max(pos, math.ceil((arrival[0] - begin) * RATE))
            n = min(int(arrival[1]), BLOCK - pos)
            if n <= 0:
                break
            played[pos : pos + n] = speaker._fifo[taken : taken + n]
            given = speaker._source[taken : taken + n]
            source[pos : pos + len(given)] = given
            pos += n
            taken += n
            arrival[1] -= n
            if not arrival[1]:
                speaker._arrivals.popleft()
        speaker._fifo = speaker._fifo[taken:]
        speaker._source = speaker._source[taken:]
        return played, source, taken, pos if taken else 0

    # ---- the clock --------------------------------------------------------------------------

    async def _run(self) -> None:
        # A tick plays the block that has just gone by, on a fixed timeline: a late tick
        # catches up rather than shifting the room's time. The room stands in for hardware
        # (a sound card's clock does not wait for the CPU): it runs at the audio threads'
        # priority where permitted, and between catch-up ticks the speakers' commands get
        # to refill their device buffers, so the room's own lateness is no underrun.
        policy = _raise_priority()
        pacer = Pacer(lead=-BLOCK_SECONDS, late=None)
        try:
            while True:
                self.now = await pacer.advance(BLOCK_SECONDS) + BLOCK_SECONDS
                self._step()
                async with self._tick:
                    self._tick.notify_all()
                await asyncio.sleep(0)
        finally:
            _restore_priority(policy)

    def _step(self) -> None:
        if self.mic_opened is None and self._mics:
            self.mic_opened = self.now  # this tick's block is the microphone's first
        played = np.zeros(BLOCK, dtype=np.float32)
        source = np.zeros(BLOCK, dtype=np.float32)
        for speaker in self._speakers:
            if speaker.done_at is not None:
                continue
            # The source in step with what played, sample for sample: the speaker's start
            # and every silence the device inserted (run dry) stay where they played; its
            # drift (±100 ppm) is left in, as the satellite's reference has it.
            block, given, taken, end = self._take(speaker)
            played += block
            source += given
            if speaker.playing and not speaker.closed and taken < BLOCK:
                self.underruns.append((self.now, BLOCK - taken))
            speaker.playing = speaker.playing or bool(taken)  # it starts mid-block
            self._follow(speaker, block[:end])
            if len(speaker._fifo) < self.speaker_buffer:
                speaker._space.set()
            if speaker.closed and not len(speaker._fifo):
                self._end_reply(speaker, killed=speaker.killed)
                speaker.done_at = self.now
                speaker._done.set()
        echo = self._echo.process(played)
        voice = self._voice_block()
        mic = echo + voice + self._noise.block(BLOCK)
        if self.record and self.mic_opened is not None and self._recorded < RECORD_LIMIT_S:
            for name, block in (("echo", echo), ("voice", voice), ("mic", mic), ("source", source)):
                self.recordings[name].append(block)
            self._recorded += BLOCK_SECONDS
        pcm = (np.clip(mic, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
        for writer in list(self._mics):
            if writer.is_closing() or writer.transport.get_write_buffer_size() > (
                MIC_BACKLOG_S * RATE * 2
            ):
                self._mics.remove(writer)
                writer.close()
                continue
            writer.write(pcm)

    def _follow(self, speaker: _Speaker, take: np.ndarray) -> None:
        """Replies as runs of sound in what `speaker` played this tick."""
        sound = len(take) and float(np.sqrt(np.mean(take * take))) > SOUND_RMS
        reply = speaker.reply
        if sound:
            if reply is None:
                reply = self._resumed()
                if reply is None:
                    reply = Reply(len(self.replies) + 1, speaker.fmt, self.now)
                    reply.first_sound = self.now
                    self.replies.append(reply)
                speaker.reply = reply
            reply.last_sound = self.now
            speaker.quiet_s = 0.0
        elif reply is not None:
            speaker.quiet_s += BLOCK_SECONDS
            if speaker.quiet_s >= REPLY_GAP_S:
                self._end_reply(speaker, gap=True)
                return
        if speaker.reply is not None:
            speaker.reply.seconds += len(take) / RATE

    def _resumed(self) -> Reply | None:
        """The last reply, if its command was killed no longer than RESUME_S ago: a new
        command's sound then is that reply held and played on (a barge-in's answer comes
        later: the user's words, their endpoint and the server's turn)."""
        last = self.replies[-1] if self.replies else None
        if last is None or not last.killed or last.ended is None:
            return None
        if self.now - last.ended > RESUME_S:
            return None
        last.killed, last.ended, last.closed = False, None, None
        last.resumed += 1
        return last

    def _end_reply(self, speaker: _Speaker, killed: bool = False, gap: bool = False) -> None:
        reply, speaker.reply = speaker.reply, None
        if reply is None:
            return
        assert reply.last_sound is not None
        if gap:  # the silence that ended it is not its own
            reply.seconds -= speaker.quiet_s
        reply.ended = reply.closed = self.now if killed else reply.last_sound + BLOCK_SECONDS
        reply.killed = killed

    def _voice_block(self) -> np.ndarray:
        for say in self.script:
            if say.onset is None and self._due(say):
                say.onset = self.now
                self._voices.append((say, 0))
                _LOGGER.info("Room: the user says %r", say.text)
        block = np.zeros(BLOCK, dtype=np.float32)
        voices = []
        for say, done in self._voices:
            piece = say.audio[done : done + BLOCK] * 10 ** (say.gain_db / 20)
            block[: len(piece)] += piece
            if done + BLOCK < len(say.audio):
                voices.append((say, done + BLOCK))
        self._voices = voices
        return block

    def _due(self, say: Say) -> bool:
        if self.mic_opened is None:
            return False
        if say.at is not None:
            return self.now >= self.mic_opened + say.at
        if say.reply is None or len(self.replies) < say.reply:
            return False
        reply = self.replies[say.reply - 1]
        anchor = reply.ended if say.after_end else reply.first_sound
        return anchor is not None and self.now >= anchor + say.after_ms / 1000

    # ---- what happened -----------------------------------------------------------------

    @property
    def recorded_from(self) -> float | None:
        """Room time of the recordings' first sample (a tick's block is the 32 ms before it)."""
        return None if self.mic_opened is None else self.mic_opened - BLOCK_SECONDS

    def mic_index(self, when: float) -> int:
        """The sample of the microphone stream (and of the recordings) at room time `when`."""
        assert self.mic_opened is not None
        return round((when - self.mic_opened) * RATE)

    @property
    def cuts(self) -> list[float]:
        """Room times the speaker stopped because its command was killed (a barge-in)."""
        return [s.done_at for s in self._speakers if s.killed and s.done_at is not None]

    def recording(self, name: str) -> np.ndarray:
        blocks = self.recordings[name]
        return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)

    @property
    def quiet_since(self) -> float | None:
        """Since when neither a reply nor the user has made a sound (None while one does)."""
        if self.mic_opened is None or any(reply.ended is None for reply in self.replies):
            return None
        ends = [reply.ended for reply in self.replies if reply.ended is not None]
        for say in self.script:
            if say.onset is not None:
                ends.append(say.onset + say.seconds)
        return max([self.mic_opened, *ends])

    def user_done(self) -> bool:
        """Everything in the script has been said."""
        return all(
            say.onset is not None and self.now >= say.onset + say.seconds for say in self.script
        )
