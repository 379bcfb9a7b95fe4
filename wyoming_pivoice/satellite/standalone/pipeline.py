"""The standalone satellite, one asyncio pipeline:

    capture → VAD ──events──► Turns ──runs──► Player
    (Listener)               │  each run: ASR → LLM → phrases → TTS → audio ─┘

(the stages' contracts: protocols.py)
- the `Listener` (listener.py, shared with the Home Assistant mode) reads the microphone,
  runs the wake word and the endpointer as its `WakeWindow` says, and the endpointing
  events are queued. It never waits for a reply, so the next utterance is captured
  while one plays.
- `Turns` makes turns out of those events: a run starts on `speculate` (before the
  silence window closes) or on `endpoint`; `speech-resumed` cancels a speculative run
  (its connections close, the server drops the work) and the turn goes on with all its
  audio; `endpoint` confirms the run and hands it to the player, in order.
- a `TurnRun` chains the server stages through queues: the Recognizer's transcript goes
  to the Responder, whose pieces a PhraseSplitter cuts into phrases for the Synthesizer,
  whose audio goes to the player — so the first phrase plays while the LLM still writes.
- `Player` plays confirmed runs one after the other (nothing of a run plays before its
  endpoint) and stops one on barge-in; the playing and the timing are the shared core's
  (turns.py: `Playback`, `TurnTimer`), the devices too (assemble.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ... import startup
from ...text import PhraseSplitter
from ...timing import TimingLog, TurnClock
from ..assemble import assemble, cut_on_interrupt, wake_word
from ..listener import Heard, Listener, WakeWindow
from ..protocols import (
    AudioSink,
    AudioSource,
    EndpointEvent,
    EndpointKind,
    Responder,
    Synthesizer,
    Transcriber,
)
from ..settings import SatelliteSettings
from ..stages import (
    AudioPiece,
    HeardMemo,
    Recognizer,
    ServerLink,
    StreamingResponder,
    StreamingSynthesizer,
    WholeResponder,
    WholeSynthesizer,
)
from ..turns import Playback, TurnTimer

_LOGGER = logging.getLogger(__name__)

# A barge-in waits this long at most for the speaker to stop and for the abandoned run's
# tasks to end: the next turn must not wait on them (CI, session 12: a barge-in's
# `interrupt` never returned, and the next question was never heard).
INTERRUPT_WAIT = 3.0
# …and cancels the run again this often meanwhile: a library's wait may swallow a cancel
# (3.11's wait_for did, where it met an arriving chunk; stages.py bounds its own waits now).
RECANCEL_EVERY = 0.25


@dataclass
class Stages:
    asr: Transcriber
    responder: Callable[[], Responder]  # one per turn: it keeps that turn's final text
    tts: Synthesizer
    min_clause_chars: int
    memo: HeardMemo = field(default_factory=HeardMemo)  # an interrupted reply, for the server


def make_stages(settings: SatelliteSettings, link: ServerLink) -> Stages:
    conversation_id = settings.conversation_id
    # Turn ids are unique per run, so a conversation id reused across runs is safe.
    session = uuid.uuid4().hex[:8]
    asr = Recognizer(link, settings.language)
    memo = HeardMemo()
    if settings.pipeline == "sequential":
        return Stages(
            asr,
            lambda: WholeResponder(link, conversation_id, session, memo),
            WholeSynthesizer(link),
            settings.min_clause_chars,
            memo,
        )
    return Stages(
        asr,
        lambda: StreamingResponder(link, conversation_id, session, memo),
        StreamingSynthesizer(link),
        settings.min_clause_chars,
        memo,
    )


# ---- one turn: ASR → LLM → phrases → TTS → audio -------------------------------------------


class TurnRun:
    """The server side of one turn, started at once; its audio waits in `audio` for the player."""

    def __init__(self, clock: TurnClock, utterance: bytes, stages: Stages) -> None:
        self.clock = clock
        self.utterance = utterance
        self.stages = stages
        self.audio: asyncio.Queue[AudioPiece | None] = asyncio.Queue()
        self.phrases: list[str] = []  # sent to TTS, in order: the reply as it is spoken
        self.task = asyncio.create_task(self._run(), name=f"turn {clock.turn}")

    async def _run(self) -> None:
        clock, stages = self.clock, self.stages
        tts: asyncio.Task[None] | None = None
        try:
            text = await stages.asr.transcribe(self.utterance, clock)
            clock.transcript = text
            if not text:
                clock.fail("no speech recognized")
                return
            phrases: asyncio.Queue[str | None] = asyncio.Queue()
            # TTS connects now, in parallel with the LLM, so the first phrase goes out at once.
            tts = asyncio.create_task(stages.tts.speak(phrases, self.audio, clock))
            splitter = PhraseSplitter(stages.min_clause_chars)
            responder = stages.responder()
            pieces: list[str] = []
            async for piece in responder.respond(text, clock):
                pieces.append(piece)
                for phrase in splitter.feed(piece):
                    self.phrases.append(phrase)
                    phrases.put_nowait(phrase)
            rest = splitter.flush()
            if rest:
                self.phrases.append(rest)
                phrases.put_nowait(rest)
            phrases.put_nowait(None)
            clock.reply = responder.final_text or "".join(pieces).strip()
            await tts
        except asyncio.CancelledError:
            raise
        except Exception as err:
            clock.fail(str(err))
            _LOGGER.warning("Turn %d failed: %s", clock.turn, err)
        finally:
            if tts is not None and not tts.done():
                tts.cancel()
                with contextlib.suppress(BaseException):
                    await tts
            self.audio.put_nowait(None)

    async def cancel(self) -> None:
        """Abandon the run: its tasks stop and its connections close (the server drops the work).
        Bounded: a run that does not end within INTERRUPT_WAIT, cancelled again every
        RECANCEL_EVERY, is left to end on its own."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + INTERRUPT_WAIT
        while not self.task.done():
            left = deadline - loop.time()
            if left <= 0:
                _LOGGER.warning("Turn %d's run did not end when cancelled: left", self.clock.turn)
                return
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=min(RECANCEL_EVERY, left))


