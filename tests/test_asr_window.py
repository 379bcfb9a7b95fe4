"""The fitted Whisper encoder window: sizes, padding that never cuts audio, real transcripts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wyoming_pivoice.engines.asr import AsrSettings, WhisperAsr
from wyoming_pivoice.engines.whisper_window import _pad_or_trim, encoder_window, window_frames

from .helpers import make_speech, read_wav


def test_window_fits_the_audio_within_its_bounds() -> None:
    assert window_frames(2.0, 10) == 1000  # short commands: the minimum
    assert window_frames(12.3, 10) == 1400  # audio + 1 s, rounded up to whole seconds
    assert window_frames(29.5, 10) == 3000  # never beyond Whisper's 30 s
    assert window_frames(45.0, 10) == 3000
    assert window_frames(2.0, 15) == 1500


def test_padding_follows_the_window_and_never_cuts_audio() -> None:
    mel = np.ones((80, 1200), dtype=np.float32)
    assert _pad_or_trim(mel).shape == (80, 3000)  # outside a window: Whisper's own padding
    with encoder_window(1000):
        assert _pad_or_trim(mel).shape == (80, 1200)  # longer than the window: kept whole
        assert _pad_or_trim(mel[:, :400]).shape == (80, 1000)
        assert _pad_or_trim(mel, 500).shape == (80, 500)  # explicit lengths are left alone
        with encoder_window(None):
            assert _pad_or_trim(mel[:, :400]).shape == (80, 3000)
        assert _pad_or_trim(mel[:, :400]).shape == (80, 1000)
    assert _pad_or_trim(mel[:, :400]).shape == (80, 3000)


@pytest.fixture(scope="module")
def asr() -> WhisperAsr:
    return WhisperAsr(AsrSettings())  # the default: a 10 s minimum window


def _samples(path: Path) -> np.ndarray:
    pcm, rate, _width, _channels = read_wav(path)
    assert rate == 16000
    return np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768


def test_short_command_is_heard_with_the_short_window(asr: WhisperAsr, kitchen_wav: Path) -> None:
    assert "kitchen light" in asr.transcribe(_samples(kitchen_wav)).lower()


def test_speech_longer_than_the_window_is_heard_to_its_end(
    asr: WhisperAsr, speech_dir: Path
) -> None:
    text = (
        "Turn on the kitchen lights. Set the thermostat to twenty degrees. "
        "Play some music in the bedroom. Close the blinds in the living room. "
        "Open the garage door."
    )
    samples = _samples(make_speech(text, speech_dir / "long.wav", speed=130))
    assert samples.size / 16000 > 11  # longer than the 10 s minimum window
    heard = asr.transcribe(samples).lower()
    for words in ("kitchen", "thermostat", "bedroom", "blinds", "garage"):
        assert words in heard, heard


def test_noise_alone_yields_no_text(asr: WhisperAsr) -> None:
    # This noise decodes to a lone " ." with the 10 s window: punctuation is not speech.
    noise = np.random.default_rng(0).standard_normal(16000) * 10 ** (-50 / 20)
    assert asr.transcribe(noise.astype(np.float32)) == ""
