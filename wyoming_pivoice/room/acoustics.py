"""The sound path from the satellite's speaker to its microphone, as numbers.

An impulse response made from the settings (and a seed, so a room is the same every run):
the direct sound at `delay_ms` and `echo_db`, then a room tail — seeded noise that decays
exponentially with `tail_ms` as its time constant, holding `reverb_db` of the direct
sound's energy (−3 dB: a lively room; the direct-to-reverberant ratio is its negative).
The microphone hears the speaker through it, the user's voice, and a noise floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RATE = 16000


@dataclass(frozen=True)
class RoomAcoustics:
    echo_db: float = -10.0  # level of the direct echo against what the speaker plays
    delay_ms: float = 40.0  # speaker → microphone (device latency plus distance)
    tail_ms: float = 60.0  # decay time constant of the room's reverberation; 0: none
    reverb_db: float = -3.0  # the tail's whole energy against the direct echo's
    noise_dbfs: float = -60.0  # the room's noise floor at the microphone (RMS)
    seed: int = 1

    def impulse_response(self) -> np.ndarray:
        delay = round(self.delay_ms * RATE / 1000)
        tail = round(self.tail_ms * RATE / 1000 * 6) if self.tail_ms > 0 else 0  # to −52 dB
        response = np.zeros(delay + 1 + tail, dtype=np.float64)
        response[delay] = 1.0
        if tail:
            rng = np.random.default_rng(self.seed)
            t = np.arange(1, tail + 1) / RATE
            decay = np.exp(-t / (self.tail_ms / 1000))
            reverb = rng.normal(0.0, 1.0, tail) * decay
            reverb *= np.sqrt(10 ** (self.reverb_db / 10) / np.sum(reverb**2))
            response[delay + 1 :] = reverb
        return (response * 10 ** (self.echo_db / 20)).astype(np.float32)

    def describe(self) -> str:
        tail = f"tail {self.tail_ms:g} ms" if self.tail_ms > 0 else "no tail"
        return f"echo {self.echo_db:g} dB, {self.delay_ms:g} ms, {tail}"


class EchoPath:
    """Streaming convolution of the speaker's output with the room's impulse response."""

    def __init__(self, acoustics: RoomAcoustics) -> None:
        self.response = acoustics.impulse_response()
        self._carry = np.zeros(len(self.response) - 1, dtype=np.float32)

    def process(self, played: np.ndarray) -> np.ndarray:
        """Float samples the speaker played in one block → the echo at the mic in that block."""
        full = np.convolve(played, self.response).astype(np.float32)
        n = len(played)
        full[: len(self._carry)] += self._carry
        self._carry = full[n:].copy()
        return full[:n]


class NoiseFloor:
    """Seeded white noise at a level: the same hiss every run."""

    def __init__(self, dbfs: float, seed: int) -> None:
        self.level = 10 ** (dbfs / 20)
        self._rng = np.random.default_rng(seed + 1000)

    def block(self, n: int) -> np.ndarray:
        return (self._rng.normal(0.0, self.level, n)).astype(np.float32)
