"""Control flow of the standalone pipeline: barge-in and turn order (stand-in turn, real sink).

The end-to-end behaviour on the real models is in test_satellite_standalone.py; barge-in
depends on when a reply happens to be playing, so its control flow is tested here.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio.speaker import NullSink
from wyoming_pivoice.satellite.endpoint import EndpointEvent, EndpointKind
from wyoming_pivoice.satellite.settings import SatelliteSettings
from wyoming_pivoice.satellite.stages import (
    AudioPiece,
    HeardMemo,
    StreamingResponder,
    _Conversation,
)
from wyoming_pivoice.satellite.standalone.pipeline import Player, Stages, TurnRun, Turns
from wyoming_pivoice.satellite.turns import Playback, TurnTimer
from wyoming_pivoice.timing import TimingLog, TurnClock


class StandInRun:
    """What the player needs of a TurnRun: a clock, an audio queue, a task, cancel()."""

    def __init__(self, turn: int, seconds: float, finished: bool = True) -> None:
        self.clock = TurnClock(turn)
        self.audio: asyncio.Queue[AudioPiece | None] = asyncio.Queue()
        self.phrases = ["The first phrase.", "The second one."]  # the second is not synthesized yet
        self.stages = SimpleNamespace(memo=HeardMemo())
        pcm = (np.ones(int(seconds * 22050)) * 1000).astype("<i2").tobytes()
        self.audio.put_nowait(AudioPiece(pcm, AudioFormat(22050, 2, 1), run=0))
        if finished:
            self.audio.put_nowait(None)
        self.task = asyncio.create_task(asyncio.sleep(0 if finished else 3600))
        self.cancelled = False

    async def cancel(self) -> None:
        self.cancelled = True
        self.task.cancel()
        self.audio.put_nowait(None)


def player_on(sink: NullSink, log: TimingLog) -> Player:
    return Player(Playback(sink), TurnTimer(log, "streaming", 300))


def started(at: float = 0.0) -> EndpointEvent:
    return EndpointEvent(EndpointKind.SPEECH_STARTED, at, at, at, b"")


async def wait_for(condition, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_speech_during_a_reply_stops_it(tmp_path: Path) -> None:
    log = tmp_path / "timing.jsonl"
    player = player_on(NullSink(realtime=True), TimingLog(log))
    runs: asyncio.Queue = asyncio.Queue()
    long_reply = StandInRun(1, seconds=30.0, finished=False)  # the LLM is still writing
    runs.put_nowait(long_reply)
    playing = asyncio.create_task(player.run(runs))
    await wait_for(lambda: player.playing)

    turns = Turns(SatelliteSettings(server="tcp://x:1"), None, player, lambda: None)  # type: ignore[arg-type]
    await turns._handle(started(), asyncio.Queue())

    assert long_reply.cancelled  # the rest of the turn (LLM, TTS) is abandoned too
    assert not player.playing
    runs.put_nowait(None)
    await asyncio.wait_for(playing, 2.0)  # not the 30 s the reply would last
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["barged_in"] is True
    assert record["stamps"]["first_played"] <= record["stamps"]["playback_done"]
    # What began to play is what the next request tells the server the user heard.
    assert long_reply.stages.memo.heard == "The first phrase."


def test_the_next_request_tells_the_server_once_what_was_heard_of_a_cut_reply() -> None:
    memo = HeardMemo()
    responder = StreamingResponder(None, "c" * 30, "s", memo)  # type: ignore[arg-type]
    assert "heard" not in responder._request("hello", TurnClock(1)).data["context"]
    memo.heard = "The first phrase."
    assert responder._request("stop", TurnClock(2)).data["context"]["heard"] == "The first phrase."
    assert memo.heard is None  # told once: the turn after it says nothing of it
    assert "heard" not in responder._request("and then", TurnClock(3)).data["context"]


async def test_no_barge_in_lets_the_reply_finish_and_replies_keep_their_order(
    tmp_path: Path,
) -> None:
    log = tmp_path / "timing.jsonl"
    player = player_on(NullSink(realtime=True), TimingLog(log))
    runs: asyncio.Queue = asyncio.Queue()
    first, second = StandInRun(1, 0.3), StandInRun(2, 0.2)
    for run in (first, second, None):
        runs.put_nowait(run)
    playing = asyncio.create_task(player.run(runs))
    await wait_for(lambda: player.playing)

    settings = SatelliteSettings(server="tcp://x:1", barge_in=False)
    turns = Turns(settings, None, player, lambda: None)  # type: ignore[arg-type]
    await turns._handle(started(), asyncio.Queue())
    assert player.playing and not first.cancelled

    await asyncio.wait_for(playing, 5.0)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["turn"] for r in records] == [1, 2]
    assert not any(r["barged_in"] for r in records)
    one, two = (r["stamps"] for r in records)
    assert one["playback_done"] <= two["first_played"]


class EchoAsr:
    async def transcribe(self, audio: bytes, clock: TurnClock) -> str:
        return audio.decode()


class RecordingResponder(_Conversation):
    """Records the context each request would carry to the server."""

    def __init__(self, sent: list[dict]) -> None:
        super().__init__(None, "kitchen", "run7")  # type: ignore[arg-type]
        self.sent = sent

    async def respond(self, text: str, clock: TurnClock):
        self.sent.append({"text": text, **self._request(text, clock).data["context"]})
        yield "ok."


class DrainTts:
    async def speak(self, phrases, audio, clock) -> None:
        while await phrases.get() is not None:
            pass
        audio.put_nowait(None)


async def test_a_void_speculation_and_its_whole_turn_share_one_turn_id(tmp_path: Path) -> None:
    """So the server keeps only the whole turn in the conversation's history."""
    sent: list[dict] = []
    stages = Stages(EchoAsr(), lambda: RecordingResponder(sent), DrainTts(), 24)  # type: ignore[arg-type]
    player = player_on(NullSink(), TimingLog(tmp_path / "timing.jsonl"))
    turns = Turns(SatelliteSettings(server="tcp://x:1"), stages, player, lambda: None)
    runs: asyncio.Queue = asyncio.Queue()

    def event(kind: EndpointKind, audio: bytes = b"") -> EndpointEvent:
        return EndpointEvent(kind, 1.0, 0.0, 0.9, audio)

    for utterance in (b"remind me", b"thanks"):
        await turns._handle(started(), runs)
        await turns._handle(event(EndpointKind.SPECULATE, utterance), runs)
        # the speculative run ends: its reply is written (and in the server's history)
        await wait_for(lambda: turns._speculation is not None and turns._speculation.task.done())
        if utterance == b"remind me":  # speech resumed after the speculative reply was written
            await turns._handle(event(EndpointKind.SPEECH_RESUMED), runs)
            utterance = b"remind me to buy milk"
            await turns._handle(event(EndpointKind.SPECULATE, utterance), runs)
        await turns._handle(event(EndpointKind.ENDPOINT, utterance), runs)
        await asyncio.wait_for(runs.get_nowait().task, 5.0)

    assert sent == [
        {"text": "remind me", "conversation_id": "kitchen", "turn_id": "run7-1"},
        {"text": "remind me to buy milk", "conversation_id": "kitchen", "turn_id": "run7-1"},
        {"text": "thanks", "conversation_id": "kitchen", "turn_id": "run7-2"},
    ]


class DeafToOneCancel:
    """An ASR stage whose wait swallows the first cancel, as 3.11's wait_for did when the
    cancel met an arriving event."""

    def __init__(self) -> None:
        self.cancels = 0
        self.waiting = asyncio.Event()

    async def transcribe(self, audio: bytes, clock: TurnClock) -> str:
        while True:
            try:
                self.waiting.set()
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancels += 1
                if self.cancels > 1:
                    raise


async def test_a_run_whose_stage_swallowed_the_cancel_is_cancelled_again() -> None:
    asr = DeafToOneCancel()
    stages = Stages(asr, lambda: RecordingResponder([]), DrainTts(), 24)  # type: ignore[arg-type]
    run = TurnRun(TurnClock(1), b"remind me", stages)
    await asr.waiting.wait()
    await run.cancel()
    assert run.task.cancelled() and asr.cancels == 2
