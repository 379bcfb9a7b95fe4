"""The lab's live replay (pivoice_lab.room.livereplay): the turn policy on a bench's logged
frames, scored against when the user spoke."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pivoice_lab.room.livereplay import policy_with, replay_bench

LINE = (
    "2026-12-06 07:00:00,000 DEBUG wyoming_pivoice.audio.core: Over the reply at {at:.3f}: "
    "VAD {p:.2f}, mic -20.0 dB, residual {r:.1f} dB, expected -50.0 dB; linear VAD None, "
    "residual None dB, expected None dB, ERLE 0.0 dB"
)


def _bench(tmp_path: Path) -> tuple[Path, Path]:
    """One echoing room: 1 s of echo alone with a 4-chunk leak 25 dB over at Silero 0.05,
    then a user whose voice stands 15 dB over at Silero 0.99 from 2.0 s; a headset room that
    the replay leaves out."""
    frames = []
    at = 100.0
    for i in range(100):
        leak = 10 <= i < 14
        voice = at >= 102.0
        p, r = (0.99, -35.0) if voice else (0.05, -25.0) if leak else (0.0, -55.0)
        frames.append(LINE.format(at=at, p=p, r=r))
        at += 0.032
    room = tmp_path / "work" / "room" / "-6dB-150ms-rt0.7-small-+100ppm-aec"
    room.mkdir(parents=True)
    (room / "satellite.log").write_text("\n".join(frames) + "\n")
    cases = [
        {
            "name": room.name,
            "user_spans": [[102.0, 103.5]],
            "trials": [{"onset": 102.0, "over_reply": True}],
        },
        {"name": "headset-aec", "user_spans": [[50.0, 51.0]]},
    ]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"room": {"cases": cases}}))
    return bench, tmp_path / "work"


def test_the_default_policy_takes_the_user_and_not_the_leak(tmp_path: Path) -> None:
    bench, work = _bench(tmp_path)
    (case,) = replay_bench(bench, work, policy_with([]))
    assert case.self_barge_ins == []
    # 15 dB over at 0.99: the strong rule's 2 frames, the first 16 ms after the onset.
    assert case.decided_after_s == [pytest.approx(0.048, abs=0.002)]
    assert case.within == 1


def test_a_variant_is_scored_on_the_same_frames(tmp_path: Path) -> None:
    bench, work = _bench(tmp_path)
    # Silero 0.01 for the plain rule: the leak's 4 frames stop the reply on its own echo.
    (case,) = replay_bench(bench, work, policy_with(["plain_threshold=0.01"]))
    assert len(case.self_barge_ins) == 1
    # A strong rule needing 8 frames decides 6 chunks later.
    (slow,) = replay_bench(bench, work, policy_with(["strong_min_speech_frames=8"]))
    assert slow.decided_after_s == [pytest.approx(0.240, abs=0.002)]
    assert slow.within == 1


def test_only_what_the_room_heard_over_a_reply_is_scored_as_a_barge_in(tmp_path: Path) -> None:
    """The bench's trials say which onsets came over a reply; an utterance the satellite
    logged frames at in the echo's tail, after the reply ended, is no barge-in trial."""
    bench, work = _bench(tmp_path)
    data = json.loads(bench.read_text())
    data["room"]["cases"][0]["trials"] = [{"onset": 102.0, "over_reply": False}]
    bench.write_text(json.dumps(data))
    (case,) = replay_bench(bench, work, policy_with([]))
    assert case.decided_after_s == []
    assert case.self_barge_ins == []  # still the user's, not the satellite's


def test_a_bench_without_the_users_onsets_is_one_line(tmp_path: Path) -> None:
    bench, work = _bench(tmp_path)
    data = json.loads(bench.read_text())
    del data["room"]["cases"][0]["trials"][0]["onset"]
    bench.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="run it again"):
        replay_bench(bench, work, policy_with([]))


def test_a_field_the_policy_has_not_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a TurnPolicy field"):
        policy_with(["margin=3"])
