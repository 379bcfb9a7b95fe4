"""PCM helpers: format checks and streaming conversion to the rate a model wants.

A format is the `wyoming` library's `AudioFormat` (rate, width, channels) everywhere; the
figures derived from one are the small functions here. Resampling uses soxr (a real
resampler in C, to float for the models), never a Python loop; wyoming's own converter
(audioop, 16-bit out) is not used.
"""

from __future__ import annotations

import numpy as np
import soxr
from wyoming.audio import AudioFormat

from .format import MIC_FORMAT

MIN_RATE = 4000
MAX_RATE = 192000
MAX_CHANNELS = 8
SUPPORTED_WIDTHS = (1, 2, 4)


class AudioFormatError(ValueError):
    """An audio format we cannot or will not convert."""


def frame_bytes(fmt: AudioFormat) -> int:
    """Bytes of one sample on every channel."""
    return fmt.width * fmt.channels


def bytes_per_second(fmt: AudioFormat) -> int:
    return fmt.rate * fmt.width * fmt.channels


def duration(fmt: AudioFormat, num_bytes: int) -> float:
    """Seconds that `num_bytes` of audio in `fmt` last."""
    return num_bytes / bytes_per_second(fmt)


def plain_format(fmt: AudioFormat) -> AudioFormat:
    """Only the format of an AudioStart/AudioChunk (they are AudioFormats too, but compare
    unequal to a plain one, and a chunk compares its audio as well)."""
    return AudioFormat(fmt.rate, fmt.width, fmt.channels)


WHISPER_FORMAT = MIC_FORMAT  # Whisper and Silero take what the microphone gives


def check_format(rate: object, width: object, channels: object) -> AudioFormat:
    """Validate untrusted format fields from an event; raise AudioFormatError with the reason."""
    for name, value in (("rate", rate), ("width", width), ("channels", channels)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise AudioFormatError(f"audio {name} must be an integer, got {value!r}")
    assert isinstance(rate, int) and isinstance(width, int) and isinstance(channels, int)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioFormatError(f"audio rate {rate} Hz is outside {MIN_RATE}..{MAX_RATE}")
    if width not in SUPPORTED_WIDTHS:
        raise AudioFormatError(f"audio width {width} bytes is not one of {SUPPORTED_WIDTHS}")
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioFormatError(f"audio channels {channels} is outside 1..{MAX_CHANNELS}")
    return AudioFormat(rate, width, channels)


def pcm_to_float(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """Interleaved PCM → mono float32 in [-1, 1] (channels averaged)."""
    if fmt.width == 1:
        samples = (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif fmt.width == 2:
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    else:
        samples = np.frombuffer(data, dtype="<i4").astype(np.float32) / 2147483648.0
    if fmt.channels > 1:
        samples = samples.reshape(-1, fmt.channels).mean(axis=1)
    return samples


def float_to_pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


class StreamingConverter:
    """Converts a stream of PCM chunks in any supported format to mono float32 at `out_rate`.

    Chunks may split frames anywhere; leftover bytes are carried to the next chunk.
    """

    def __init__(self, source: AudioFormat, out_rate: int = WHISPER_FORMAT.rate) -> None:
        self.source = source
        self.out_rate = out_rate
        self._leftover = b""
        self._resampler = (
            None
            if source.rate == out_rate
            else soxr.ResampleStream(source.rate, out_rate, 1, dtype="float32", quality="HQ")
        )

    def convert(self, data: bytes) -> np.ndarray:
        data = self._leftover + data
        usable = len(data) - len(data) % frame_bytes(self.source)
        self._leftover = data[usable:]
        mono = pcm_to_float(data[:usable], self.source)
        if self._resampler is None:
            return mono
        return self._resampler.resample_chunk(mono, last=False)

    def flush(self) -> np.ndarray:
        self._leftover = b""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        return self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)


def resample_pcm16(data: bytes, in_rate: int, out_rate: int) -> bytes:
    """Whole-buffer mono 16-bit resample (for playback devices that need a fixed rate)."""
    if in_rate == out_rate:
        return data
    samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    return float_to_pcm16(soxr.resample(samples, in_rate, out_rate))
