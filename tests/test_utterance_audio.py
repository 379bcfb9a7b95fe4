"""The audio core's UtteranceAudio: while echo may be heard an utterance keeps the microphone
as captured, sample-aligned with what the canceller hands the VAD."""

from __future__ import annotations

import numpy as np

from tests.helpers import make_speech
from wyoming_pivoice.audio import CHUNK_SAMPLES, EchoCanceller, UtteranceAudio
from wyoming_pivoice.audio.mic import read_wav_16k
from wyoming_pivoice.satellite import EchoSettings


def test_the_kept_microphone_lines_up_with_the_cancellers_output(tmp_path) -> None:
    # With nothing played the canceller passes the microphone through, `delay_samples` later:
    # the kept chunks must then be the output itself, sample for sample.
    pcm = read_wav_16k(make_speech("Turn on the kitchen lights.", tmp_path / "u.wav"))
    canceller = EchoCanceller(EchoSettings())
    kept = UtteranceAudio()
    cleaned, captured = [], []
    for n in range(len(pcm) // (2 * CHUNK_SAMPLES)):
        chunk = pcm[2 * CHUNK_SAMPLES * n : 2 * CHUNK_SAMPLES * (n + 1)]
        out = canceller.process(chunk, (n + 1) * CHUNK_SAMPLES / 16000)
        cleaned.append(out)
        captured.append(kept.chunk(chunk, out, True, canceller.delay_samples))
        assert len(captured[-1]) == len(chunk)
    assert canceller.delay_samples > 0
    assert b"".join(captured) == b"".join(cleaned)
    assert np.abs(np.frombuffer(b"".join(cleaned), "<i2")).max() > 1000  # speech went through
    # Not playing: the canceller's output is kept.
    assert kept.chunk(pcm[: 2 * CHUNK_SAMPLES], b"x" * 1024, False, 128) == b"x" * 1024
