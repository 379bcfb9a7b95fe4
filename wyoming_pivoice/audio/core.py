"""The real-time audio core: the microphone, the echo canceller and the VAD on their own thread.

    mic ─► [core thread: read ─► AEC3 (reference from the speaker thread) ─► Silero] ─► frames
                                                                                      │
    event loop: listener ◄── finished frames (chunk, capture time, probability, evidence)

The thread runs its own small event loop for the microphone (so every source kind, with
its restarts and backoff, is the same code as before) at a priority above the model work
(pacing.raise_thread), and does nothing else: a late main loop delays decisions,
never the capture, so the canceller's two streams stay aligned. The speaker has its own
thread (speaker.ContinuousSink) that reports what it writes to the canceller. The main
loop gets each chunk with its capture time, its VAD probability and the canceller's
evidence for turn_policy, all computed when the chunk came in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from ..satellite.endpoint import Endpointer, Vad
from ..satellite.protocols import AudioSink, AudioSource, Hearing
from ..satellite.turn_policy import Decision, Evidence, TurnPolicy, decide, suspect
from .echo import EchoCanceller
from .format import CHUNK_SECONDS
from .mic import WavSource
from .pacing import raise_thread

_LOGGER = logging.getLogger(__name__)

MAX_QUEUED_SECONDS = 10.0  # frames the main loop has not taken yet (a file source waits)
# The fast barge-in forgets a candidate after this many frames the policy ignores (the
# endpointer keeps it longer, so whatever the fast path stops, the endpointer starts too).
FAST_FORGET_FRAMES = 3
READ_RETRY_S = 1.0
CLOSE_WAIT = 3.0


@dataclass(frozen=True)
class Frame:
    """One finished microphone chunk."""

    chunk: bytes  # echo removed
    time: float  # monotonic time it was captured (read, on the core thread)
    probability: float | None  # Silero's, on `chunk`
    hearing: Hearing
    evidence: Evidence | None
    kept: bytes | None = None  # what an utterance keeps of this chunk (UtteranceAudio)


class UtteranceAudio:
    """What an utterance keeps of each chunk: the canceller's output, except while a reply or
    its echo's tail may be heard, where it keeps the microphone as captured (aligned to the
    output, which lags the input by EchoCanceller.delay_samples). The VAD and the turn policy still
    judge the output.

    Over a reply AEC3's double-talk suppression takes whole syllables off the voice ("third
    on occasion lights" for "turn on the kitchen lights"); Whisper hears words through the
    echo better than through those holes. Offline (lab room.words, 36 commands over a Piper
    reply at the echo's level in the two target rooms, 18 in a headset, tiny.en): key words
    over the echo 28/36 with the output, 31/36 with this; headset 17/18 both; WER over the
    echo 0.25 → 0.29 (the same at −6 dB, 0.20 → 0.28 at −3 dB: some of the reply's words).
    """

    def __init__(self) -> None:
        self._held = b""  # the microphone's last `delay` samples, not yet aligned

    def chunk(self, captured: bytes, cleaned: bytes, playing: bool, delay: int) -> bytes:
        """`cleaned` is `captured` `delay` samples (EchoCanceller.delay_samples) later."""
        held = bytes(max(0, 2 * delay - len(self._held))) + self._held + captured
        aligned, self._held = held[: len(captured)], held[len(captured) :]
        return aligned if playing else cleaned


class CoreSource:
    """An AudioSource whose chunks were read, echo-cancelled and VAD-scored on the audio core
    thread. The endpointer takes each chunk's probability and evidence from here."""

    def __init__(
        self,
        source: AudioSource,
        canceller: EchoCanceller | None,
        endpointer: Endpointer | None,
        live: bool = True,
    ) -> None:
        self.source = source
        self.canceller = canceller
        self.endpointer = endpointer
        self.live = live  # a device or command: worth real-time priority
        self.chunk_time: float | None = None
        self.frame: Frame | None = None  # the chunk read last
        self._queue: asyncio.Queue[Frame | None] | None = None
        self._room = threading.Semaphore(int(MAX_QUEUED_SECONDS / CHUNK_SECONDS))
        self._thread: threading.Thread | None = None
        self._core_loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._reset_vad = threading.Event()
        # Barge-in without waiting for the event loop: called on this thread when the turn
        # policy says INTERRUPT (both fronts set it: the speaker's `cut`); True when it cut a
        # reply (the policy says INTERRUPT on every chunk of the voice until the loop has
        # taken the utterance: a late loop, many calls).
        self.on_interrupt: Callable[[], bool] | None = None
        # Holding the reply while the voice over it is not certain yet (turn_policy.suspect),
        # and letting it play on: called on this thread; `on_hold` True when it held one.
        self.on_hold: Callable[[], bool] | None = None
        self.on_release: Callable[[], None] | None = None
        self._read: asyncio.Future[bytes | None] | None = None
        self._fast = FastBargeIn(endpointer.logic.policy if endpointer else TurnPolicy())
        self._linear: LinearScore | None = None  # the VAD on the linear filter's output
        self._kept = UtteranceAudio()
        if endpointer is not None:
            endpointer.frame_probability = self._probability_of
            endpointer.kept_audio = self._kept_of
            endpointer.on_reset = self._reset_vad.set
            endpointer.hearing = self._hearing
            endpointer.evidence = self._evidence

    # ---- what the endpointer asks of the chunk just read ------------------------------------

    def _probability_of(self, chunk: bytes) -> float | None:
        frame = self.frame
        return frame.probability if frame is not None and frame.chunk is chunk else None

    def _kept_of(self, chunk: bytes) -> bytes:
        frame = self.frame
        if frame is None or frame.chunk is not chunk or frame.kept is None:
            return chunk
        return frame.kept

    def _hearing(self) -> Hearing:
        frame = self.frame
        return frame.hearing if frame is not None else Hearing.CLEAR

    def _evidence(self, probability: float) -> Evidence:
        frame = self.frame
        if frame is None or frame.evidence is None:
            return Evidence(probability)
        return replace(frame.evidence, probability=probability)

    # ---- AudioSource ----------------------------------------------------------------------

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._stopping.clear()
        opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(loop, self._queue, opened), name="pivoice audio", daemon=True
        )
        self._thread.start()
        await asyncio.wrap_future(opened)  # the source's own errors are raised here

    async def read(self) -> bytes | None:
        if self._queue is None:
            return None
        frame = await self._queue.get()
        if frame is None:
            self._queue.put_nowait(None)  # stays ended
            return None
        self._room.release()
        self.frame = frame
        self.chunk_time = frame.time
        return frame.chunk

    async def close(self) -> None:
        self._stopping.set()
        self._room.release()  # a thread waiting for room wakes and sees the stop
        core_loop, thread = self._core_loop, self._thread
        if core_loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # a read under way ends now
                core_loop.call_soon_threadsafe(self._cancel_read)
        if thread is not None:
            await asyncio.to_thread(thread.join, CLOSE_WAIT)
            if thread.is_alive():
                _LOGGER.warning("The audio thread does not stop: leaving it")
        self._thread = None

    # ---- the core thread ------------------------------------------------------------------

    def _run(
        self,
        main: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[Frame | None],
        opened: concurrent.futures.Future[None],
    ) -> None:
        if self.live:
            raise_thread("audio")
        try:
            asyncio.run(self._capture(main, queue, opened))
        except Exception as err:  # never silent: the listener sees the end of the stream
            _LOGGER.exception("The audio thread failed")
            if not opened.done():
                opened.set_exception(err)
        finally:
            with contextlib.suppress(RuntimeError):
                main.call_soon_threadsafe(queue.put_nowait, None)

    async def _capture(
        self,
        main: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[Frame | None],
        opened: concurrent.futures.Future[None],
    ) -> None:
        self._core_loop = asyncio.get_running_loop()
        try:
            await self.source.open()
            self._open_linear()
        except BaseException as err:
            opened.set_exception(err)
            return
        opened.set_result(None)
        try:
            while not self._stopping.is_set():
                try:
                    chunk = await self._read_or_stop()
                except Exception as err:  # sources retry by themselves; a last resort
                    _LOGGER.warning("Microphone read failed: %s", err)
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                if chunk is None:
                    break
                now = getattr(self.source, "chunk_time", None) or time.monotonic()
                frame = self._finish(chunk, now)
                # Wait for room (a file source outruns a busy loop); a live one never fills it.
                while not self._room.acquire(timeout=0.5):
                    if self._stopping.is_set():
                        return
                if self._stopping.is_set():
                    return
                main.call_soon_threadsafe(queue.put_nowait, frame)
        finally:
            with contextlib.suppress(Exception):
                await self.source.close()

    def _open_linear(self) -> None:
        """The second VAD for the linear filter's output, loaded before the first chunk."""
        canceller, endpointer = self.canceller, self.endpointer
        if self._linear is not None or canceller is None or endpointer is None:
            return
        if canceller.linear_filter:
            vad = endpointer.second_vad()
            self._linear = LinearScore(vad) if vad is not None else None

    def _cancel_read(self) -> None:
        read = self._read
        if read is not None and not read.done():
            read.cancel()

    async def _read_or_stop(self) -> bytes | None:
        """A read that a close interrupts (at once, or at the latest within half a second)."""
        read = self._read = asyncio.ensure_future(self.source.read())
        while True:
            done, _ = await asyncio.wait({read}, timeout=0.5)
            if done:
                if read.cancelled():
                    return None
                return read.result()
            if self._stopping.is_set():
                read.cancel()
                with contextlib.suppress(BaseException):
                    await read
                return None

    def _finish(self, chunk: bytes, now: float) -> Frame:
        canceller, endpointer = self.canceller, self.endpointer
        captured = chunk
        if canceller is not None:
            chunk = canceller.process(chunk, now)
            # Where the capture clock puts it: a backlog read late keeps its capture time.
            now = canceller.captured_until or now
        probability = None
        if endpointer is not None:
            if self._reset_vad.is_set():
                self._reset_vad.clear()
                endpointer.reset_vad()
            try:
                probability = endpointer.probability(chunk)
            except Exception:  # the loop's endpointer tries again on its own
                _LOGGER.exception("VAD failed on the audio thread")
        hearing = canceller.hearing if canceller is not None else Hearing.CLEAR
        evidence = None
        if canceller is not None and probability is not None:
            linear = None
            if self._linear is not None:
                try:
                    linear = self._linear.score(canceller)
                except Exception:  # barge-in then weighs AEC3's output alone
                    _LOGGER.exception("VAD failed on the linear filter's output")
            evidence = canceller.evidence(probability, linear)
            if evidence.playing and _LOGGER.isEnabledFor(logging.DEBUG):
                # What the turn policy weighed, chunk by chunk while a reply may be heard: a
                # barge-in missed or a self-made one in a live run is read from these lines.
                _LOGGER.debug(
                    "Over the reply at %.3f: VAD %.2f, mic %s dB, residual %s dB, expected %s dB; "
                    "linear VAD %s, residual %s dB, expected %s dB, ERLE %.1f dB; ref %s dB; "
                    "settled %s; trial %s; echo match %s at %s ms",
                    now, probability, evidence.mic_db, evidence.residual_db,
                    evidence.expected_residual_db,
                    evidence.linear_probability and round(evidence.linear_probability, 2),
                    evidence.linear_residual_db, evidence.linear_expected_db,
                    canceller.linear_estimate.erle_db, canceller.chunk_ref_db,
                    evidence.settled, canceller.chunk_trial, evidence.echo_match,
                    canceller.echo_delay_ms,
                )  # fmt: skip
            self._fast_barge_in(evidence, now)
        kept = None
        if canceller is not None:
            playing = hearing is not Hearing.CLEAR
            kept = self._kept.chunk(captured, chunk, playing, canceller.delay_samples)
        return Frame(chunk, now, probability, hearing, evidence, kept)

    def _fast_barge_in(self, evidence: Evidence, captured: float) -> None:
        """The turn policy on this thread: a reply stops the moment the user's voice over it
        is certain, however late the event loop runs; the endpointer's SPEECH_STARTED then
        ends the turn's run as usual."""
        endpointer = self.endpointer
        if self.on_interrupt is None or endpointer is None:
            return
        act = self._fast.step(evidence, endpointer.in_speech)
        if act is Act.HOLD:
            if self.on_hold is None or not self.on_hold():
                self._fast.cancel_hold()
                return
            _LOGGER.info("Reply held at %.3f: a voice over it, maybe", time.monotonic())
            return
        if act is Act.RELEASE:
            if self.on_release is not None:
                self.on_release()
            _LOGGER.info("Reply plays on at %.3f: nobody spoke over it", time.monotonic())
            return
        if act is not Act.INTERRUPT:
            return
        decided = time.monotonic()
        if not self.on_interrupt():
            # Already cut (the loop has not taken the utterance yet), or not allowed now: a
            # reply held for this voice plays on (else it stayed silent HOLD_MAX_SECONDS).
            if self.on_release is not None:
                self.on_release()
            return
        # Where a barge-in's time goes: the chunk's capture → the decision (the mic's
        # transport and this thread) → the cut (the speaker's lock, AEC3's second filter).
        _LOGGER.info(
            "Barge-in on the audio thread at %.3f: chunk captured %.0f ms before, cut in %.0f ms",
            decided,
            (decided - captured) * 1000,
            (time.monotonic() - decided) * 1000,
        )


class Act(Enum):
    """What FastBargeIn asks of the reply playing."""

    NONE = "none"
    HOLD = "hold"  # pause it: a voice over it, maybe (turn_policy.suspect)
    RELEASE = "release"  # play it on: the held voice was not one
    INTERRUPT = "interrupt"  # stop it: the user is speaking over it


class FastBargeIn:
    """The turn policy frame by frame on the audio thread, for barge-in alone: whether a
    reply must stop now, be held while a voice over it may be the user's, or play on. The
    core runs it on every chunk; the lab's offline evaluator runs the same object on a
    recorded scene, so what it measures is what the satellite does."""

    def __init__(self, policy: TurnPolicy) -> None:
        self.policy = policy
        self._voiced = 0
        self._ignored = 0
        self._suspect = 0  # frames in a row turn_policy.suspect took
        self._held: int | None = None  # frames since the reply was held; None: not held
        self._last_expected: float | None = None
        self._waited: int | None = None  # frames since suspect frames asked for a hold
        self._since_release = policy.hold_gap_frames

    def cancel_hold(self) -> None:
        """The hold asked for did not happen (nothing was playing to hold)."""
        self._held = self._waited = None
        self._suspect = 0

    def step(self, evidence: Evidence, in_speech: bool) -> Act:
        """One chunk's evidence; `in_speech`: the endpointer already has an utterance (its
        own start decides then; over a held reply it is the user's: stop it)."""
        policy = self.policy
        self._since_release += 1
        previous, self._last_expected = self._last_expected, evidence.expected_residual_db
        if in_speech:
            self._voiced = self._ignored = self._suspect = 0
            self._waited = None
            if self._held is not None:
                self._held = None
                return Act.INTERRUPT
            return Act.NONE
        decision = decide(evidence, self._voiced, policy)
        if decision is Decision.IGNORE:
            self._ignored += 1
            if self._ignored >= FAST_FORGET_FRAMES:
                self._voiced = 0
        else:
            self._ignored = 0
            self._voiced += 1
        # Over a held reply its echo's tail may be gone before the voice is certain: a start
        # then is a start over the reply all the same.
        if decision is Decision.INTERRUPT or (
            decision is Decision.START and self._held is not None
        ):
            self._voiced = self._suspect = 0
            self._held = self._waited = None
            return Act.INTERRUPT
        if self._held is not None:
            self._held += 1
            # A candidate under way keeps it held a little longer (the endpointer's own start).
            wait = policy.hold_frames + (policy.echo_min_speech_frames if self._voiced else 0)
            if self._held < wait:
                return Act.NONE
            self._held = None
            self._since_release = 0
            return Act.RELEASE
        return Act.HOLD if self._hold(evidence, previous) else Act.NONE

    def _hold(self, evidence: Evidence, previous: float | None) -> bool:
        """Whether to hold the reply now (turn_policy.suspect, then TurnPolicy.hold_*)."""
        policy = self.policy
        if not policy.hold:
            return False
        if self._waited is None:
            self._suspect = self._suspect + 1 if suspect(evidence, policy) else 0
            if self._suspect < policy.hold_min_frames:
                return False
            if self._since_release < policy.hold_gap_frames:
                return False
            self._waited = 0
        else:
            # The frame after: the echo's estimate did not leap (a reply's next words after a
            # pause: live, their echo came a frame or two before the estimate rose, 11-16 dB
            # over it at Silero 0.02-0.09 — a hold with nobody speaking, twice in the tests).
            expected = evidence.expected_residual_db
            leap = expected - previous if expected is not None and previous is not None else 0.0
            if leap >= policy.hold_leap_db:
                self._waited = None
                self._suspect = 0
                return False
            self._waited += 1
        if self._waited < policy.hold_confirm_frames:
            return False
        self._waited = None
        self._suspect = 0
        self._held = 0
        return True


class LinearScore:
    """The VAD on the linear filter's output (EchoCanceller.linear_chunk) while a reply may be
    heard, for the barge-in decision: its own VAD instance (recurrent state), reset when a
    reply starts to be heard. Nothing is scored outside replies (no cost there)."""

    def __init__(self, vad: Vad) -> None:
        self.vad = vad
        self._on = False

    def score(self, canceller: EchoCanceller) -> float | None:
        chunk = canceller.linear_chunk
        if chunk is None or not canceller.linear or canceller.hearing is Hearing.CLEAR:
            self._on = False
            return None
        if not self._on:
            self.vad.reset()
            self._on = True
        return self.vad.probability(np.frombuffer(chunk, dtype="<i2").astype(np.float32) / 32768)


def cancel_echo(
    source: AudioSource, sink: AudioSink, endpointer: Endpointer, canceller: EchoCanceller | None
) -> AudioSource:
    """Put the canceller between `sink` (its reference) and `source`, with the microphone,
    the canceller and the VAD on the audio core's thread (CoreSource); returns the source to
    read from. Without a canceller the source is read as it is."""
    if canceller is None:
        return source
    sink.tap = canceller
    return CoreSource(source, canceller, endpointer, live=not isinstance(source, WavSource))
