"""The per-turn clock and its JSON line (the bench reads these keys)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wyoming_pivoice.timing import STAMPS, TimingLog, TurnClock


def test_figures_come_from_the_stamps() -> None:
    clock = TurnClock(3, "streaming", silence_window_ms=300, speculate_ms=150)
    for name, at in [
        ("speech_start", 10.0),
        ("last_voiced", 12.0),
        ("speculation_start", 12.16),
        ("endpoint", 12.32),
        ("transcript", 12.5),
        ("llm_first_token", 12.6),
        ("tts_request", 12.7),
        ("tts_first_audio", 12.9),
        ("first_played", 12.91),
        ("llm_done", 13.0),
        ("playback_done", 15.0),
    ]:
        clock.mark(name, at)
    ms = clock.figures()
    assert ms["asr"] == pytest.approx(180.0)  # from the endpoint: speculation not used
    clock.speculation_used = True
    ms = clock.figures()
    assert ms["asr"] == pytest.approx(340.0)  # from the speculation start
    assert ms["llm_first_token"] == pytest.approx(100.0)
    assert ms["tts_first_audio"] == pytest.approx(200.0)
    assert ms["e2e_from_last_voiced"] == pytest.approx(910.0)
    assert ms["e2e_from_endpoint"] == pytest.approx(590.0)


def test_mark_once_and_unknown_stamps() -> None:
    clock = TurnClock(1)
    clock.mark_once("llm_first_token", 1.0)
    clock.mark_once("llm_first_token", 2.0)
    assert clock.stamps["llm_first_token"] == 1.0
    with pytest.raises(KeyError):
        clock.mark("no_such_stamp")
    clock.fail("first")
    clock.fail("second")
    assert clock.error == "first"


def test_timing_log_writes_one_line_per_turn_with_the_agreed_keys(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "timing.jsonl"
    log = TimingLog(path)
    for turn in (1, 2):
        clock = TurnClock(turn, "sequential", 300, 0)
        clock.mark("endpoint", 5.0)
        clock.transcript, clock.reply = "hi", "hello"
        log.write(clock)
    log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["turn"] for r in lines] == [1, 2]
    record = lines[0]
    assert set(record) >= {
        "turn",
        "mode",
        "silence_window_ms",
        "speculate_ms",
        "stamps",
        "transcript",
        "reply",
        "speculation",
        "ms",
        "error",
    }
    assert set(record["stamps"]) == set(STAMPS)
    assert {
        "speech_start",
        "last_voiced",
        "speculation_start",
        "endpoint",
        "transcript",
        "llm_first_token",
        "llm_done",
        "tts_first_audio",
        "first_played",
        "playback_done",
    } <= set(STAMPS)
    assert set(record["ms"]) == {
        "asr",
        "llm_first_token",
        "tts_first_audio",
        "e2e_from_last_voiced",
        "e2e_from_endpoint",
    }
    assert record["speculation"] == {"used": False, "cancelled": 0}
    assert record["mode"] == "sequential" and record["error"] is None
    assert record["stamps"]["endpoint"] == 5.0 and record["ms"]["asr"] is None
