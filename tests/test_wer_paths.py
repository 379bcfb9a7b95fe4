"""WER of the ASR paths on household clips: our server may not hear a whole clip worse than
plain faster-whisper with the same weights, and our satellite not worse than our server.

WINDOW: clips whose whole-file transcript the fitted 10 s window got wrong while plain
faster-whisper's 30 s window got right ("Lock the front door" → "Like my friend's door",
"coffee machine" → "cloth in machine"), decoded greedily as a rule; one word of slack
covers a rare sampled fallback. HARD: the issue's examples ("leap year", the thermostat,
"Lock the front door") and the real recording; two of them fall back to sampling, so the
satellite may lose or win a word by chance: one word (of ~50) is allowed.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from pivoice_lab.bench import corpus, wer
from wyoming_pivoice.engines.asr import AsrSettings, WhisperAsr
from wyoming_pivoice.satellite.settings import VadSettings

WINDOW = ("lock_front", "lock_all", "date", "coffee", "doorbell")
HARD = ("lock_front", "thermo_21", "leap_is", "leap_days", "heat_up", "list_remove", "arctic")
SLACK_WORDS = 1


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, corpus.Utterance]:
    lines = tuple(line for line in corpus.HOUSEHOLD if line.id in {*WINDOW, *HARD})
    return {u.id: u for u in corpus.build(tmp_path_factory.mktemp("wer-corpus"), lines=lines)}


@pytest.fixture(scope="module")
def server_texts(server_port: int, clips: dict[str, corpus.Utterance]) -> dict[str, str]:
    uri = f"tcp://127.0.0.1:{server_port}"
    return asyncio.run(wer.server_transcripts(uri, list(clips.values())))


def _errors(clips: list[corpus.Utterance], texts: dict[str, str]) -> dict:
    return wer.score((u.id, u.text, texts[u.id]) for u in clips)


@pytest.mark.slow
def test_server_hears_the_whole_clip_as_well_as_plain_faster_whisper(
    clips: dict[str, corpus.Utterance], server_texts: dict[str, str]
) -> None:
    chosen = [clips[i] for i in (*WINDOW, "arctic")]
    plain = _errors(chosen, wer.plain_transcripts(chosen, AsrSettings()))
    ours = _errors(chosen, server_texts)
    assert ours["words"] >= 30
    assert ours["errors"] <= plain["errors"] + SLACK_WORDS, (ours, plain)
    # The fitted window on the same whole clips (the server before #27) is worse: the test
    # tells the two apart.
    before = WhisperAsr(AsrSettings(tight_tail_s=math.inf))
    fitted = _errors(chosen, {u.id: before.transcribe(u.samples()) for u in chosen})
    assert fitted["errors"] > plain["errors"] + SLACK_WORDS, (fitted, plain)


@pytest.mark.slow
def test_satellite_hears_as_well_as_the_server_on_the_whole_clip(
    server_port: int, clips: dict[str, corpus.Utterance], server_texts: dict[str, str]
) -> None:
    hard_clips = [clips[i] for i in HARD]
    texts, turns = asyncio.run(
        wer.satellite_transcripts(
            f"tcp://127.0.0.1:{server_port}",
            hard_clips,
            VadSettings.silence_ms,  # the satellite's defaults
            VadSettings.speculate_ms,
            120,
        )
    )
    assert all(count == 1 for count in turns.values()), turns  # no utterance split in two
    satellite = _errors(hard_clips, texts)
    server = _errors(hard_clips, server_texts)
    assert server["words"] >= 45
    assert satellite["errors"] <= server["errors"] + SLACK_WORDS, (satellite, server)


@pytest.mark.slow
def test_the_human_recording_comes_through_pip_and_is_heard(tmp_path: Path) -> None:
    clip = next(u for u in corpus.build(tmp_path, lines=corpus.HOUSEHOLD[-1:]))
    assert clip.voice == f"human:{corpus.ARCTIC_WAV}" and 2.5 < clip.speech_s < 4.5
    asr = WhisperAsr(AsrSettings())
    assert wer.score_one(clip.id, clip.text, asr.transcribe(clip.samples())).errors <= 1
