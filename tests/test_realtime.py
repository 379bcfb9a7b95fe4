"""The one pacer and the one backoff, on a fake clock: every sleep moves the clock on exactly."""

from __future__ import annotations

import asyncio

import pytest

from wyoming_pivoice.audio import pacing
from wyoming_pivoice.audio.pacing import Pacer
from wyoming_pivoice.realtime import Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(pacing.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(pacing.asyncio, "sleep", fake.sleep)
    return fake


def run(coro):
    return asyncio.run(coro)


def test_a_microphone_pace_hands_each_chunk_out_at_its_capture_time(clock: FakeClock) -> None:
    pacer = Pacer(lead=0.0)
    dues = [run(pacer.advance(0.032)) for _ in range(4)]
    assert dues == pytest.approx([100.0, 100.032, 100.064, 100.096])
    assert clock.now == pytest.approx(100.096)


def test_a_lead_lets_pieces_go_early_but_no_earlier(clock: FakeClock) -> None:
    pacer = Pacer(lead=0.1)
    dues = [run(pacer.advance(0.02)) for _ in range(10)]
    assert dues[-1] == pytest.approx(100.18)
    assert clock.now == pytest.approx(100.08)  # the last piece went 0.1 s before it is due


def test_a_late_reader_moves_the_timeline_on_unless_it_is_fixed(clock: FakeClock) -> None:
    moving, fixed = Pacer(lead=0.0), Pacer(lead=0.0, late=None)
    for pacer in (moving, fixed):
        run(pacer.advance(0.032))
    clock.now += 1.0  # a stall
    assert run(moving.advance(0.032)) == pytest.approx(101.0)  # starts again from now
    assert run(fixed.advance(0.032)) == pytest.approx(100.032)  # catches up, no wait
    assert run(fixed.advance(0.032)) == pytest.approx(100.064)


def test_a_speaker_clock_tolerates_a_little_lateness_and_shifts_on_more(clock: FakeClock) -> None:
    pacer = Pacer(lead=0.1, late=0.05)
    first = run(pacer.advance(0.02))
    clock.now += 0.04  # within the tolerance: the timeline holds
    assert run(pacer.advance(0.02)) == pytest.approx(first + 0.02)
    clock.now = first + 0.04 + 0.2  # far behind: the device ran dry
    assert run(pacer.advance(0.02)) == pytest.approx(clock.now)


def test_a_piece_taken_late_is_played_late(clock: FakeClock) -> None:
    pacer = Pacer(lead=0.1, late=0.05)
    due = run(pacer.advance(0.02))
    clock.now = due + 0.3  # the device took it only now (its buffer was full)
    assert pacer.taken(due) == pytest.approx(due + 0.3)
    assert run(pacer.advance(0.02)) == pytest.approx(due + 0.3 + 0.02)
    run(pacer.finish())
    assert clock.now == pytest.approx(due + 0.3 + 0.04)  # finish waits until both played


def test_a_negative_lead_hands_a_chunk_over_once_it_is_captured(clock: FakeClock) -> None:
    pacer = Pacer(lead=-0.032, late=None)
    pacer.reset(start=100.0)
    assert run(pacer.advance(0.032)) == pytest.approx(100.0)
    assert clock.now == pytest.approx(100.032)


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.delay == 0.5
