"""Home Assistant satellite mode: serve the Wyoming satellite protocol that HA's Wyoming
integration drives (homeassistant/components/wyoming/assist_satellite.py).

HA is the TCP client: it connects, sends `run-satellite`, pings every ~2 s and sends
`describe` before each pipeline loop. We start a run with `run-pipeline` and stream
16 kHz mic audio up; HA answers with pipeline events and streams the reply down as
`audio-start`/`audio-chunk`/`audio-stop` at the rate in `audio-start`; we send `played`
once the speaker has really finished.

Every decision lives in `state.SatelliteMachine`; this module only turns the connections
(connection.py), the microphone (the shared listener.Listener), the speaker and the clock
into its inputs and carries out its actions. Inputs reach the machine synchronously and its
actions are handed on without waiting: events for HA go to the active connection's outbox
(its own writer task, each write bounded), playback steps to the shared playback driver
(turns.Playback: its own task, a stop pre-empts the step that is running). So no input waits
on I/O, and the clock's deadlines fire whatever a socket or the speaker is doing. The turn's
clock is the shared turns.TurnTimer's; the devices are built by assemble.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import wave
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioFormat, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.pipeline import PipelineStage, RunPipeline
from wyoming.satellite import PauseSatellite, RunSatellite
from wyoming.server import AsyncServer, AsyncStdioServer
from wyoming.snd import Played
from wyoming.timer import TimerCancelled, TimerFinished, TimerStarted, TimerUpdated
from wyoming.tts import Synthesize
from wyoming.vad import VoiceStarted, VoiceStopped
from wyoming.wake import Detect, Detection

from ... import startup
from ...audio.format import CHANNELS, CHUNK_BYTES, RATE, WIDTH
from ...audio.pacing import AUDIO_NICE, AUDIO_RT_PRIORITY, raise_thread
from ...audio.pcm import AudioFormatError, check_format
from ...realtime import timeout
from ...timing import TimingLog, TurnClock
from ...wire.errors import ErrorCode
from ...zeroconf import Advertiser, default_name
from ..assemble import assemble, cut_on_interrupt, wake_word
from ..endpoint import EndpointKind
from ..listener import Heard, Listener
from ..protocols import AudioSink, AudioSource, EndpointDetector, WakeDetector
from ..settings import DEFAULT_HA_PORT, SatelliteSettings
from ..turns import Playback, TurnTimer
from ..wake import wake_key
from . import machine as state
from .connection import Connections, HaConnection
from .follow import Follow, ha_entity_id
from .info import satellite_info
from .sounds import ring_tone

if TYPE_CHECKING:
    from ...audio.echo import EchoCanceller

_LOGGER = logging.getLogger(__name__)

TICK_SECONDS = 0.1  # the machine's deadlines only: a barge-in reaches the loop with its frame
# The event loop's priority (serve_ha_satellite). From the audio thread's barge-in decision to
# run-pipeline handed to HA's socket, test_ha_barge_in beside 16 busy processes (load 19-26,
# 12 barge-ins each): normal 2-25 ms (median 7), nice -10 2-10 (2.5), SCHED_RR 5 1-3 (2).
LOOP_RT_PRIORITY = AUDIO_RT_PRIORITY - 5
SHUTDOWN_STEP = 0.5  # each part of the shutdown
HOLD_MAX_BYTES = int(state.Timeouts.max_stream * RATE * WIDTH)  # a held barge-in's audio
# After the audio core cut a playback on the user's voice, the endpointer's speech-started on
# the same frames follows on the loop (the same turn_policy.decide); a playback that ends by
# such a cut is reported done only if that barge-in has not come within this long.
CUT_GRACE = 1.0
# Over a reply the echo rule counts the user's first frames late (run-pipeline 230-780 ms after
# the voice began, in the −6 dB room): the endpointer's 300 ms pre-speech then missed the
# first word's start (0.83 s of stream for 0.93 s of voice). A barge-in's run starts this far
# back in the (echo-cancelled) mic audio instead.
BARGE_IN_LEAD_CHUNKS = round(1.0 * RATE * WIDTH / CHUNK_BYTES)

_PROGRESS = {
    Transcribe.is_type: "transcribe",
    VoiceStarted.is_type: "voice-started",
    VoiceStopped.is_type: "voice-stopped",
    Detect.is_type: "detect",
    Detection.is_type: "detection",
    Synthesize.is_type: "synthesize",
}


class HaSatellite:
    """The satellite's I/O around the state machine."""

    def __init__(
        self,
        settings: SatelliteSettings,
        source: AudioSource,
        sink: AudioSink,
        endpointer: EndpointDetector,
        wake: WakeDetector | None = None,
        timeouts: state.Timeouts | None = None,
        remote_wake: bool | None = None,
        canceller: EchoCanceller | None = None,
    ) -> None:
        self.settings = settings
        self.source = source
        self.sink = sink
        self.endpointer = endpointer
        self.wake = wake
        self.listener = Listener(source, endpointer, wake)
        if remote_wake is None:  # --remote-wake: stream to HA and let it find the wake word
            remote_wake = settings.remote_wake
        self.remote_wake = remote_wake
        self.wake_name = wake_key(wake.name) if wake is not None else None
        # None: the built-in ring ("" turns the timer's sound off).
        timer_wav = settings.timer_finished_wav
        self.sound_paths: dict[str, str | None] = {
            name: path
            for name, path in (
                ("awake", settings.awake_wav),
                ("done", settings.done_wav),
            )
            if path
        }
        if timer_wav != "":
            self.sound_paths["timer"] = timer_wav
        self.machine = state.SatelliteMachine(
            remote_wake=self.remote_wake,
            sounds=frozenset(self.sound_paths),
            timeouts=timeouts,
            barge_in=settings.barge_in,
            ring_repeat=settings.timer_repeat,
            ring_delay=settings.timer_delay,
        )
        self.info: Info = satellite_info(
            settings.name or default_name("satellite"),
            settings.area,
            self.remote_wake,
            self.wake_name,
            wake.phrase if wake is not None else None,
        )
        self.timer = TurnTimer(TimingLog(settings.timing_log), "ha", settings.vad.silence_ms)
        self.playback = Playback(sink, canceller)
        self.connections = Connections(
            self.handle_event,
            on_connect=self._ha_connected,
            on_disconnect=lambda: self._apply(self.machine.disconnect(time.monotonic())),
        )
        self._mic_wanted = asyncio.Event()
        self._done = asyncio.Event()
        self.exit_code = 0
        self._prespeech = b""
        self._recent: deque[bytes] = deque(maxlen=BARGE_IN_LEAD_CHUNKS)  # the mic's last second
        self._held = bytearray()  # mic audio of a barge-in held until HA's last run ends
        self._stream_ms = 0
        self._sounds: dict[str, tuple[bytes, AudioFormat]] = {}
        self._clock: TurnClock | None = None
        self._server: AsyncServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        # Barge-in without waiting for the event loop, as standalone: the audio thread stops
        # the speaker itself when the turn policy says INTERRUPT, over what the machine lets
        # speech stop (a snapshot the loop keeps, read on the audio thread).
        self._barge_in_open = False
        if wake is None:
            cut_on_interrupt(source, self.playback, lambda: self._barge_in_open)
        self.follow: Follow | None = None
        if settings.server:  # our server is HA's agent: speak its reply as it is written
            self.follow = Follow(
                settings.server,
                settings.ha_entity_id or ha_entity_id(self.info.satellite.name),  # type: ignore[union-attr]
                settings.min_clause_chars,
                on_joined=self._follow_joined,
                on_audio=lambda piece: self._apply(
                    self.machine.follow_audio(time.monotonic(), piece.pcm, piece.fmt)
                ),
                on_text=lambda text: self._apply(self.machine.follow_text(time.monotonic(), text)),
                on_done=lambda: self._apply(self.machine.follow_done(time.monotonic())),
                clock=lambda: self._clock,
            )

    # ---- running -----------------------------------------------------------------------------

    async def serve(self, server: AsyncServer) -> int:
        """Serve until the microphone ends (and the turn in flight is finished) or a signal."""
        await self.start(server)
        return await self.wait()

    async def start(self, server: AsyncServer) -> None:
        """Listen (raises OSError if the address is taken), start the mic and the clock."""
        await server.start(self.connections.factory)
        self._server = server
        _LOGGER.info("Home Assistant satellite listening on %s", self.settings.uri)
        self._tasks = [
            asyncio.create_task(self._mic_loop(), name="satellite mic"),
            asyncio.create_task(self._tick_loop(), name="satellite clock"),
            asyncio.create_task(self.playback.run(), name="satellite speaker"),
        ]
        if self.follow is not None:
            self._tasks.append(asyncio.create_task(self.follow.run(), name="satellite follow"))

    async def wait(self) -> int:
        """Block until stopped, then shut everything down; returns the exit code."""
        try:
            await self._done.wait()
        finally:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=SHUTDOWN_STEP)
            await self._shutdown()
            _LOGGER.info("Stopped")
        return self.exit_code

    async def _shutdown(self) -> None:
        """Every step bounded: a stop must not hang on a stuck peer, speaker or mic."""
        self.connections.abort_all()
        steps: list[tuple[str, Awaitable[object]]] = [
            ("microphone", self.source.close()),
            ("speaker", self.sink.close()),
        ]
        if self._server is not None:
            steps.insert(0, ("server", self._server.stop()))
        for name, step in steps:
            try:
                async with timeout(SHUTDOWN_STEP * 2):
                    await step
            except Exception as err:
                _LOGGER.warning("Stopping the %s failed: %r", name, err)
        self.endpointer.close()
        if self.wake is not None:
            self.wake.close()
        self._finish_turn(force=True)
        self.timer.close()

    def stop(self, code: int = 0) -> None:
        self.exit_code = code
        self._done.set()

    async def stopped(self) -> None:
        await self._done.wait()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:  # nothing here waits: the clock is what gets us out of lost events
                self._apply(self.machine.tick(time.monotonic()))
            except Exception:
                _LOGGER.exception("Clock tick failed")

    # ---- events from Home Assistant ----------------------------------------------------

    async def handle_event(self, conn: HaConnection, event: Event) -> bool:
        """Events from any connection; only the active one drives the satellite."""
        try:
            now = time.monotonic()
            if Describe.is_type(event.type):
                await conn.reply(self.info.event())
                if conn.active:
                    self.machine.heard(time.monotonic())
                return True
            if Ping.is_type(event.type):
                # Answered at once: HA drops us after 5 s without a pong.
                await conn.reply(Pong(text=event.data.get("text")).event())
                conn.last_ping = now
                if conn.active:
                    self.machine.heard(time.monotonic(), ping=True)
                return True
            if not await self.connections.claim(conn):
                _LOGGER.warning("Refusing %s: another Home Assistant is connected", conn.peer)
                await conn.refuse(
                    "satellite busy: another Home Assistant connection is active", ErrorCode.BUSY
                )
                return False
            now = time.monotonic()
            self.machine.heard(now)
            self._dispatch(event, now)
            return conn.active
        except (ConnectionError, OSError):
            raise
        except Exception:  # an odd event must never take the satellite down
            _LOGGER.exception("Ignoring event %s that could not be handled", event.type)
            return True

    def _dispatch(self, event: Event, now: float) -> None:
        kind, data, m = event.type, event.data, self.machine
        if RunSatellite.is_type(kind):
            self._mic_wanted.set()
            self._apply(m.run_satellite(now))
        elif PauseSatellite.is_type(kind):
            _LOGGER.info("Paused by Home Assistant")
            self._apply(m.pause_satellite(now))
        elif Pong.is_type(kind):
            pass
        elif AudioStart.is_type(kind):
            fmt = _audio_format(data)
            if fmt is not None:
                self._apply(m.audio_start(now, fmt))
        elif AudioChunk.is_type(kind):
            fmt = _audio_format(data, quiet=True)
            self._apply(m.audio_chunk(now, event.payload or b"", fmt))
        elif AudioStop.is_type(kind):
            self._apply(m.audio_stop(now))
        elif Transcript.is_type(kind):
            text = data.get("text")
            _LOGGER.info("Transcript: %r", text)
            if self._clock is not None:
                self._clock.mark_once("transcript", now)
                self._clock.transcript = str(text or "")
            self._apply(m.transcript(now, str(text) if text is not None else None))
            if self.follow is not None and text and m.phase is state.Phase.WAITING:
                self.follow.heard(str(text))
        elif Error.is_type(kind):
            _LOGGER.warning(
                "Home Assistant pipeline error: %s (%s)", data.get("text"), data.get("code")
            )
            if self._clock is not None:
                self._clock.fail(f"{data.get('code')}: {data.get('text')}")
            self._apply(m.error(now))
        elif (what := _progress(kind)) is not None:
            _LOGGER.debug("Home Assistant: %s %s", kind, data)
            if what in ("detection", "transcribe") and m.in_turn is False and m.streaming:
                self._start_turn()  # remote wake: HA heard its wake word
            if what == "synthesize" and self._clock is not None:
                self._clock.reply = str(data.get("text") or "")
            if what == "synthesize" and self.follow is not None and not m.following:
                self.follow.void()  # HA answered this run itself (its own intent)
            self._apply(m.progress(now, what, str(data.get("text") or "")))
        elif TimerFinished.is_type(kind):
            _LOGGER.info("Timer finished: %s", data.get("id"))
            self._apply(m.timer_finished(now))
        elif any(t.is_type(kind) for t in (TimerStarted, TimerUpdated, TimerCancelled)):
            _LOGGER.info("Timer event %s: %s", kind, data)
        elif RunPipeline.is_type(kind):
            try:
                run = RunPipeline.from_event(event)
            except (KeyError, ValueError) as err:
                _LOGGER.warning("Ignoring a malformed run-pipeline: %s", err)
                return
            actions = m.remote_run_pipeline(
                now, run.start_stage.value, run.end_stage.value, run.announce_text
            )
            if any(isinstance(action, state.SendRunPipeline) for action in actions):
                self._start_turn()
            self._apply(actions)
        else:
            _LOGGER.debug("Ignoring event %s", kind)
        self._finish_turn()

    # ---- the microphone: the shared listener, gated by the machine ----------------------

    def wants_speech(self, now: float) -> bool:
        """The endpointer runs while a local run may start or is streaming, and (without a
        wake word, which then does it) over a reply, an announcement or a ringing timer,
        whose echo the canceller takes out and the endpointer's echo rule discounts."""
        m = self.machine
        if self.remote_wake:
            return False
        if m.holding or (m.streaming and m.stage == "asr"):
            return m.playback is state.Playback.IDLE  # not over our own awake sound
        if m.accepts_barge_in:
            return self.wake is None
        if m.playback is not state.Playback.IDLE:
            return False
        return m.phase is state.Phase.LISTENING and self.wake is None

    def wants_wake(self, now: float) -> bool:
        return self.machine.accepts_trigger or self.machine.accepts_barge_in

    async def _mic_loop(self) -> None:
        """Capture starts when HA first says run-satellite and goes on for good."""
        await self._mic_wanted.wait()
        try:
            await self.listener.run(self, self._heard)
        except Exception as err:  # reads are retried and chunks contained: this is the open
            _LOGGER.error("Cannot open the microphone: %s", err)
            self.stop(1)
            return
        _LOGGER.info("Microphone ended: finishing the turn in flight")
        self._apply(self.machine.mic_ended(time.monotonic()))

    async def _heard(self, heard: Heard) -> None:
        """Nothing here waits: the machine sees this chunk's inputs in one go."""
        m, now = self.machine, time.monotonic()
        self._recent.append(heard.chunk)
        # What an utterance keeps of the chunk (core.UtteranceAudio: the mic as captured while
        # a reply may be heard), as standalone's utterance: the canceller's output takes
        # syllables off a voice over a reply. Whisper on test_ha_barge_in's streams at load
        # 16-27: key words 8/12 (4 runs) from the output, 15/24 (8 runs) kept; "How cold is it
        # outside?" 0/4 from the output ("I'm going to be inside"), 7/8 kept; "What time" 3/4
        # and 1/8 ("one time, is it?").
        keep: Callable[[bytes], bytes] | None = getattr(self.endpointer, "kept_audio", None)
        kept = heard.chunk if keep is None else keep(heard.chunk)
        if m.streaming:
            self._send_mic(kept)  # before the events: it belongs to this stream
        elif m.holding and len(self._held) < HOLD_MAX_BYTES:
            self._held += kept
        if heard.wake:
            if m.accepts_barge_in:
                self._barge_in(now, self.wake_name)
            else:
                self._start_turn()
                self._apply(m.trigger(now, self.wake_name))
        for ev in heard.events:
            if ev.kind is EndpointKind.SPEECH_STARTED:
                if self.wake is None and m.accepts_barge_in:
                    # As for a trigger its start goes up first, from further back: the
                    # canceller's output before the utterance's own (kept) audio. The mic
                    # as captured there too gave Whisper the reply's words ("it wasn't a
                    # little time, is it?"; "little robot things." for "Thanks.").
                    lead = b"".join(self._recent)
                    older = lead[: max(0, len(lead) - len(ev.audio))]
                    self._prespeech = older + ev.audio
                    self._barge_in(now, None, ev.speech_start, heard.time)
                elif self.wake is None and m.accepts_trigger:
                    self._prespeech = ev.audio  # pre-speech + speech so far, this chunk too
                    self._start_turn()
                    if self._clock is not None:
                        self._clock.mark("speech_start", ev.speech_start)
                    self._apply(m.trigger(now))
                elif m.streaming or m.holding:
                    if self._clock is not None:
                        self._clock.mark_once("speech_start", ev.speech_start)
                    self._apply(m.speech_started(now))
            elif ev.kind is EndpointKind.SPECULATE and self.follow is not None:
                if m.streaming and m.stage == "asr":  # HA's stream goes on untouched
                    self.follow.speculate(ev.audio)
            elif ev.kind is EndpointKind.SPEECH_RESUMED and self.follow is not None:
                self.follow.void()
            elif ev.kind is EndpointKind.ENDPOINT and (m.streaming or m.holding):
                if self._clock is not None:
                    self._clock.mark("last_voiced", ev.last_voiced)
                    self._clock.mark("endpoint", ev.time)
                self._apply(m.endpoint(now))
        self._finish_turn()

    def _barge_in(
        self,
        now: float,
        wake_word: str | None,
        speech_start: float | None = None,
        captured: float | None = None,
    ) -> None:
        """The standalone rule over a reply: stop it now, and the speech starts the next run."""
        cut_at = self.playback.take_cut()  # the audio core's cut, if it came first
        # Where a barge-in's time goes (the HA tests read it): the chunk that decided, the
        # audio thread's cut, the loop getting here, run-pipeline written (connection.py).
        _LOGGER.info(
            "Barge-in on the loop at %.3f: chunk captured at %.3f, audio thread's cut at %s",
            now, captured or now, "none" if cut_at is None else f"{cut_at:.3f}",
        )  # fmt: skip
        if self._clock is not None:
            self._clock.mark("barge_in", cut_at if cut_at is not None else now)
            self._clock.interrupted = True
        self._start_turn()
        if self._clock is not None and speech_start is not None:
            self._clock.mark("speech_start", speech_start)
        self._apply(self.machine.barge_in(now, wake_word))

    def _send_mic(self, audio: bytes) -> None:
        self.connections.send(
            AudioChunk(
                rate=RATE, width=WIDTH, channels=CHANNELS, audio=audio, timestamp=self._stream_ms
            ).event()
        )
        self._stream_ms += len(audio) * 1000 // (RATE * WIDTH * CHANNELS)

    # ---- carrying out the machine's actions --------------------------------------------------

    def _apply(self, actions: list[state.Action]) -> None:
        """Hand the actions on, in order; none of them waits."""
        if self._done.is_set():
            return  # shutting down: the mic, speaker and connections are being closed
        for action in actions:
            try:
                self._do(action)
            except Exception:  # one failed action (a broken speaker) must not skip the rest
                _LOGGER.exception("Action %s failed", action)
        self._barge_in_open = self.machine.accepts_barge_in and not self.remote_wake
        self._finish_turn()  # the turn clock closes as soon as the machine leaves the turn

    def _do(self, action: state.Action) -> None:
        playback = self.playback
        if isinstance(action, state.SendRunPipeline):
            _LOGGER.info("Starting a run: %s → %s", action.start_stage, action.end_stage)
            self.connections.send(
                RunPipeline(
                    start_stage=PipelineStage(action.start_stage),
                    end_stage=PipelineStage(action.end_stage),
                    wake_word_name=action.wake_word_name,
                    announce_text=action.announce_text,
                ).event()
            )
        elif isinstance(action, state.SendDetection):
            self.connections.send(Detection(name=action.name).event())
        elif isinstance(action, state.StartStream):
            self._stream_ms = 0
            self.connections.send(
                AudioStart(rate=RATE, width=WIDTH, channels=CHANNELS, timestamp=0).event()
            )
            prespeech, self._prespeech = self._prespeech, b""
            held, self._held = bytes(self._held), bytearray()
            if not action.with_prespeech:
                prespeech = b""
            audio = prespeech + held  # a held barge-in's audio follows its start
            for offset in range(0, len(audio), CHUNK_BYTES):
                self._send_mic(audio[offset : offset + CHUNK_BYTES])
        elif isinstance(action, state.StopStream):
            if action.send_audio_stop:
                self.connections.send(AudioStop(timestamp=self._stream_ms).event())
            _LOGGER.info("Streamed %.2f s of audio", self._stream_ms / 1000)
        elif isinstance(action, state.SendPlayed):
            self.connections.send(Played().event())
        elif isinstance(action, state.SendPing):
            self.connections.send(Ping(text="pivoice keepalive").event())
        elif isinstance(action, state.StartPlayback):
            _LOGGER.info("Playing audio at %s Hz", action.fmt.rate)
            playback.begin()
        elif isinstance(action, state.PlayAudio):
            if self._clock is not None:
                self._clock.mark_once("tts_first_audio")
            playback.play(action.audio, action.fmt)
        elif isinstance(action, state.FinishPlayback):
            playback.finish(partial(self._playback_done, action.generation, True))
        elif isinstance(action, state.StopPlayback):
            playback.stop()
        elif isinstance(action, state.PlaySound):
            playback.sound(
                action.name,
                partial(self._load_sound, action.name),
                partial(self._playback_done, action.generation, False),
            )
        elif isinstance(action, state.StopFollow):
            if self.follow is not None:
                self.follow.stop()
        elif isinstance(action, state.ResetDetector):
            self.endpointer.reset()
            if self.wake is not None:
                task = asyncio.create_task(self.wake.async_reset())
                self._background.add(task)  # keep a reference until it is done
                task.add_done_callback(self._background.discard)
        elif isinstance(action, state.CloseConnection):
            self.connections.close_active(action.reason)
        elif isinstance(action, state.Exit):
            self.stop(action.code)

    def _ha_connected(self) -> None:
        if self.follow is not None:
            self.follow.ha_connected()
        self._apply(self.machine.connect(time.monotonic()))

    def _follow_joined(self) -> bool:
        """Our server joined this run's turn: the machine says whether to speak it."""
        self._apply(self.machine.follow_joined(time.monotonic()))
        return self.machine.following

    def _playback_done(self, generation: int, reply: bool, late: bool = False) -> None:
        """The speaker really played playback `generation` (or failed): tell the machine."""
        if self.playback.cut_pending:
            if not late and generation == self.machine.generation:
                # The audio core cut it on the user's voice: the barge-in that follows ends
                # it with that speech. Reported first, the reply would end as if played out
                # and a ring's end would reset the endpointer, losing the speech's frames.
                loop = asyncio.get_running_loop()
                loop.call_later(CUT_GRACE, self._playback_done, generation, reply, True)
                return
            if late:
                self.playback.take_cut()  # no barge-in came: the cut was the policy's alone
        now = time.monotonic()
        clock = self._clock
        if reply and clock is not None and generation == self.machine.generation:
            self.timer.played(clock, self.playback, now)
        self._apply(self.machine.playback_done(now, generation))

    async def _load_sound(self, name: str) -> tuple[bytes, AudioFormat]:
        if name not in self._sounds:
            path = self.sound_paths.get(name)
            if path is None:  # the timer's own ring
                self._sounds[name] = ring_tone()
            else:
                self._sounds[name] = await asyncio.to_thread(_read_wav, path)
        return self._sounds[name]

    # ---- per-turn timing ---------------------------------------------------------------------

    def _start_turn(self) -> None:
        self._finish_turn(force=True)
        self._clock = self.timer.start()

    def _finish_turn(self, force: bool = False) -> None:
        clock = self._clock
        if clock is None or (self.machine.in_turn and not force):
            return
        self._clock = None
        self.timer.write(clock, f"turn ended {self.machine.describe()} without a played reply")


