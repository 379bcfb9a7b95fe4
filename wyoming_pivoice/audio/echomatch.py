"""Is what the canceller let through the reply's own echo? A normalised cross-correlation of
its output with the reference, at the echo's delay behind it.

Under load AEC3 now and then passes the echo almost whole for 100-200 ms (a "lapse": mostly
where the echo comes back after a pause in the reply, or dies away at its end), 17-31 dB over
what its measured ERLE leaves, at Silero 0.5-0.98: level and VAD cannot tell that from the
user (docs/room.md, sessions 23-24). Its shape can: the lapse is the reference, delayed and
filtered by the room, so over 192 ms it correlates with the reference at the echo's delay
(0.63 on a −6 dB/150 ms room with a 0.7 s tail, replayed from a live dump); the users' voices
talked over the same replies correlated 0.00-0.20 there, the microphone itself (voice and
echo together, nothing cancelled) 0.11-0.47.

The delay is the microphone's, found the same way against the reference while a reply plays
(`EchoMatch.delay`): the peak over 0-500 ms, the median of the last few. No delay known (a headset,
a reply too short, a room that hears no echo): no match, nothing is vetoed.
"""

from __future__ import annotations

import statistics
from collections import deque

import numpy as np

from .format import FRAME, RATE

MAX_LAG = RATE // 2  # the echo's delay behind the reference is sought up to 500 ms
DELAY_WINDOW = RATE // 2  # 500 ms of microphone against the reference before it
# Frames of audible reference between two delay estimates (500 ms): a speaker command opened
# anew after a barge-in moves the delay by a few ms, and the next reply's onset is where AEC3
# lapses most.
DELAY_EVERY = 50
DELAY_MIN_R = 0.3  # a peak under this is no echo (a user's voice, a quiet room)
DELAY_KEPT = 5  # estimates whose median is the delay
MATCH_WINDOW = 3 * 1024  # 192 ms of output
# ±32 ms about the delay: drift, a reopened command, the estimate's own lag. Live (load 5-6,
# −3 dB/250 ms) a lapse at a reply's onset matched 0.25-0.32 at ±16 ms about the delay found
# (the microphone's own echo matched 0.76-0.81 at 270.6 ms).
MATCH_SPREAD = RATE // 1000 * 32
# Whole frames (a frame never wraps the ring), enough for the longest look back.
_KEEP = -(-(DELAY_WINDOW + MAX_LAG + MATCH_SPREAD) // FRAME) * FRAME + FRAME


def normalised_xcorr(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """r[k] = <x, y[k : k + len(x)]> / (|x| |y[k : k + len(x)]|) for every k with y's slice
    whole (len(y) - len(x) + 1 values), through the FFT."""
    n, m = len(x), len(y)
    # The FFT's product is circular, but no k + i (k ≤ m − n, i < n) reaches m: m points do.
    size = 1 << int(np.ceil(np.log2(m)))
    dots = np.fft.irfft(np.fft.rfft(y, size) * np.conj(np.fft.rfft(x, size)), size)[: m - n + 1]
    squares = np.concatenate([[0.0], np.cumsum(y * y)])
    energies = squares[n:] - squares[: m - n + 1]
    # A silent stretch of y counts nothing (its energy is the cumulative sum's rounding).
    energies = np.where(energies > 1e-6 * max(float(energies.max()), 1e-30), energies, np.inf)
    return dots / np.sqrt(energies * max(float(np.dot(x, x)), 1e-30))


class EchoMatch:
    """The last moments of microphone, reference and output, frame-aligned as the canceller
    took them; the echo's delay from them; and how much the output looks like the echo."""

    def __init__(self) -> None:
        # Mirrored rings: each frame is written twice, so the last n samples are contiguous.
        self._mic = np.zeros(2 * _KEEP)
        self._ref = np.zeros(2 * _KEEP)
        self._out = np.zeros(2 * _KEEP)
        self._at = 0  # where the next frame goes
        self._filled = 0
        self._audible = 0  # audible frames since the last delay estimate
        self._lags: deque[int] = deque(maxlen=DELAY_KEPT)
        # The echo's delay behind the reference in samples, the median of the last lags
        # (kept here: it is read every frame, and changes only every DELAY_EVERY); None: not
        # found yet.
        self.delay: int | None = None

    def frame(self, mic: np.ndarray, ref: np.ndarray, out: np.ndarray, audible: bool) -> int | None:
        """One 10 ms frame (int16 or float, any scale, the same for all three); the delay
        when this frame gave a new estimate of it, else None."""
        at = self._at
        for ring, samples in ((self._mic, mic), (self._ref, ref), (self._out, out)):
            ring[at : at + FRAME] = samples
            ring[at + _KEEP : at + _KEEP + FRAME] = samples
        self._at = (at + FRAME) % _KEEP
        self._filled = min(_KEEP, self._filled + FRAME)
        if audible:
            self._audible += 1
            if self._audible >= DELAY_EVERY and self._filled >= DELAY_WINDOW + MAX_LAG:
                self._audible = 0
                return self._estimate_delay()
        return None

    def _last(self, ring: np.ndarray, n: int, before: int = 0) -> np.ndarray:
        end = self._at + _KEEP - before
        return ring[end - n : end]

    def _estimate_delay(self) -> int | None:
        mic = self._last(self._mic, DELAY_WINDOW)
        ref = self._last(self._ref, DELAY_WINDOW + MAX_LAG)
        r = normalised_xcorr(mic, ref)  # r[k]: the reference MAX_LAG - k samples earlier
        k = int(np.argmax(r))
        if r[k] < DELAY_MIN_R:
            return None
        self._lags.append(MAX_LAG - k)
        if len(self._lags) >= 2:
            self.delay = round(statistics.median(self._lags))
        return self.delay

    def match(self) -> float | None:
        """The output's last 192 ms against the reference at the echo's delay (± 32 ms):
        the highest normalised correlation, 0-1; None where no delay is known."""
        delay = self.delay
        if delay is None or self._filled < MATCH_WINDOW + delay + MATCH_SPREAD:
            return None
        out = self._last(self._out, MATCH_WINDOW)
        if not np.any(out):
            return 0.0
        lo = max(0, delay - MATCH_SPREAD)
        ref = self._last(self._ref, MATCH_WINDOW + delay + MATCH_SPREAD - lo, before=lo)
        return round(float(np.max(np.abs(normalised_xcorr(out, ref)))), 2)
