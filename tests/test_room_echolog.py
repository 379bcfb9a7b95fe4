"""lab room.echolog: the frames over replies that no user spoke in, from a bench log."""

from __future__ import annotations

import json
from pathlib import Path

from pivoice_lab.room.echolog import echo_alone, longest_run


def _line(at: float, p: float, residual: float, expected: float) -> str:
    return (
        "2026-12-05 09:00:00,000 DEBUG wyoming_pivoice.audio.core: Over the reply at "
        f"{at:.3f}: VAD {p:.2f}, residual {residual} dB, expected {expected} dB"
    )


def test_the_users_frames_are_left_out_and_runs_are_counted(tmp_path: Path) -> None:
    room = tmp_path / "-6dB-aec"
    room.mkdir()
    lines = [_line(10 + i * 0.032, 0.2, -30.0, -55.0) for i in range(3)]  # a leak: 3 in a row
    lines += [_line(11 + i * 0.032, 0.0, -60.0, -40.0) for i in range(5)]
    lines += [_line(20 + i * 0.032, 0.9, -20.0, -50.0) for i in range(5)]  # the user's barge-in
    lines.append("... INFO wyoming_pivoice.audio.core: Barge-in on the audio thread at 20.2: ...")
    lines += [_line(30 + i * 0.032, 0.9, -20.0, -50.0) for i in range(4)]  # a turn of the user
    (room / "satellite.log").write_text("\n".join(lines))
    turn = {"stamps": {"speech_start": 30.1, "last_voiced": 31.0}}
    (room / "timing.jsonl").write_text(json.dumps(turn) + "\n")
    sequences = echo_alone([room / "satellite.log"])
    assert [len(s) for s in sequences] == [3, 5]
    assert longest_run(sequences, lambda f: f.excess_db >= 20 and f.probability >= 0.1) == (3, 3)
    assert longest_run(sequences, lambda f: f.probability >= 0.5) == (0, 0)
    headset = tmp_path / "headset-aec"
    headset.mkdir()
    (headset / "satellite.log").write_text("\n".join(lines))
    assert echo_alone([headset / "satellite.log"]) == []
