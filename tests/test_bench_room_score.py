"""The room bench's scoring of self barge-ins (lab bench/room.py), on a recorded shape."""

from __future__ import annotations

import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from wyoming.audio import AudioFormat

from pivoice_lab.bench.corpus import Utterance
from pivoice_lab.bench.room import _score
from pivoice_lab.room.session import RoomRun
from pivoice_lab.room.simulator import Reply, Say

FMT = AudioFormat(22050, 2, 1)


def _turn(barge_in: float | None, first_played: float) -> dict:
    stamps = {"speech_start": first_played - 5.0, "first_played": first_played}
    stamps["barge_in"] = barge_in
    return {"stamps": stamps, "barged_in": barge_in is not None, "echo": None,
            "transcript": "", "ms": {}}  # fmt: skip


def _utterance(tmp_path: Path, name: str, kind: str) -> Utterance:
    """A 1 s utterance (its voice 0.1-0.9 s) written as a WAV: for the scripts' shape."""
    path = tmp_path / f"{name}.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(b"\x00\x10" * 16000)
    return Utterance(name, name, "espeak:en-us", kind, (), str(path), 1.0, 0.1, 0.9)


def _run(turns: list[dict], replies: list[Reply]) -> RoomRun:
    return RoomRun(SimpleNamespace(replies=replies), turns, "", True)  # type: ignore[arg-type]


def test_a_barge_in_on_the_users_question_in_a_pause_of_the_reply_is_the_users() -> None:
    """Session 12's headset: the reply paused > 1.5 s (its next sentence late under load), so
    the room ended it; the user's next question, said 1.2 s later, stopped the rest of it."""
    reply = Reply(1, FMT, opened=10.0, first_sound=10.0, last_sound=12.0, ended=12.0)
    question = Say("france", np.zeros(16000, np.float32), reply=1, after_end=True, onset=13.2)
    # The reply's turn (its speech_start lies in no user span: the script has none for it
    # here; it is not a barge-in trial either).
    scored = _score(_run([_turn(13.36, 10.0)], [reply]), [question], {})
    assert scored["self_barge_ins"] == 0
    # The same stop with nobody speaking is the satellite's own.
    alone = _score(_run([_turn(15.0, 10.0)], [reply]), [question], {})
    assert alone["self_barge_ins"] == 1


def test_where_the_reference_was_placed_is_told_per_room() -> None:
    from pivoice_lab.bench.room import _placement_text

    text = _placement_text(
        {"reference_ms": [-9.7, -8.3, None], "microphone_ms": [1.25, 1.25, None],
         "lag_ms": [261.0, 259.5, None]}
    )  # fmt: skip
    assert "reference placed -9.7 to -8.3 ms from where it played" in text
    assert "AEC3's lag 259.5 to 261 ms over 2 replies" in text
    assert _placement_text({}) == "."


def test_live_erle_is_held_against_offline_per_room_with_better_live_counting() -> None:
    """The target, from the bench's own numbers: the medians and the replies within 6 dB."""
    from pivoice_lab.bench.room import _erle_vs_offline

    result = {"name": "-6 dB", "erle_db": [28.0, 17.0, 40.0, 20.0],
              "offline_erle_db": [24.0, 29.0, 30.0, None]}  # fmt: skip
    row = _erle_vs_offline(result)
    # The last reply has no offline figure; 17 is 12 dB under its 29, 40 over its 30.
    assert row["replies"] == 3 and row["replies_within"] == 2
    assert (row["live_db_median"], row["offline_db_median"]) == (28.0, 29.0)
    assert row["medians_within"]
    assert not _erle_vs_offline({**result, "erle_db": [10.0, 17.0, 20.0]})["medians_within"]


def test_the_wide_rooms_script_puts_the_recorded_person_over_a_reply_at_their_onsets(
    tmp_path,
) -> None:
    """`--room-cases wide`: a recorded person is said over the first reply talked over in
    each round, at that room's own onsets; the other commands and questions as before."""
    from pivoice_lab.bench.room import _script, wide_cases

    def utterance(name: str, kind: str) -> Utterance:
        return _utterance(tmp_path, name, kind)

    questions = [utterance(f"q{i}", "question") for i in range(4)]
    commands = [utterance(f"c{i}", "command") for i in range(4)]
    human = utterance("arctic", "command")
    cases = wide_cases()
    assert len({case.name for case in cases}) == len(cases)
    case = next(case for case in cases if case.human)
    script = _script(1, questions, commands, 2, case.over_ms, human)
    over = [say for say in script if say.reply is not None and not say.after_end]
    assert [say.text for say in over][::2] == ["arctic", "arctic"]
    assert "arctic" not in [say.text for say in over][1::2]
    assert {say.after_ms for say in over} == set(case.over_ms)


def test_the_chained_script_talks_over_the_first_reply_after_a_barge_in(tmp_path) -> None:
    """`--room-cases chained`: each round, the second command is said over the reply to the
    first (4 replies a round), and its trial is scored as over the reply after a barge-in."""
    from pivoice_lab.bench.room import _script, chained_cases

    def utterance(name: str, kind: str) -> Utterance:
        return _utterance(tmp_path, name, kind)

    questions = [utterance(f"q{i}", "question") for i in range(4)]
    commands = [utterance(f"c{i}", "command") for i in range(4)]
    case = chained_cases()[0]
    assert case.chained and case.name.endswith("-chained-aec")
    script = _script(0, questions, commands, 2, case.over_ms, chained=True)
    assert [(say.reply, say.after_end) for say in script] == [
        (None, False), (1, True), (2, False), (3, False),
        (4, True), (5, True), (6, False), (7, False),
    ]  # fmt: skip
    # Reply 2 plays 10-14 s (the first command at 10.8 stops it at 11.0); reply 3, the
    # first command's, plays 15-19 s and the second command at 15.9 stops it at 16.1.
    replies = [
        Reply(2, FMT, opened=10.0, first_sound=10.0, last_sound=11.0, ended=11.0),
        Reply(3, FMT, opened=15.0, first_sound=15.0, last_sound=16.1, ended=16.1),
    ]
    first, second = script[2], script[3]
    first.onset, second.onset = 10.8, 15.9
    turns = [_turn(11.0, 10.0), _turn(16.05, 15.0)]
    heard = {say.text: utterance(say.text, "command") for say in (first, second)}
    scored = _score(_run(turns, replies), [script[1], first, second], heard)
    assert [t["after_barge_in"] for t in scored["trials"]] == [False, True]
    assert all(t["in_time"] for t in scored["trials"])
