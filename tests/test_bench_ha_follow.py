"""bench --ha-follow's arithmetic (the real run is `wyoming-pivoice bench --ha-follow`):
medians per mode, the per-round difference against standalone, and the follow's outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivoice_lab.bench import ha_follow


def turn(n: int, kind: str, mode: str, ms: int, ok: bool = True) -> dict:
    return {
        "round": n, "kind": kind, "mode": mode, "first_sound_ms": ms, "to_transcript_ms": 100,
        "reply": ha_follow.REPLIES[kind], "same_reply": True, "load_1min": 2.0 + n,
        "ours_played": ok, "has_copy_dropped": ok, "playbacks": 1,
    }  # fmt: skip


def test_summary_takes_per_round_differences_and_counts_the_follows() -> None:
    one = "one sentence"
    turns = []
    for n, (sa, fo, own) in enumerate([(500, 700, 1500), (900, 1000, 2000), (400, 800, 1400)]):
        turns += [turn(n, one, "standalone", sa), turn(n, one, "ha_following", fo, ok=n != 1)]
        turns.append(turn(n, one, "ha_own_audio", own))
    row = ha_follow.summarize(turns)[one]
    assert row["standalone"]["median_ms"] == 500 and row["ha_following"]["median_ms"] == 800
    # Per round (200, 100, 400): the median is 200, not 800 − 500 = 300.
    assert row["ha_following_minus_standalone_ms"] == {"median": 200, "per_round": [200, 100, 400]}
    assert row["following_ok"] == "2/3" and row["load_1min"] == [2.0, 4.0]
    text = ha_follow.render(
        {"meta": {"rounds": 3, "silence_window_ms": 300, "load_average_start": [2.0],
                  "load_average_end": [4.0], "seconds": 1.0, "llm": "x", "ha": "y"},
         "summary": ha_follow.summarize(turns)}
    )  # fmt: skip
    assert "+200 ms" in text and "2/3" in text


@pytest.mark.slow
def test_one_round_through_the_real_satellites_and_server(tmp_path: Path) -> None:
    """One round of `bench --ha-follow`: every mode spoke the same fixed reply, the following
    satellite played ours and dropped HA's copy (one playback). Speed is not asserted."""
    result = ha_follow.run(1, tmp_path, silence_ms=300)
    turns = result["turns"]
    assert {(t["kind"], t["mode"]) for t in turns} == {
        (kind, mode) for kind in ha_follow.REPLIES for mode in ha_follow.MODES
    }
    for t in turns:
        assert t["same_reply"] and t["first_sound_ms"] is not None, t
        if t["mode"] != "standalone":
            assert t["playbacks"] == 1, t
            following = t["mode"] == "ha_following"
            assert t["ours_played"] is following and t["has_copy_dropped"] is following, t
    assert "following − standalone" in ha_follow.render(result)
