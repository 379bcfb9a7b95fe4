"""engines.vad.RecentSileroVad: Silero whose recurrent state never grows older than a span."""

from __future__ import annotations

import numpy as np
import pytest

from wyoming_pivoice.audio.format import CHUNK_SAMPLES
from wyoming_pivoice.engines.vad import STATE_SPAN_CHUNKS, RecentSileroVad, SileroVad

from .helpers import make_speech, read_wav


@pytest.fixture(scope="module")
def say(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("vad")

    def espeak(text: str) -> np.ndarray:
        wav = make_speech(text, folder / f"{abs(hash(text))}.wav", pad_before=0.0, pad_after=0.0)
        return np.frombuffer(read_wav(wav)[0], dtype="<i2").astype(np.float32) / 32768

    return espeak


def _chunks(samples: np.ndarray) -> list[np.ndarray]:
    count = len(samples) // CHUNK_SAMPLES
    return [samples[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES] for i in range(count)]


def test_each_answer_is_a_fresh_state_reading_at_most_a_span_of_chunks(say) -> None:
    """Every chunk's probability is what a Silero started afresh gives after reading the
    chunks since the answering state last started: between half a span and a span of them
    (after the first half span), never the whole stream."""
    rng = np.random.default_rng(7)
    speech = say("Turn on the kitchen lights please.")
    noise = rng.normal(0, 0.01, CHUNK_SAMPLES * 12).astype(np.float32)
    chunks = _chunks(np.concatenate([noise, speech, noise]))
    span = 8
    recent = RecentSileroVad(span=span)
    fresh = SileroVad(recent.model_path)
    for index, chunk in enumerate(chunks):
        got = recent.probability(chunk)
        # The two states start afresh at chunks 0, span, 2·span… and span/2, 3·span/2…
        starts = [s for s in range(0, index + 1, span // 2) if s <= index]
        candidates = []
        for start in starts[-2:]:
            fresh.reset()
            for earlier in chunks[start:index]:
                fresh.probability(earlier)
            candidates.append((index - start, fresh.probability(chunk)))
        history, expected = max(candidates)
        assert history <= span - 1
        assert index < span // 2 or history >= span // 2
        assert got == pytest.approx(expected, abs=1e-6)


def test_it_still_hears_speech_and_silence(say) -> None:
    """With its state restarted an espeak command still reads as speech, the silence around
    it not."""
    speech = say("Set a timer for ten minutes.")
    quiet = np.zeros(CHUNK_SAMPLES * 20, dtype=np.float32)
    vad = RecentSileroVad()
    probabilities = [vad.probability(c) for c in _chunks(np.concatenate([quiet, speech, quiet]))]
    voiced = probabilities[20 : 20 + len(speech) // CHUNK_SAMPLES]
    assert max(probabilities[:20]) < 0.1 and max(probabilities[-10:]) < 0.1
    assert np.mean(np.array(voiced) >= 0.5) > 0.6


def test_a_span_under_two_chunks_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        RecentSileroVad(span=1)


def test_the_satellite_restarts_the_state_by_default() -> None:
    """--vad-state-span: a state at most 0.5 s old by default; 0 carries it through."""
    from wyoming_pivoice.satellite.endpoint import Endpointer
    from wyoming_pivoice.satellite.settings import VadSettings

    recent = Endpointer(VadSettings())._load()
    assert isinstance(recent, RecentSileroVad) and recent.span == STATE_SPAN_CHUNKS == 16
    assert type(Endpointer(VadSettings(state_span=0))._load()) is SileroVad