def _progress(kind: str) -> str | None:
    for is_type, what in _PROGRESS.items():
        if is_type(kind):
            return what
    return None


def _audio_format(data: dict[str, Any], quiet: bool = False) -> AudioFormat | None:
    try:
        return check_format(data.get("rate"), data.get("width"), data.get("channels"))
    except AudioFormatError as err:
        if not quiet:
            _LOGGER.warning("Ignoring audio in an unusable format: %s", err)
        return None


def _read_wav(path: str) -> tuple[bytes, AudioFormat]:
    with wave.open(path, "rb") as wav:
        return (
            wav.readframes(wav.getnframes()),
            AudioFormat(wav.getframerate(), wav.getsampwidth(), wav.getnchannels()),
        )


# ---- entry point ---------------------------------------------------------------------------


async def serve_ha_satellite(settings: SatelliteSettings) -> int:
    """`wyoming-pivoice satellite --uri …`: runs until the microphone ends or a signal."""
    if not settings.uri:
        raise ValueError("Home Assistant mode needs --uri")
    from ..wake import WakeWordError

    # This loop turns a barge-in into `played` + `run-pipeline`: above the models, below the
    # audio threads; the threads it starts (executors: the wake word) stay normal.
    raise_thread("event loop", rt=LOOP_RT_PRIORITY, nice=AUDIO_NICE, inherit=False)

    try:
        local = None if settings.remote_wake else settings.wake_word
        wake = await asyncio.to_thread(wake_word, local)
    except WakeWordError as err:
        _LOGGER.error("%s", err)
        return 2
    d = assemble(settings)
    satellite = HaSatellite(settings, d.source, d.sink, d.endpointer, wake, canceller=d.canceller)
    try:
        server = AsyncServer.from_uri(settings.uri)
    except ValueError as err:
        _LOGGER.error("%s", err)
        return 2
    if isinstance(server, AsyncStdioServer):
        _LOGGER.error("Home Assistant connects over the network: use --uri tcp://HOST:PORT")
        return 2
    try:
        await satellite.start(server)
    except OSError as err:
        _LOGGER.error("Cannot serve %s: %s", settings.uri, err)
        return 1

    startup.stop_on_signals(satellite.stop)
    advertiser: Advertiser | None = None
    try:
        # After listening: describe is answered meanwhile. A stop does not wait for it.
        loading = asyncio.ensure_future(satellite.listener.load())
        stopping = asyncio.ensure_future(satellite.stopped())
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if loading.done():
            loading.result()  # raises what the load raised
            advertiser = await startup.advertise(
                settings.zeroconf, server, settings.uri, "satellite", DEFAULT_HA_PORT
            )
        else:
            loading.cancel()
    except Exception as err:
        _LOGGER.error("Cannot start the satellite: %s", err)
        satellite.stop(1)
    try:
        return await satellite.wait()
    finally:
        # Its goodbye packets are a courtesy: a stop does not wait long for them.
        await startup.withdraw(advertiser, SHUTDOWN_STEP)
