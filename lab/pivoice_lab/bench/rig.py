"""A real satellite in this process, fed by a scripted microphone, one turn at a time.

The satellite is the real one (`satellite.standalone.pipeline.Satellite`: VAD endpointing,
speculation, the streaming or sequential stages, the player) talking to the real
server; only its microphone and speaker are replaced:

- `ScriptedMic` hands out an utterance at the pace of a capture device (chunk n is
  handed over once its last sample has been "captured", 32 ms after the previous one),
  then silence, as a quiet room would, until the bench releases it; between turns it
  gives nothing (the stream simply pauses).
- the speaker is a NullSink: the first reply sample is stamped when it is handed to
  the sink, where a real device would start playing it.

Every stamp is the satellite's own `time.monotonic()`; the mic adds one more, the
moment the utterance's first sample was "captured", from which the true end of speech
is known (the corpus records where the voice ends in each file).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

from wyoming_pivoice.audio import CHUNK_BYTES, CHUNK_SECONDS, NullSink, Pacer
from wyoming_pivoice.satellite import (
    Satellite,
    SatelliteSettings,
    ServerLink,
    Transcriber,
    VadSettings,
    make_stages,
)
from wyoming_pivoice.timing import TimingLog, TurnClock

SILENCE = bytes(CHUNK_BYTES)


@dataclass(eq=False)
class Said:
    """One utterance given to the mic: its audio and when its first sample was "captured"."""

    pcm: bytes
    started_at: float | None = None
    released: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)  # all its audio has been read


class ScriptedMic:
    """An AudioSource that plays what the bench gives it, in real time."""

    def __init__(self) -> None:
        self._items: asyncio.Queue[Said | None] = asyncio.Queue()
        self._current: Said | None = None
        # A capture device hands a chunk over once its last sample is in; the timeline is
        # fixed from the utterance's first sample (a late reader catches up).
        self._pacer = Pacer(lead=-CHUNK_SECONDS, late=None)
        self._sent = 0
        self.chunks = 0

    def play(self, pcm: bytes) -> Said:
        item = Said(pcm)
        self._items.put_nowait(item)
        return item

    def end(self) -> None:
        self._items.put_nowait(None)

    async def open(self) -> None:
        pass

    async def read(self) -> bytes | None:
        while True:
            if self._current is None:
                item = await self._items.get()
                if item is None:
                    return None
                self._current, self._sent = item, 0
                item.started_at = time.monotonic()
                self._pacer.reset(item.started_at)
            item = self._current
            offset = self._sent * CHUNK_BYTES
            if offset >= len(item.pcm):
                item.done.set()
                # Silence after the utterance until the bench releases it (or says more).
                if item.released or not self._items.empty():
                    self._current = None
                    continue
            await self._pacer.advance(CHUNK_SECONDS)
            chunk = item.pcm[offset : offset + CHUNK_BYTES]
            self._sent += 1
            self.chunks += 1
            return chunk.ljust(CHUNK_BYTES, b"\0") if chunk else SILENCE

    async def close(self) -> None:
        pass


class RecordingTiming(TimingLog):
    """Keeps each turn's record in memory instead of a file."""

    def __init__(self) -> None:
        super().__init__(None)
        self.records: list[dict[str, Any]] = []

    def write(self, clock: TurnClock) -> None:
        self.records.append(clock.record())


class RecordingRecognizer:
    """Wraps the satellite's own recognizer, keeping the audio of the turn in progress (for
    the replay); the bench takes it after each turn, so nothing piles up in a soak."""

    def __init__(self, inner: Transcriber) -> None:
        self.inner = inner
        self.audio: dict[int, bytes] = {}

    async def transcribe(self, audio: bytes, clock: TurnClock) -> str:
        self.audio[clock.turn] = audio
        return await self.inner.transcribe(audio, clock)

    def take(self, turn: int) -> bytes | None:
        audio = self.audio.get(turn)
        self.audio.clear()
        return audio


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    pipeline: str
    speculate_ms: int


@dataclass
class TurnOutcome:
    records: list[dict[str, Any]]
    started_at: float
    audio: bytes | None
    timed_out: bool = False


class Rig:
    """One satellite (one pipeline configuration), run a turn at a time."""

    def __init__(
        self,
        config: Config,
        server_uri: str,
        silence_ms: int,
        conversation_id: str | None = None,
        realtime_playback: bool = False,
        min_clause_chars: int | None = None,
    ) -> None:
        self.config = config
        vad = VadSettings(silence_ms=silence_ms, speculate_ms=config.speculate_ms)
        settings = SatelliteSettings(
            server=server_uri, pipeline=config.pipeline, vad=vad, conversation_id=conversation_id
        )
        if min_clause_chars is not None:
            settings = replace(settings, min_clause_chars=min_clause_chars)
        self.settings = settings
        self.mic = ScriptedMic()
        self.sink = NullSink(realtime=realtime_playback)
        self.timing = RecordingTiming()
        link = ServerLink(server_uri, retry_seconds=settings.server_retry_s)
        stages = make_stages(settings, link)
        self.recognizer = RecordingRecognizer(stages.asr)
        self.satellite = Satellite(
            settings,
            source=self.mic,
            sink=self.sink,
            timing=self.timing,
            stages=replace(stages, asr=self.recognizer),
        )
        self._task: asyncio.Task[int] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self.satellite.run(), name=f"rig {self.config.name}")

    async def turn(self, pcm: bytes, timeout: float) -> TurnOutcome:
        """Say `pcm`; return once every turn it started has been played and recorded."""
        sat = self.satellite
        first_record = len(self.timing.records)  # 0 unless a late turn came in between
        started_turns = sat.turns_started
        said = self.mic.play(pcm)
        deadline = time.monotonic() + timeout
        timed_out = False
        settled = 0
        while True:
            await asyncio.sleep(0.02)
            if self._task is not None and self._task.done():
                self._task.result()  # raises what killed the satellite
                raise RuntimeError("the satellite stopped")
            done = (
                said.done.is_set()
                and not sat.in_speech
                and sat.turns_started > started_turns
                and len(self.timing.records) - first_record >= sat.turns_started - started_turns
            )
            settled = settled + 1 if done else 0
            if settled >= 3:  # stable for 60 ms: no endpoint event still on its way
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
        said.released = True
        records = self.timing.records[first_record:]
        del self.timing.records[:]  # handed over: the rig keeps nothing between turns
        audio = self.recognizer.take(records[0]["turn"]) if records else None
        return TurnOutcome(records, said.started_at or 0.0, audio, timed_out)

    async def stop(self) -> None:
        self.mic.end()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 30)
            except asyncio.TimeoutError:
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
