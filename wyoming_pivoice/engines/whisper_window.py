"""A Whisper encoder window fitted to the utterance instead of a fixed 30 s.

Whisper pads every input to 30 s of mel frames before the encoder. For a 2 s voice command,
most of the encoder's work (≈ 340 of ≈ 430 ms for tiny.en on 2 cores) is spent on padding.
CTranslate2 accepts shorter inputs; faster-whisper does not offer it (its `chunk_length`
still pads to 3000 frames in `pad_or_trim`), so we swap that one function in
`faster_whisper.transcribe` for a thread-aware version.

The window is the utterance plus 1 s, never below `min_s`: windows fitted tightly to the
audio make tiny.en repeat itself, while from 10 s up the word error rate matched the 30 s
window on 106 utterances (espeak-ng and Piper voices, 1.4–7.5 s) and on 12–41 s passages.
Below 10 s it falls apart (120 utterances, 10/8/6/4 s minimum: WER 0.27/0.52/1.37/1.95,
loops 2/5/9/13) for 134/122/105/86 ms, so 10 s it is.
Frames are only ever padded less, never trimmed beyond what the original trims: audio
longer than the window keeps Whisper's own 30 s seeking.

Audio cut tightly after the speech, as the satellite's endpoint cuts it (≤ 0.25 s after the
voice), goes to the fitted window as it is. Audio that goes on in silence after the speech
(a WAV file, Home Assistant's own endpointing) first has its quiet tail cut to KEEP_TAIL_S
(10 ms frames 30 dB below the loudest), then takes the fitted window too. Session 7 sent it
to Whisper's 30 s window instead, from 59 clips (64-68 errors against 75, single sampled
runs); on 175 clips (the same texts in 3 voices each) over 3 seeded rounds that rule made
257-262 errors of 1103 words, the fitted window 223-231, the cut tail + fitted window
220-223, the satellite's own cut 213-219 (docs/asr.md), at a fifth of the compute.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import faster_whisper.transcribe as _transcribe
import numpy as np
from faster_whisper.audio import pad_or_trim as _original_pad_or_trim

FRAMES_PER_S = 100  # Whisper's mel hop is 10 ms
FULL_WINDOW_S = 30
MARGIN_S = 1.0
QUIET_DB = 30.0  # a 10 ms frame this far below the loudest one is quiet
# The satellite's audio ends 0.06-0.22 s after the voice by this measure (its endpoint keeps
# 64 ms of pad); whole clips and Home Assistant's audio end in ≥ 0.7 s of silence.
TIGHT_TAIL_S = 0.5
KEEP_TAIL_S = 0.064  # a longer quiet tail is cut to this: the satellite's trailing pad

_local = threading.local()


def window_frames(audio_s: float, min_s: float) -> int:
    """Mel frames for the encoder: the audio plus a margin, within [min_s, 30 s]."""
    seconds = max(min_s, math.ceil(audio_s + MARGIN_S))
    return int(min(FULL_WINDOW_S, seconds) * FRAMES_PER_S)


def quiet_tail_s(audio: np.ndarray, rate: int = 16000) -> float:
    """Seconds of quiet at the end of the audio (after its last frame within QUIET_DB of the
    loudest); all of it when nothing is louder than digital silence."""
    frame = rate // FRAMES_PER_S
    count = audio.size // frame
    if count == 0:
        return audio.size / rate
    frames = audio[: count * frame].reshape(count, frame).astype(np.float64)
    rms = np.sqrt(np.mean(frames * frames, axis=1))
    peak = float(rms.max())
    if peak <= 0.0:
        return audio.size / rate
    loud = np.flatnonzero(rms > peak * 10 ** (-QUIET_DB / 20))
    return (audio.size - (int(loud[-1]) + 1) * frame) / rate


def cut_quiet_tail(audio: np.ndarray, keep_s: float, rate: int = 16000) -> np.ndarray:
    """The audio with its quiet tail shortened to at most keep_s."""
    excess = quiet_tail_s(audio, rate) - keep_s
    return audio[: audio.size - int(excess * rate)] if excess > 0 else audio


def fitted_frames(
    audio: np.ndarray, min_s: float, max_tail_s: float = TIGHT_TAIL_S, rate: int = 16000
) -> int | None:
    """The encoder window for this audio: fitted (window_frames) when it is cut tightly after
    the speech, None (Whisper's 30 s) when its quiet tail is longer than max_tail_s or min_s
    is 30."""
    if min_s >= FULL_WINDOW_S or quiet_tail_s(audio, rate) > max_tail_s:
        return None
    return window_frames(audio.size / rate, min_s)


def _pad_or_trim(array, length: int = FULL_WINDOW_S * FRAMES_PER_S, *, axis: int = -1):
    frames = getattr(_local, "frames", None)
    if frames is not None and length == FULL_WINDOW_S * FRAMES_PER_S:
        # Never cut audio the 30 s window would have kept.
        length = min(length, max(frames, array.shape[axis]))
    return _original_pad_or_trim(array, length, axis=axis)


_transcribe.pad_or_trim = _pad_or_trim


@contextmanager
def encoder_window(frames: int | None) -> Iterator[None]:
    """Within this block, on this thread, faster-whisper pads to `frames` (None: 30 s).

    faster-whisper decodes lazily, so the block must span the iteration over segments,
    and that iteration must stay on one thread (iterate_in_thread does).
    """
    previous = getattr(_local, "frames", None)
    _local.frames = frames
    try:
        yield
    finally:
        _local.frames = previous
