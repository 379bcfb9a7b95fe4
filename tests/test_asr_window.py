"""The fitted Whisper encoder window: sizes, padding that never cuts audio, real transcripts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wyoming_pivoice.engines import asr as asr_module
from wyoming_pivoice.engines.asr import AsrSettings, WhisperAsr
from wyoming_pivoice.engines.whisper_window import (
    KEEP_TAIL_S,
    _pad_or_trim,
    cut_quiet_tail,
    encoder_window,
    fitted_frames,
    quiet_tail_s,
    window_frames,
)

from .helpers import make_speech, read_wav


def test_window_fits_the_audio_within_its_bounds() -> None:
    assert window_frames(2.0, 10) == 1000  # short commands: the minimum
    assert window_frames(12.3, 10) == 1400  # audio + 1 s, rounded up to whole seconds
    assert window_frames(29.5, 10) == 3000  # never beyond Whisper's 30 s
    assert window_frames(45.0, 10) == 3000
    assert window_frames(2.0, 15) == 1500


def _tone(seconds: float, dbfs: float = -20.0) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (np.sin(2 * np.pi * 220 * t) * 10 ** (dbfs / 20)).astype(np.float32)


def test_only_audio_cut_tightly_after_the_speech_gets_the_fitted_window() -> None:
    quiet = np.zeros(16000, dtype=np.float32)
    tight = np.concatenate([quiet[:4800], _tone(1.5), quiet[:1600]])  # as the satellite cuts
    loose = np.concatenate([quiet[:4800], _tone(1.5), quiet[:12800]])  # 0.8 s of silence after
    assert quiet_tail_s(tight) == pytest.approx(0.1, abs=0.011)
    assert quiet_tail_s(loose) == pytest.approx(0.8, abs=0.011)
    assert fitted_frames(tight, 10) == 1000
    assert fitted_frames(loose, 10) is None  # Whisper's 30 s window
    assert fitted_frames(tight, 30) is None
    assert fitted_frames(loose, 10, max_tail_s=float("inf")) == 1000  # the old behaviour
    # A room's hiss 40 dB under the voice is quiet; a voice going on to the end is not.
    hiss = np.random.default_rng(0).standard_normal(12800).astype(np.float32) * 10 ** (-60 / 20)
    assert fitted_frames(np.concatenate([_tone(1.5), hiss]), 10) is None
    assert fitted_frames(np.concatenate([_tone(1.5), _tone(0.8, -40.0)]), 10) == 1000
    assert fitted_frames(quiet, 10) is None  # silence alone: nothing to fit
    assert quiet_tail_s(np.zeros(0, dtype=np.float32)) == 0.0


def test_a_long_quiet_tail_is_cut_to_the_satellites_pad() -> None:
    quiet = np.zeros(16000, dtype=np.float32)
    loose = np.concatenate([quiet[:8000], _tone(1.5), quiet[:12800]])
    cut = cut_quiet_tail(loose, KEEP_TAIL_S)
    assert quiet_tail_s(cut) == pytest.approx(KEEP_TAIL_S, abs=1 / 16000)
    assert np.array_equal(cut, loose[: cut.size])  # the voice and the lead are untouched
    tight = loose[: cut.size]
    assert cut_quiet_tail(tight, KEEP_TAIL_S) is tight  # nothing to cut


class _Model:
    """Stands in for faster-whisper's model: records how it is called (control flow only)."""

    class model:
        is_multilingual = False

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def transcribe(self, audio: np.ndarray, **options: object) -> tuple[list, None]:
        self.calls.append({"seconds": audio.size / 16000, **options})
        return [], None


@pytest.mark.parametrize(
    ("settings", "tail_s", "expect_s", "expect_frames"),
    [
        (AsrSettings(), 0.8, 0.5 + 1.5 + KEEP_TAIL_S, 1000),  # a file: cut, fitted window
        (AsrSettings(), 0.1, 0.5 + 1.5 + 0.1, 1000),  # the satellite's cut: as it is
        (AsrSettings(keep_tail_s=None), 0.8, 0.5 + 1.5 + 0.8, None),  # session 7: 30 s
        (AsrSettings(window_s=30.0), 0.8, 0.5 + 1.5 + 0.8, None),  # --asr-window 30: as is
    ],
)
def test_the_engine_frames_audio_by_its_tail(
    monkeypatch: pytest.MonkeyPatch,
    settings: AsrSettings,
    tail_s: float,
    expect_s: float,
    expect_frames: int | None,
) -> None:
    windows: list[int | None] = []
    monkeypatch.setattr(
        asr_module,
        "encoder_window",
        lambda frames: (windows.append(frames), encoder_window(frames))[1],
    )
    engine = WhisperAsr.__new__(WhisperAsr)
    engine.settings, engine.model, engine.english_only = settings, _Model(), True
    quiet = np.zeros(int(tail_s * 16000), dtype=np.float32)
    assert engine.transcribe(np.concatenate([np.zeros(8000, np.float32), _tone(1.5), quiet])) == ""
    (call,) = engine.model.calls
    assert call["seconds"] == pytest.approx(expect_s, abs=0.002)
    assert windows == [expect_frames]
    assert call["without_timestamps"] is (expect_frames is not None)


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
    samples = _samples(kitchen_wav)
    tight = samples[
        : samples.size - int(0.9 * 16000)
    ]  # cut 0.1 s after the voice, as the satellite
    assert fitted_frames(tight, 10) == 1000
    assert "kitchen light" in asr.transcribe(tight).lower()
    assert fitted_frames(samples, 10) is None  # the whole file is not cut tightly …
    assert fitted_frames(cut_quiet_tail(samples, KEEP_TAIL_S), 10) == 1000  # … until cut
    assert "kitchen light" in asr.transcribe(samples).lower()


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
