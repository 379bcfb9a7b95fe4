"""Audio first: the LLM's token loop waits while a synthesis runs (control flow only).

No test sleeps or times a wait: a pause is seen blocking through the condition it waits
on (`Watched`), and the order of tokens and releases is recorded as it happens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from wyoming_pivoice.engines.priority import AudioFirst

DEADLINE_S = 10.0  # bounds every wait on another thread; never reached when all is well


class Watched(threading.Condition):
    """AudioFirst's condition, telling when a pause really blocks on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        self.waiting.set()
        return super().wait(timeout)


def watched(audio_first: AudioFirst) -> Watched:
    condition = Watched()
    audio_first._changed = condition  # before any synthesis marks itself
    return condition


def test_llm_waits_while_speaking_and_resumes_after() -> None:
    audio_first = AudioFirst(max_pause_s=DEADLINE_S)
    condition = watched(audio_first)
    happened: list[str] = []

    def tokens() -> Iterator[str]:
        for _ in range(3):
            happened.append("token")
            yield "x"
            audio_first.pause()

    with audio_first.speaking():
        worker = threading.Thread(target=lambda: list(tokens()))
        worker.start()
        assert condition.waiting.wait(DEADLINE_S)  # held at the first token boundary
        assert happened == ["token"]
        happened.append("spoken")
    worker.join(DEADLINE_S)
    assert not worker.is_alive()
    assert happened == ["token", "spoken", "token", "token"]


def test_nested_syntheses_hold_until_the_last_ends() -> None:
    audio_first = AudioFirst()
    with audio_first.speaking():
        with audio_first.speaking():
            pass
        assert audio_first.speaking_now
    assert not audio_first.speaking_now


def test_pause_is_bounded() -> None:
    """A TTS that never ends cannot starve the LLM: the pause times out and returns."""
    audio_first = AudioFirst(max_pause_s=0.05)
    condition = watched(audio_first)
    with audio_first.speaking():
        audio_first.pause()  # returns although the synthesis still runs
        assert condition.waits >= 1 and audio_first.speaking_now


def test_pause_can_be_disabled() -> None:
    audio_first = AudioFirst(enabled=False, max_pause_s=DEADLINE_S)
    condition = watched(audio_first)
    with audio_first.speaking():
        audio_first.pause()
    assert condition.waits == 0


def test_while_speaking_marks_the_whole_iteration() -> None:
    audio_first = AudioFirst()
    seen = [audio_first.speaking_now for _ in audio_first.while_speaking(iter(range(3)))]
    assert seen == [True, True, True] and not audio_first.speaking_now


def test_a_turn_waits_only_for_its_own_clients_speech() -> None:
    """Another client's synthesis (another key) does not hold a turn back."""
    audio_first = AudioFirst(max_pause_s=DEADLINE_S)
    condition = watched(audio_first)
    happened: list[str] = []
    with audio_first.speaking("10.0.0.9"):
        audio_first.pause_for("10.0.0.2")()
        assert condition.waits == 0  # another address: no wait at all

        def turn() -> None:
            audio_first.pause_for("10.0.0.9")()
            happened.append("turn resumed")

        thread = threading.Thread(target=turn)
        thread.start()
        assert condition.waiting.wait(DEADLINE_S)  # its own client's speech: it waits
        happened.append("spoken")
    thread.join(DEADLINE_S)
    assert not thread.is_alive()
    assert happened == ["spoken", "turn resumed"]


def test_a_synthesis_under_way_before_the_turn_does_not_hold_it() -> None:
    audio_first = AudioFirst(max_pause_s=0.01)
    condition = watched(audio_first)
    with audio_first.speaking("10.0.0.9", began=100.0):
        audio_first.pause_for("10.0.0.9", since=100.5)()
        assert condition.waits == 0
        audio_first.pause_for("10.0.0.9", since=99.5)()  # one that began after the turn
        assert condition.waits >= 1
