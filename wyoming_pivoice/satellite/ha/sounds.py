"""Sounds the satellite makes itself, synthesized at start-up (no audio file ships)."""

from __future__ import annotations

import numpy as np
from wyoming.audio import AudioFormat

RING_RATE = 22050


def ring_tone(rate: int = RING_RATE) -> tuple[bytes, AudioFormat]:
    """A finished timer's ring: two bell-like notes (E6, then C6) and a short rest, 0.9 s.

    Each note is a sine with two soft overtones and an exponential decay, so it is heard over
    a room without the harshness of a square beep; the rest lets the repeat read as a ring.
    """
    notes = ((1318.5, 0.0), (1046.5, 0.22))
    length = int(rate * 0.9)
    t = np.arange(length) / rate
    out = np.zeros(length)
    for freq, start in notes:
        local = t - start
        on = local >= 0
        env = np.where(on, np.exp(-np.clip(local, 0, None) * 7.0), 0.0)
        env *= np.clip(local * rate / 64.0, 0.0, 1.0)  # a 3 ms attack: no click
        tone = sum(
            a * np.sin(2 * np.pi * freq * k * local) for k, a in ((1, 1.0), (2, 0.3), (3, 0.1))
        )
        out += env * tone
    out *= 0.5 * 32767 / max(1e-9, np.abs(out).max())
    return out.astype("<i2").tobytes(), AudioFormat(rate, 2, 1)
