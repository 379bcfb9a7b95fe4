import numpy as np
import pytest
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio.pcm import AudioFormatError, StreamingConverter, check_format


def tone(rate: int, seconds: float, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return 0.5 * np.sin(2 * np.pi * freq * t)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_stream_conversion_keeps_duration_and_pitch(rate: int) -> None:
    signal = np.stack([tone(rate, 1.0), tone(rate, 1.0)], axis=1)  # stereo
    pcm = (signal * 32767).astype("<i2").tobytes()
    converter = StreamingConverter(AudioFormat(rate, 2, 2))
    parts = [converter.convert(pcm[i : i + 999]) for i in range(0, len(pcm), 999)]  # split frames
    out = np.concatenate([*parts, converter.flush()])
    assert abs(out.size - 16000) <= 16  # one second at 16 kHz
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 16000 / out.size - 440) < 5


@pytest.mark.parametrize(
    ("rate", "width", "channels"),
    [(0, 2, 1), (16000, 3, 1), (16000, 2, 0), ("16000", 2, 1), (True, 2, 1), (10**7, 2, 1)],
)
def test_impossible_formats_are_refused(rate: object, width: object, channels: object) -> None:
    with pytest.raises(AudioFormatError):
        check_format(rate, width, channels)
