"""The turn core both fronts play and time through (satellite/turns.py): the playback driver's
order, bounds and counts on a real sink, and the turn timer's lines."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio.speaker import NullSink
from wyoming_pivoice.satellite import turns
from wyoming_pivoice.satellite.turns import Playback, TurnTimer
from wyoming_pivoice.timing import TimingLog

FMT = AudioFormat(22050, 2, 1)


def tone(seconds: float) -> bytes:
    return (np.ones(int(seconds * FMT.rate)) * 1000).astype("<i2").tobytes()


class StuckSink(NullSink):
    """A speaker that stops taking audio: `play` (and, with `stuck_drain`, `drain`) never
    returns."""

    def __init__(self, stuck_drain: bool = True) -> None:
        super().__init__()
        self.stuck_drain = stuck_drain
        self.stopped = 0
        self.draining = asyncio.Event()

    async def play(self, pcm: bytes, fmt: AudioFormat) -> None:
        await asyncio.Event().wait()

    async def drain(self) -> None:
        self.draining.set()
        if self.stuck_drain:
            await asyncio.Event().wait()

    async def stop(self) -> None:
        self.stopped += 1


async def test_a_reply_plays_out_in_order_and_counts_what_went_to_the_device() -> None:
    sink = NullSink(realtime=True)
    playback = Playback(sink)
    async with playback.running():
        playback.begin()
        playback.play(tone(0.3), FMT, run=0)
        playback.play(tone(0.2), FMT, run=1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(playback.drained(), 5.0)
        took = loop.time() - started
    assert playback.runs == 2
    assert playback.seconds == pytest.approx(0.5, abs=0.001)
    assert took >= 0.45  # drained means played: the real-time sink took the reply's length
    assert sink.first_sample_at is not None and playback.first_sample_at == sink.first_sample_at


async def test_a_stop_ends_a_drain_that_hangs_and_drops_what_is_queued() -> None:
    sink = StuckSink()
    playback = Playback(sink)
    done: list[str] = []
    async with playback.running():
        playback.begin()
        waiting = asyncio.ensure_future(playback.drained())
        playback.finish(lambda: done.append("finished"))  # queued behind the hung drain
        await asyncio.wait_for(sink.draining.wait(), 1.0)  # the drain step hangs now
        await asyncio.wait_for(playback.stop(), 1.0)
        await asyncio.wait_for(waiting, 1.0)  # whoever waited on the reply is let go
    assert sink.stopped == 1
    assert done == []  # a stopped reply does not report itself played out
    assert playback.runs == 0  # nothing of it went to the device


async def test_a_device_call_that_hangs_is_given_up_and_the_next_step_runs(monkeypatch) -> None:
    monkeypatch.setattr(turns, "STEP_TIMEOUT", 0.2)
    sink = StuckSink(stuck_drain=False)
    playback = Playback(sink)
    async with playback.running():
        playback.play(tone(0.1), FMT)
        # queued behind the hung play: it runs once the play is given up
        await asyncio.wait_for(playback.drained(), 2.0)
    assert sink.draining.is_set()


async def test_a_drain_that_never_ends_is_bounded_by_the_reply_and_stops_it(monkeypatch) -> None:
    monkeypatch.setattr(turns, "DRAIN_EXTRA", 0.2)
    monkeypatch.setattr(turns, "STEP_TIMEOUT", 0.1)  # the queued play hangs too
    sink = StuckSink()
    playback = Playback(sink)
    async with playback.running():
        playback.begin()
        playback.play(tone(0.1), FMT)
        await asyncio.wait_for(playback.drained(), 2.0)  # 0.1 s of reply + 0.2 s
    assert sink.draining.is_set() and sink.stopped == 1


async def test_a_sound_plays_out_and_reports_even_when_it_cannot_be_loaded() -> None:
    playback = Playback(NullSink())
    done: list[str] = []

    async def missing() -> tuple[bytes, AudioFormat]:
        raise FileNotFoundError("awake.wav")

    async def ding() -> tuple[bytes, AudioFormat]:
        return tone(0.1), FMT

    async with playback.running():
        finished = asyncio.get_running_loop().create_future()
        playback.sound("awake", missing, lambda: done.append("awake"))
        playback.sound("done", ding, lambda: finished.set_result(None))
        await asyncio.wait_for(finished, 5.0)
    assert done == ["awake"]


async def test_the_timer_numbers_turns_and_writes_one_line_each(tmp_path: Path) -> None:
    log = tmp_path / "timing.jsonl"
    timer = TurnTimer(TimingLog(log), "ha", 300)
    sink = NullSink()
    playback = Playback(sink)
    first = timer.start()
    async with playback.running():
        playback.play(tone(0.1), FMT)
        await asyncio.wait_for(playback.drained(), 5.0)
    timer.played(first, playback)
    timer.write(first, "no reply")
    second = timer.start()
    timer.write(second, "turn ended without a played reply")
    timer.close()
    one, two = (json.loads(line) for line in log.read_text().splitlines())
    assert (one["turn"], two["turn"]) == (1, 2)
    assert one["mode"] == "ha" and one["silence_window_ms"] == 300
    assert one["error"] is None and one["stamps"]["first_played"] == sink.first_sample_at
    assert one["stamps"]["first_played"] <= one["stamps"]["playback_done"]
    assert two["error"] == "turn ended without a played reply"
    assert two["stamps"]["playback_done"] is None


def test_a_speculative_run_and_its_turn_share_the_turn_number() -> None:
    timer = TurnTimer(TimingLog(None), "streaming", 300, 200)
    timer.next()
    speculative, whole = timer.clock(speech_start=1.0), timer.clock(speech_start=1.0)
    assert speculative.turn == whole.turn == timer.count == 1
    assert whole.stamps["speech_start"] == 1.0 and whole.speculate_ms == 200
