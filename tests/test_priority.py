"""Audio first: the LLM's token loop waits while a synthesis runs (control flow only)."""

from __future__ import annotations

import threading
import time

from wyoming_pivoice.engines.priority import AudioFirst


def _tokens(audio_first: AudioFirst, stamps: list[float], count: int):
    for _ in range(count):
        stamps.append(time.monotonic())
        yield "x"
        audio_first.pause()


def test_llm_waits_while_speaking_and_resumes_after() -> None:
    audio_first = AudioFirst()
    stamps: list[float] = []
    release = threading.Event()

    def speak() -> None:
        with audio_first.speaking():
            release.wait(5)

    speaker = threading.Thread(target=speak)
    speaker.start()
    while not audio_first.speaking_now:
        time.sleep(0.001)
    tokens = _tokens(audio_first, stamps, 3)
    worker = threading.Thread(target=lambda: list(tokens))
    worker.start()
    time.sleep(0.2)
    assert len(stamps) == 1  # the first token, then held at the boundary
    released_at = time.monotonic()
    release.set()
    worker.join(5)
    speaker.join(5)
    assert len(stamps) == 3 and stamps[1] >= released_at


def test_nested_syntheses_hold_until_the_last_ends() -> None:
    audio_first = AudioFirst()
    with audio_first.speaking():
        with audio_first.speaking():
            pass
        assert audio_first.speaking_now
    assert not audio_first.speaking_now


def test_pause_is_bounded_and_can_be_disabled() -> None:
    audio_first = AudioFirst(max_pause_s=0.05)
    with audio_first.speaking():
        start = time.monotonic()
        audio_first.pause()  # a TTS that never ends cannot starve the LLM
        assert 0.04 <= time.monotonic() - start < 1.0
        off = AudioFirst(enabled=False)
        with off.speaking():
            start = time.monotonic()
            off.pause()
            assert time.monotonic() - start < 0.04


def test_while_speaking_marks_the_whole_iteration() -> None:
    audio_first = AudioFirst()
    seen = [audio_first.speaking_now for _ in audio_first.while_speaking(iter(range(3)))]
    assert seen == [True, True, True] and not audio_first.speaking_now


def test_a_turn_waits_only_for_its_own_clients_speech() -> None:
    """Another client's synthesis (another key) does not hold a turn back."""
    audio_first = AudioFirst(max_pause_s=5.0)
    with audio_first.speaking("10.0.0.9"):
        start = time.monotonic()
        audio_first.pause_for("10.0.0.2")()  # returns at once
        assert time.monotonic() - start < 1.0
        waited = threading.Event()

        def turn() -> None:
            audio_first.pause_for("10.0.0.9")()
            waited.set()

        thread = threading.Thread(target=turn)
        thread.start()
        assert not waited.wait(0.2)  # its own client's speech: it waits
    assert waited.wait(5)
    thread.join()


def test_a_synthesis_under_way_before_the_turn_does_not_hold_it() -> None:
    audio_first = AudioFirst(max_pause_s=5.0)
    with audio_first.speaking("10.0.0.9", began=time.monotonic()):
        turn_began = time.monotonic()
        start = time.monotonic()
        audio_first.pause_for("10.0.0.9", since=turn_began)()
        assert time.monotonic() - start < 1.0
