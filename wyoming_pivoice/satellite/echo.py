"""Echo cancellation on the capture path: WebRTC's AEC3 (livekit's AudioProcessingModule).

The satellite plays every sample itself, so it holds the exact reference. Both streams
are placed on one 16 kHz timeline of monotonic time:
- the sink reports each piece it hands the speaker with the time that piece is due to
  play (`reference`); pieces of one reply are laid end to end, a gap is silence;
- the capture path (`process`) takes each microphone chunk with the time it was read,
  and for every 10 ms capture frame first feeds AEC3 the reference frame of the same
  instant, then the capture frame.

So AEC3 gets exactly one render frame per capture frame, in real-time order (no bursts
that would overrun its render buffer), and the reference never comes later than its echo:
a piece is due no later than it really plays, and a chunk is read no sooner than it was
captured. What is left — the device's buffering, the room's acoustic delay — is a
positive delay, which AEC3's delay estimator finds (measured here: 400 ms, not 500 ms).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from wyoming.audio import AudioFormat

from ..audio import StreamingConverter
from .endpoint import Hearing
from .settings import EchoSettings

if TYPE_CHECKING:
    from livekit import rtc

    from .endpoint import Endpointer
    from .protocols import AudioSink, AudioSource

_LOGGER = logging.getLogger(__name__)

RATE = 16000
FRAME = RATE // 100  # AEC3 takes 10 ms frames
# A piece due within this of the previous piece's end continues it (timing jitter);
# later than that, the gap between them is silence.
JOIN_SECONDS = 0.05
KEEP_SECONDS = 2.0  # reference history kept behind the capture position
CAPTURE_WINDOW_SECONDS = 5.0  # see CaptureClock
# After the reference falls silent, its echo may still arrive for this long
# (the device's buffer, the acoustic delay, the room's tail).
ECHO_TAIL_SECONDS = 0.8
# Each reply opens the speaker anew, so its echo's delay differs a little from the last
# one's: AEC3 leaks for ~100 ms while it finds it (measured: −20 dBFS residual, Silero at
# 0.94-0.99 for 250 ms). A reply's first 0.6 s starts no speech.
SETTLING_SECONDS = 0.6
SILENT_RMS = 1e-4  # a reference frame quieter than this (−80 dBFS) plays no echo


def load_apm(settings: EchoSettings) -> rtc.AudioProcessingModule:
    """A WebRTC AudioProcessingModule; ImportError/OSError when livekit cannot load here."""
    from livekit import rtc

    return rtc.AudioProcessingModule(
        echo_cancellation=settings.echo_cancellation,
        noise_suppression=settings.noise_suppression,
        high_pass_filter=settings.high_pass_filter,
        auto_gain_control=settings.auto_gain_control,
    )


@dataclass
class EchoStats:
    """Microphone energy while the reference played, before and after cancelling."""

    seconds: float = 0.0
    energy_in: float = 0.0
    energy_out: float = 0.0

    @staticmethod
    def _dbfs(energy: float, samples: float) -> float | None:
        if samples <= 0:
            return None
        return round(10 * math.log10(max(energy / samples, 1e-12)), 1)

    @property
    def in_dbfs(self) -> float | None:
        return self._dbfs(self.energy_in, self.seconds * RATE)

    @property
    def out_dbfs(self) -> float | None:
        return self._dbfs(self.energy_out, self.seconds * RATE)

    def as_dict(self) -> dict[str, float | None]:
        return {
            "seconds": round(self.seconds, 2),
            "in_dbfs": self.in_dbfs,
            "out_dbfs": self.out_dbfs,
            "erle_db": self.erle_db,
        }

    @property
    def erle_db(self) -> float | None:
        """Echo return loss enhancement: how far cancelling took the level down."""
        if self.seconds <= 0:
            return None
        return round(10 * math.log10(max(self.energy_in, 1e-12) / max(self.energy_out, 1e-12)), 1)


@dataclass
class _Reference:
    """The played audio on the timeline: `samples[0]` is timeline index `start`."""

    start: int = 0
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    converter: StreamingConverter | None = None
    fmt: AudioFormat | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.samples)


class CaptureClock:
    """Where each microphone chunk lies on the timeline.

    A chunk is read at or after its capture, later whenever the reader falls behind, so
    its capture is placed at the sample count plus the smallest read-minus-count offset
    seen over the last CAPTURE_WINDOW_SECONDS: a backlog never makes audio look later than
    it was (the reference would then come after its echo), and after a gap (a mic that
    restarted) the old offset is forgotten within the window.
    """

    def __init__(self) -> None:
        self.count = 0
        self._offsets: deque[tuple[int, int]] = deque()  # (count, offset), offsets rising

    def first_sample(self, read_index: int, samples: int) -> int:
        """The timeline index of the first sample of a chunk read at `read_index`."""
        offset = read_index - samples - self.count
        while self._offsets and self._offsets[-1][1] >= offset:
            self._offsets.pop()
        self._offsets.append((self.count, offset))
        while self._offsets[0][0] < self.count - CAPTURE_WINDOW_SECONDS * RATE:
            self._offsets.popleft()
        first = self.count + self._offsets[0][1]
        self.count += samples
        return first


class EchoCanceller:
    """AEC3 between what the satellite plays and what its microphone hears.

    `reference` and `process` are called from the event loop (the sink's writer and the
    listener); each 10 ms frame costs AEC3 about 0.2 ms here, so there is no thread hop.
    """

    def __init__(self, settings: EchoSettings) -> None:
        self.settings = settings
        self._apm = load_apm(settings)
        self._origin: float | None = None  # monotonic time of timeline index 0
        self._ref = _Reference()
        self._capture = CaptureClock()
        self._capture_index: int | None = None  # timeline index of the next capture frame
        self._pending = np.zeros(0, dtype=np.int16)  # capture samples short of a frame
        # Output lags input by one frame (10 ms) so every chunk comes back whole.
        self._out = np.zeros(FRAME, dtype=np.int16)
        self._last_echo_index = -(10**9)  # timeline index of the last audible reference frame
        self._settled_index = 0  # the reply that started last has settled from here on
        self.stats = EchoStats()

    # ---- the timeline -----------------------------------------------------------------

    def _index(self, when: float) -> int:
        if self._origin is None:
            self._origin = when
        return round((when - self._origin) * RATE)

    # ---- what plays ---------------------------------------------------------------------

    def reference(self, pcm: bytes, fmt: AudioFormat, due: float) -> None:
        """`pcm` (in `fmt`) is due to start playing at monotonic time `due`."""
        index = self._index(due)
        ref = self._ref

        if ref.fmt != fmt or index > ref.end + JOIN_SECONDS * RATE:
            ref.converter = StreamingConverter(fmt, RATE)  # a new reply: a new stream
            ref.fmt = fmt
            # Nothing plays in the past: a reply whose first piece is reported after the
            # microphone moved on starts no earlier than what the mic reads now.
            if self._capture_index is not None:
                index = max(index, self._capture_index)
        assert ref.converter is not None
        samples = ref.converter.convert(pcm)
        if index > ref.end + JOIN_SECONDS * RATE:
            gap = np.zeros(index - ref.end, dtype=np.float32)
            ref.samples = np.concatenate([ref.samples, gap, samples])
            self._settled_index = index + round(SETTLING_SECONDS * RATE)
        else:
            ref.samples = np.concatenate([ref.samples, samples])

    def cut(self, at: float) -> None:
        """The reply stopped at monotonic `at` (a barge-in): what was handed over for later
        never plays, and AEC3 starts afresh. Its filter has just adapted through the user's
        voice over the reply; measured in the room, the next reply then leaked for over
        0.6 s (a self-made turn in 1 of 4 runs), where a fresh AEC3 settles within its first
        0.1-0.3 s as it does on the first reply."""
        ref, index = self._ref, self._index(at)
        if index < ref.end:
            ref.samples = ref.samples[: max(0, index - ref.start)]
        self._apm = load_apm(self.settings)

    def _reference_frame(self, index: int) -> np.ndarray:
        ref = self._ref
        frame = np.zeros(FRAME, dtype=np.float32)
        lo, hi = max(index, ref.start), min(index + FRAME, ref.end)
        if lo < hi:
            frame[lo - index : hi - index] = ref.samples[lo - ref.start : hi - ref.start]
        # Forget what lies well behind the capture position.
        drop = index - KEEP_SECONDS * RATE - ref.start
        if drop > RATE:
            drop = int(min(drop, len(ref.samples)))
            ref.samples = ref.samples[drop:]
            ref.start += drop
        return frame

    # ---- what the microphone hears --------------------------------------------------------

    def process(self, chunk: bytes, captured: float) -> bytes:
        """One mic chunk (16 kHz mono s16le) read at monotonic `captured` → the same length,
        echo removed."""
        from livekit.rtc import AudioFrame

        samples = np.frombuffer(chunk, dtype="<i2")
        first = self._capture.first_sample(self._index(captured), len(samples))
        self._capture_index = first - len(self._pending)  # the next frame starts there
        pending = np.concatenate([self._pending, samples])
        outputs = [self._out]
        used = 0
        while len(pending) - used >= FRAME:
            ref = self._reference_frame(self._capture_index)
            audible = float(np.sqrt(np.mean(ref * ref))) > SILENT_RMS
            if audible:
                self._last_echo_index = self._capture_index
            render = AudioFrame(_to_pcm16(ref), RATE, 1, FRAME)
            self._apm.process_reverse_stream(render)
            if self.settings.echo_cancellation:
                self._apm.set_stream_delay_ms(0)
            near = pending[used : used + FRAME]
            capture = AudioFrame(near.tobytes(), RATE, 1, FRAME)
            self._apm.process_stream(capture)
            out = np.frombuffer(capture.data, dtype=np.int16).copy()
            if audible:
                self._count(near, out)
            # AEC3 always sees the stream (its state stays continuous); outside echo its
            # output is not used, so speech outside replies reaches the VAD as captured.
            echo = self.hearing is not Hearing.CLEAR
            outputs.append(out if echo or self.settings.always_process else near)
            used += FRAME
            self._capture_index += FRAME
        self._pending = pending[used:].copy()
        out_all = np.concatenate(outputs)
        self._out = out_all[len(samples) :].copy()
        return out_all[: len(samples)].astype("<i2").tobytes()

    def _count(self, near: np.ndarray, out: np.ndarray) -> None:
        scale = 1.0 / (32768.0 * 32768.0)
        self.stats.seconds += FRAME / RATE
        self.stats.energy_in += float(np.sum(near.astype(np.float64) ** 2)) * scale
        self.stats.energy_out += float(np.sum(out.astype(np.float64) ** 2)) * scale

    def take_stats(self) -> EchoStats:
        stats, self.stats = self.stats, EchoStats()
        return stats

    @property
    def hearing(self) -> Hearing:
        """What the microphone may be hearing now besides the user."""
        index = self._capture_index
        if index is None or index - self._last_echo_index > ECHO_TAIL_SECONDS * RATE:
            return Hearing.CLEAR
        return Hearing.SETTLING if index < self._settled_index else Hearing.ECHO


def _to_pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16).tobytes()


def open_canceller(settings: EchoSettings) -> EchoCanceller | None:
    """The canceller the settings ask for, or None (off, or livekit cannot load here)."""
    if not settings.active:
        return None
    try:
        return EchoCanceller(settings)
    except (ImportError, OSError, RuntimeError) as err:
        _LOGGER.error(
            "Echo cancellation is unavailable (%s): the microphone will hear the speaker", err
        )
        return None


def cancel_echo(
    source: AudioSource, sink: AudioSink, endpointer: Endpointer, canceller: EchoCanceller | None
) -> AudioSource:
    """Put the canceller between `sink` (its reference) and `source`, and tell `endpointer`
    when echo may be heard; returns the source to read from."""
    if canceller is None:
        return source
    sink.tap = canceller
    endpointer.hearing = lambda: canceller.hearing
    return EchoCancelledSource(source, canceller)


class EchoCancelledSource:
    """An AudioSource whose chunks come out of the echo canceller."""

    def __init__(self, source: AudioSource, canceller: EchoCanceller) -> None:
        self.source = source
        self.canceller = canceller
        self.chunk_time: float | None = None

    async def open(self) -> None:
        await self.source.open()

    async def read(self) -> bytes | None:
        chunk = await self.source.read()
        if chunk is None:
            return None
        self.chunk_time = getattr(self.source, "chunk_time", None) or time.monotonic()
        return self.canceller.process(chunk, self.chunk_time)

    async def close(self) -> None:
        await self.source.close()