# ---- events → turns -----------------------------------------------------------------------


class Turns:
    """Endpointing events → turn runs for the player, with speculation and barge-in."""

    def __init__(
        self,
        settings: SatelliteSettings,
        stages: Stages,
        player: Player,
        on_last_turn: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.stages = stages
        self.player = player
        self.timer = player.timer  # one numbering: the clocks it makes, the lines it writes
        self.on_last_turn = on_last_turn
        self._speech_start: float | None = None
        self._speculation: TurnRun | None = None
        self._cancelled = 0

    @property
    def count(self) -> int:
        """Utterances heard so far."""
        return self.timer.count

    def _clock(self) -> TurnClock:
        return self.timer.clock(self._speech_start)

    async def run(
        self, events: asyncio.Queue[EndpointEvent | None], runs: asyncio.Queue[TurnRun | None]
    ) -> None:
        try:
            while (event := await events.get()) is not None:
                await self._handle(event, runs)
        finally:
            if self._speculation is not None:
                await self._speculation.cancel()
            runs.put_nowait(None)

    async def _handle(self, event: EndpointEvent, runs: asyncio.Queue[TurnRun | None]) -> None:
        if event.kind is EndpointKind.SPEECH_STARTED:
            self.timer.next()
            self._speech_start = event.speech_start
            self._cancelled = 0
            _LOGGER.debug("Turn %d: speech started", self.count)
            if self.settings.barge_in and self.player.playing:
                await self.player.interrupt()
        elif event.kind is EndpointKind.SPECULATE:
            clock = self._clock()
            clock.mark("speculation_start", event.time)
            self._speculation = TurnRun(clock, event.audio, self.stages)
            _LOGGER.debug("Turn %d: speculating on %.2f s of audio", self.count, event.seconds)
        elif event.kind is EndpointKind.SPEECH_RESUMED:
            if self._speculation is not None:
                # A speculative reply already in the server's history is replaced there by
                # the whole turn's, which carries the same turn id.
                await self._speculation.cancel()
                self._speculation = None
                self._cancelled += 1
                _LOGGER.debug("Turn %d: speech resumed, speculation cancelled", self.count)
        elif event.kind is EndpointKind.ENDPOINT:
            run = self._speculation
            self._speculation = None
            if run is None:
                run = TurnRun(self._clock(), event.audio, self.stages)
            else:
                run.clock.speculation_used = True
            clock = run.clock
            clock.mark("last_voiced", event.last_voiced)
            clock.mark("endpoint", event.time)
            clock.mark("endpoint_heard")
            clock.speculation_cancelled = self._cancelled
            _LOGGER.debug(
                "Turn %d: endpoint after %.2f s of audio%s",
                self.count,
                event.seconds,
                " (speculation used)" if clock.speculation_used else "",
            )
            runs.put_nowait(run)
            self._speech_start = None
            if self.settings.max_turns and self.count >= self.settings.max_turns:
                self.on_last_turn()


# ---- playback -------------------------------------------------------------------------------


class Player:
    """Plays confirmed runs in order, through the shared playback driver; a barge-in stops
    the one playing."""

    def __init__(self, playback: Playback, timer: TurnTimer) -> None:
        self.playback = playback
        self.timer = timer
        self.playing = False
        self.turns = 0
        self._current: TurnRun | None = None
        self._interrupted = False

    async def run(self, runs: asyncio.Queue[TurnRun | None]) -> None:
        async with self.playback.running():
            while (run := await runs.get()) is not None:
                await self._play(run)
                self.timer.write(run.clock)
                self.turns += 1

    async def _play(self, run: TurnRun) -> None:
        self._current, self._interrupted = run, False
        playback = self.playback
        played = False
        playback.take_cut()  # a cut before this reply is not its own
        playback.begin()
        try:
            while (piece := await run.audio.get()) is not None and not self._interrupted:
                played = self.playing = True
                playback.play(piece.pcm, piece.fmt, piece.run)
                if self._cut_by_core(run):
                    break
            if played and not self._interrupted:
                await playback.drained()
                self._cut_by_core(run)
            await asyncio.wait({run.task})
        finally:
            self.playing = False
            self._current = None
        if played:
            self.timer.played(run.clock, playback)
        if self._interrupted:
            run.clock.interrupted = True
            # The server keeps only what began to play (a phrase the user heard the start of).
            run.stages.memo.heard = " ".join(run.phrases[: playback.runs])

    def _cut_by_core(self, run: TurnRun) -> bool:
        """The audio core stopped the speaker on a barge-in before the loop heard of it: the
        turn is interrupted as if `interrupt` had been called then."""
        at = self.playback.take_cut()
        if at is None:
            return False
        _LOGGER.info("Barge-in: the reply of turn %d was stopped", run.clock.turn)
        run.clock.mark("barge_in", at)
        self._interrupted = True
        run.task.cancel()
        return True

    async def interrupt(self) -> None:
        """Barge-in: stop the reply now and abandon the rest of its turn."""
        run = self._current
        if run is None or not self.playing:
            return
        _LOGGER.info("Barge-in: stopping the reply of turn %d", run.clock.turn)
        run.clock.mark("barge_in")
        self._interrupted = True
        stopped = self.playback.stop()
        if not (await asyncio.wait({stopped}, timeout=INTERRUPT_WAIT))[0]:
            _LOGGER.warning("The speaker did not confirm the stop of turn %d", run.clock.turn)
        self.playing = False
        await run.cancel()


# ---- the whole satellite ---------------------------------------------------------------------


class Satellite:
    def __init__(
        self,
        settings: SatelliteSettings,
        source: AudioSource | None = None,
        sink: AudioSink | None = None,
        timing: TimingLog | None = None,
        stages: Stages | None = None,
    ) -> None:
        """`source`/`sink`/`timing`/`stages` default to what the settings name; passing them
        lets a host (the bench) drive the microphone, collect each turn's timing and keep
        what the server is sent."""
        if settings.pipeline == "sequential" and settings.vad.speculate_ms:
            # The sequential pipeline is the baseline: no speculation either.
            settings = replace(settings, vad=replace(settings.vad, speculate_ms=0))
        if not settings.server:
            raise ValueError("standalone mode needs --server tcp://HOST:PORT")
        self.settings = settings
        ends = assemble(settings, source, sink)
        self.source, self.sink, self.endpointer = ends.source, ends.sink, ends.endpointer
        self.canceller = ends.canceller
        self.playback = Playback(self.sink, self.canceller)
        if settings.barge_in and not settings.wake_word:
            # The audio core stops the speaker itself on a barge-in, not waiting for the loop.
            cut_on_interrupt(self.source, self.playback, lambda: True)
        self.link = ServerLink(settings.server, retry_seconds=settings.server_retry_s)
        self.wake = wake_word(settings.wake_word)
        self.timing = timing or TimingLog(settings.timing_log)
        vad = settings.vad
        timer = TurnTimer(self.timing, settings.pipeline, vad.silence_ms, vad.speculate_ms)
        self.player = Player(self.playback, timer)
        self.listener = Listener(self.source, self.endpointer, self.wake)
        # With a wake word, speech reaches the endpointer only after it: the word itself barges in.
        on_wake = self.player.interrupt if settings.barge_in else None
        self.window = WakeWindow(self.listener, on_wake=on_wake)
        if settings.awake_wav or settings.done_wav:
            _LOGGER.warning("--awake-wav/--done-wav are played in Home Assistant mode only")
        self.stages = stages or make_stages(settings, self.link)
        self.turns = Turns(settings, self.stages, self.player, self.listener.stop)

    @property
    def turns_started(self) -> int:
        """Utterances heard so far (each becomes a turn once its endpoint comes)."""
        return self.turns.count

    @property
    def in_speech(self) -> bool:
        """The endpointer is inside an utterance (its endpoint is still to come)."""
        return self.endpointer.in_speech

    async def _listen(self, events: asyncio.Queue[EndpointEvent | None]) -> None:
        """The listener's endpointing events → `events`; None once the microphone ends."""

        async def heard(heard: Heard) -> None:
            for event in await self.window.heard(heard):
                events.put_nowait(event)

        try:
            await self.listener.load()
            end = await self.listener.run(self.window, heard)
            for event in self.endpointer.flush(end):
                events.put_nowait(event)
        finally:
            with contextlib.suppress(Exception):
                await self.source.close()
            events.put_nowait(None)

    async def run_until_signal(self) -> int:
        """`run`, with SIGTERM/SIGINT stopping it cleanly (the mic command and sinks closed)."""
        task = asyncio.ensure_future(self.run())
        startup.stop_on_signals(task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return 0

    async def run(self) -> int:
        """Run until the microphone ends (or --max-turns); returns the number of turns."""
        events: asyncio.Queue[EndpointEvent | None] = asyncio.Queue()
        runs: asyncio.Queue[TurnRun | None] = asyncio.Queue()
        tasks = [
            asyncio.create_task(self._listen(events), name="listener"),
            asyncio.create_task(self.turns.run(events, runs), name="turns"),
            asyncio.create_task(self.player.run(runs), name="player"),
        ]
        _LOGGER.info(
            "Satellite running (%s pipeline, server %s)",
            self.settings.pipeline,
            self.settings.server,
        )
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.sink.close()
            self.endpointer.close()
            if self.wake is not None:
                self.wake.close()
            self.timing.close()
        return self.player.turns
