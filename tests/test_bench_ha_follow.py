"""bench --ha-follow's arithmetic (the real run is `wyoming-pivoice bench --ha-follow`):
medians per mode, the per-round difference against standalone, and the follow's outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from pivoice_lab.bench import ha_follow


def turn(n: int, kind: str, mode: str, ms: int, ok: bool = True, reply: str = "Sunny.") -> dict:
    return {
        "round": n, "kind": kind, "mode": mode, "first_sound_ms": ms, "to_transcript_ms": 100,
        "transcript": "What is the weather like today?", "reply": reply, "sentences": 1,
        "same_words": True, "llm_first_token_ms": 150, "load_1min": 2.0 + n,
        "ours_played": ok, "has_copy_dropped": ok, "playbacks": 1, "speculated": ok,
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
    assert row["speculated"] == "2/3"
    assert row["same_words_rounds"] == "3/3" and list(row["replies"]) == ["Sunny."]
    text = ha_follow.render(
        {"meta": {"rounds": 3, "silence_window_ms": 300, "load_average_start": [2.0],
                  "load_average_end": [4.0], "seconds": 1.0, "llm": "x", "ha": "y"},
         "summary": ha_follow.summarize(turns)}
    )  # fmt: skip
    assert "+200 ms" in text and "2/3" in text and "every turn said" in text


def test_different_words_are_reported_not_hidden() -> None:
    one = "one sentence"
    turns = [
        turn(0, one, "standalone", 500, reply="Sunny."),
        turn(0, one, "ha_following", 700, reply="Rainy today."),
        turn(0, one, "ha_own_audio", 900, reply="Rainy today."),
    ]
    for t in turns:
        t["same_words"] = False
    row = ha_follow.summarize(turns)[one]
    assert row["same_words_rounds"] == "0/1"
    assert row["replies"] == {
        "Sunny.": ["standalone 1"], "Rainy today.": ["ha_following 1", "ha_own_audio 1"]
    }  # fmt: skip
    text = ha_follow.render(
        {"meta": {"rounds": 1, "silence_window_ms": 300, "load_average_start": [2.0],
                  "load_average_end": [2.0], "seconds": 1.0, "llm": "x", "ha": "y"},
         "summary": ha_follow.summarize(turns)}
    )  # fmt: skip
    assert "NOT the same reply" in text and "standalone 1: 'Sunny.'" in text


def test_words_and_sentences_of_a_reply() -> None:
    assert ha_follow.words("It's sunny, today.") == ha_follow.words("it's sunny today")
    assert ha_follow.sentences("The moon is far. It's bright. It has phases.") == 3
    assert ha_follow.sentences("The weather today is mostly sunny with a light breeze.") == 1


@pytest.mark.slow
def test_one_round_through_the_real_satellites_and_server(tmp_path: Path) -> None:
    """One round of `bench --ha-follow` on the server's embedded models: every mode played a
    reply of the real LLM, greedy, so one transcript got one reply; the following satellite
    played ours and dropped HA's copy (one playback). Speed is not asserted."""
    result = ha_follow.run(1, tmp_path, silence_ms=300)
    turns = result["turns"]
    assert {(t["kind"], t["mode"]) for t in turns} == {
        (kind, mode) for kind in ha_follow.QUESTIONS for mode in ha_follow.MODES
    }
    for kind in ha_follow.QUESTIONS:
        mine = [t for t in turns if t["kind"] == kind]
        said = {tuple(ha_follow.words(t["reply"])) for t in mine}
        # Reported as it is: the words agree exactly when the table says so.
        assert all(t["same_words"] is (len(said) == 1) for t in mine), mine
        if len({t["transcript"] for t in mine}) == 1:  # one prompt: greedy gives one reply
            assert len(said) == 1, mine
    for t in turns:
        assert t["reply"].strip() and t["first_sound_ms"] is not None, t
        assert t["llm_first_token_ms"] is not None, t  # the real LLM answered each turn
        if t["mode"] != "standalone":
            assert t["playbacks"] == 1, t
            following = t["mode"] == "ha_following"
            assert t["ours_played"] is following and t["has_copy_dropped"] is following, t
    assert "following − standalone" in ha_follow.render(result)
