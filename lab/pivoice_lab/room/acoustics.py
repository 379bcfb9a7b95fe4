"""The sound path from the satellite's speaker to its microphone, as numbers.

An impulse response made from the settings (and a seed, so a room is the same every run):
the direct sound at `delay_ms` and `echo_db`, then a room tail — seeded noise that decays
exponentially with `tail_ms` as its time constant, holding `reverb_db` of the direct
sound's energy (−3 dB: a lively room; the direct-to-reverberant ratio is its negative).
The microphone hears the speaker through it, the user's voice, and a noise floor.

The speaker itself (`SpeakerPath`) may be a small one: a high-pass (`highpass_hz`, a
windowed-sinc FIR), soft clipping (`clip_db`: tanh, driven that far over full scale), and a
clock of its own (`drift_ppm`: it plays that much faster than the microphone records).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import soxr
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio import StreamingConverter

RATE = 16000
HIGHPASS_TAPS = 255  # at 16 kHz: a 200 Hz corner within ~60 Hz


@dataclass(frozen=True)
class RoomAcoustics:
    echo_db: float = -10.0  # level of the direct echo against what the speaker plays
    delay_ms: float = 40.0  # speaker → microphone (device latency plus distance)
    tail_ms: float = 60.0  # decay time constant of the room's reverberation; 0: none
    reverb_db: float = -3.0  # the tail's whole energy against the direct echo's
    noise_dbfs: float = -60.0  # the room's noise floor at the microphone (RMS)
    seed: int = 1
    highpass_hz: float = 0.0  # a small speaker's low cut; 0: none
    clip_db: float = 0.0  # soft clipping, the drive over full scale (e.g. 6); 0: none
    drift_ppm: float = 0.0  # the speaker's clock against the microphone's

    @staticmethod
    def tail_for_rt60(rt60_s: float) -> float:
        """The tail's time constant (ms) for a reverberation time (60 dB of decay)."""
        return rt60_s * 1000 / (3 * np.log(10))

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
        extra = [
            f"high-pass {self.highpass_hz:g} Hz" if self.highpass_hz else "",
            f"clipping +{self.clip_db:g} dB" if self.clip_db else "",
            f"drift {self.drift_ppm:+g} ppm" if self.drift_ppm else "",
        ]
        return ", ".join(
            [f"echo {self.echo_db:g} dB, {self.delay_ms:g} ms, {tail}"] + [e for e in extra if e]
        )


class SpeakerPath:
    """What a speaker command hands the room → what the speaker sends into the room, at the
    room's 16 kHz: format conversion, the speaker's clock, its high-pass and its clipping."""

    def __init__(self, fmt: AudioFormat, acoustics: RoomAcoustics) -> None:
        self._converter = StreamingConverter(fmt, RATE)
        self._drift = None
        if acoustics.drift_ppm:
            # Faster by d: each second of its audio lasts 1/(1+d) s of the room's time.
            out_rate = RATE / (1 + acoustics.drift_ppm * 1e-6)
            self._drift = soxr.ResampleStream(RATE, out_rate, 1, dtype="float32")
        self._fir: np.ndarray | None = None
        if acoustics.highpass_hz:
            n = np.arange(HIGHPASS_TAPS) - (HIGHPASS_TAPS - 1) / 2
            cutoff = acoustics.highpass_hz / RATE
            lowpass = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(HIGHPASS_TAPS)
            fir = -lowpass
            fir[(HIGHPASS_TAPS - 1) // 2] += 1.0  # delta − low-pass: the high-pass
            self._fir = fir.astype(np.float32)
            self._carry = np.zeros(HIGHPASS_TAPS - 1, dtype=np.float32)
        self._drive = 10 ** (acoustics.clip_db / 20) if acoustics.clip_db else 0.0

    def convert(self, pcm: bytes) -> np.ndarray:
        return self.convert_with_source(pcm)[1]

    def flush(self) -> np.ndarray:
        return self.flush_with_source()[1]

    def convert_with_source(self, pcm: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(the audio at 16 kHz as handed over — what the satellite's reference holds —, what
        the speaker sends into the room)."""
        source = self._converter.convert(pcm)
        return source, self._shape(source, last=False)

    def flush_with_source(self) -> tuple[np.ndarray, np.ndarray]:
        source = self._converter.flush()
        return source, self._shape(source, last=True)

    def _shape(self, samples: np.ndarray, last: bool) -> np.ndarray:
        if self._drift is not None:
            samples = self._drift.resample_chunk(samples, last=last)
        if self._fir is not None and len(samples):
            full = np.convolve(samples, self._fir).astype(np.float32)
            full[: len(self._carry)] += self._carry
            self._carry = full[len(samples) :].copy()
            samples = full[: len(samples)]
        if self._drive:
            # Unit gain for small signals; loud ones flatten towards 1/drive.
            samples = (np.tanh(samples * self._drive) / self._drive).astype(np.float32)
        return samples.astype(np.float32)


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
