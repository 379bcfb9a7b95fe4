"""Endpointing: Silero VAD probabilities → speech started / speculate / resumed / endpoint.

`EndpointLogic` is pure: it takes one probability per 32 ms frame (so tests can feed
recorded ones). `Endpointer` runs Silero VAD on each 512-sample chunk (off the event
loop) and hands the probability to the logic.

Timing: every frame carries the monotonic time it was captured (read). The endpoint is
declared on the first frame at which the silence since the last voiced frame covers the
window (`silence_ms`), i.e. at most one frame (32 ms) after the window has passed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Protocol

import numpy as np

from ..audio.format import CHUNK_BYTES, CHUNK_SECONDS
from .protocols import EndpointEvent, EndpointKind, Hearing
from .settings import VadSettings
from .turn_policy import Decision, Evidence, TurnPolicy, decide

FRAME_MS = CHUNK_SECONDS * 1000  # 32 ms
HYSTERESIS = 0.15  # speech continues until the probability drops this far below the threshold
# Over a reply the turn policy may leave a voice for the echo's until it has enough of it: CI's
# under-load room (−6 dB/60 ms, the first reply, its ERLE not yet measured) started the voice
# 640 ms after Silero first stood at 0.84 on it, and the 300 ms pre-roll lost the command's
# first words ("of the Christian light" for "turn off the kitchen lights", 6 of 8 runs). A
# start over a reply reaches back over the run of frames Silero heard voiced before it (gaps
# up to LOOKBACK_GAP_MS, LOOKBACK_MS at most) and keeps the pre-roll before that run.
LOOKBACK_MS = 1000
LOOKBACK_GAP_MS = 64


def _frames(ms: float) -> int:
    return max(0, math.ceil(ms / FRAME_MS - 1e-9))


def policy_from(settings: VadSettings) -> TurnPolicy:
    """The turn policy's thresholds from the VAD settings."""
    return TurnPolicy(
        threshold=settings.threshold,
        echo_threshold=settings.echo_threshold,
        min_speech_frames=max(1, _frames(settings.min_speech_ms)),
        echo_min_speech_frames=max(1, _frames(settings.echo_min_speech_ms)),
        hold=settings.hold_reply,
    )


class EndpointLogic:
    """The endpointing state machine over per-frame speech probabilities."""

    def __init__(self, settings: VadSettings) -> None:
        self.settings = settings
        self.threshold = settings.threshold
        self.policy = policy_from(settings)
        # What the echo canceller knows of the frame about to be processed (turn_policy);
        # None: only `hearing` (CLEAR or not) is known.
        self.evidence: Evidence | None = None
        self.hearing = Hearing.CLEAR
        self.neg_threshold = max(0.0, settings.threshold - HYSTERESIS)
        self.silence_frames = max(1, _frames(settings.silence_ms))
        # Over a reply AEC3's double-talk suppression takes whole syllables off the voice, so
        # Silero dips under the threshold mid-command and the 300 ms window ended it there
        # ("Turn." and then "on the kitchen lights" as a turn of its own). An utterance that
        # started while a reply or its echo's tail may be heard waits longer before its
        # endpoint. Offline (lab room.words, 36 commands over a Piper reply at the echo's
        # level, −6 dB/150 ms and −3 dB/250 ms rooms, and 18 in a headset): key words
        # 23/36 → 27/36 over the echo, 15/18 → 17/18 headset, WER 0.30 → 0.19, at 600 ms.
        self.echo_silence_frames = max(self.silence_frames, _frames(settings.echo_silence_ms))
        self.min_speech_frames = max(1, _frames(settings.min_speech_ms))
        self.echo_min_speech_frames = max(1, _frames(settings.echo_min_speech_ms))
        speculate = _frames(settings.speculate_ms) if settings.speculate_ms > 0 else 0
        self.speculate_frames = speculate if 0 < speculate < self.silence_frames else 0
        pad = _frames(settings.pad_ms)
        # Speculation must send exactly the audio the endpoint would: pad ≤ speculation.
        self.pad_frames = min(pad, self.speculate_frames) if self.speculate_frames else pad
        self.max_frames = max(self.silence_frames + 1, _frames(settings.max_speech_s * 1000))
        self.prespeech_frames = _frames(settings.prespeech_ms)
        self.lookback_frames = _frames(LOOKBACK_MS)
        self.lookback_gap_frames = _frames(LOOKBACK_GAP_MS)
        # The frames before a candidate, with their probabilities (for the reach-back).
        self._prespeech: deque[tuple[bytes, float]] = deque(
            maxlen=self.prespeech_frames + self.lookback_frames
        )
        self.reset()

    def reset(self) -> None:
        self._prespeech.clear()
        self._frames: list[bytes] = []  # the candidate or utterance, from its first voiced frame
        self._probabilities: list[float] = []  # …and Silero's probability for each
        self._lead: bytes = b""  # pre-speech audio of the current candidate/utterance
        self._state = "idle"  # idle | candidate | speech
        self._voiced = 0
        self._silence_run = 0
        self._last_voiced_index = -1
        self._speech_start = 0.0
        self._last_voiced = 0.0
        self._speculating = False
        self._over_echo = False  # the candidate or utterance started while echo may be heard

    @property
    def in_speech(self) -> bool:
        """An utterance has started and not ended (frames fed now belong to it)."""
        return self._state == "speech"

    def process(self, probability: float, frame: bytes, now: float) -> list[EndpointEvent]:
        # Until an utterance is under way, the turn policy says whether this frame is the
        # user's voice (over a reply, what is left of its echo must not start one) and when
        # there is enough of it to start; an utterance under way goes on at the threshold.
        if self._state == "idle":
            decision = self._decide(probability)
            if decision is not Decision.IGNORE:
                self._begin_candidate(frame, probability, now)
                return self._maybe_start(decision, now)
            self._prespeech.append((frame, probability))
            return []

        self._frames.append(frame)
        self._probabilities.append(probability)
        # A candidate's frame is the user's voice when the policy counts it, Silero's
        # threshold or not (a plain voice over a reply: turn_policy), so the endpointer starts
        # where the audio core's fast barge-in stops the reply.
        decision = self._decide(probability) if self._state == "candidate" else Decision.IGNORE
        voiced = (
            probability >= self.threshold
            or (probability >= self.neg_threshold and self._silence_run == 0)
            or decision is not Decision.IGNORE
        )
        if voiced:
            self._silence_run = 0
            self._last_voiced_index = len(self._frames) - 1
            self._last_voiced = now
            if self._state == "candidate":
                if decision is not Decision.IGNORE:
                    self._voiced += 1
                return self._maybe_start(decision, now)
            events = self._check_length(now)
            if self._speculating and not events:
                self._speculating = False
                return [self._event(EndpointKind.SPEECH_RESUMED, now)]
            return events

        self._silence_run += 1
        if self._state == "candidate":
            if self._silence_run >= self.silence_frames:
                self._drop_candidate()
            return []
        window = self.echo_silence_frames if self._over_echo else self.silence_frames
        if self._silence_run >= window:
            return [self._end(now)]
        events = self._check_length(now)
        if events:
            return events
        if self.speculate_frames and self._silence_run == self.speculate_frames:
            self._speculating = True
            return [self._event(EndpointKind.SPECULATE, now, self._utterance_audio())]
        return []

    def flush(self, now: float) -> list[EndpointEvent]:
        """The stream ended: an utterance in progress ends here (a candidate is dropped)."""
        if self._state != "speech":
            self._state = "idle"
            self._frames, self._probabilities = [], []
            return []
        audio = self._utterance_audio()
        event = self._event(EndpointKind.ENDPOINT, now, audio, forced=True)
        self._finish(len(self._frames))
        return [event]

    # ---- transitions --------------------------------------------------------------------

    def _begin_candidate(self, frame: bytes, probability: float, now: float) -> None:
        self._state = "candidate"
        self._over_echo = self.hearing is not Hearing.CLEAR or (
            self.evidence is not None and self.evidence.playing
        )
        held = list(self._prespeech)
        start = self._voiced_run_start(held) if self._over_echo else len(held)
        self._lead = b"".join(pcm for pcm, _ in held[max(0, start - self.prespeech_frames) :])
        self._prespeech.clear()
        self._frames, self._probabilities = [frame], [probability]
        self._voiced = 1
        self._silence_run = 0
        self._last_voiced_index = 0
        self._speech_start = now
        self._last_voiced = now

    def _voiced_run_start(self, held: list[tuple[bytes, float]]) -> int:
        """Where the run of voiced frames that ends `held` began (len(held): none)."""
        start, gap = len(held), 0
        for index in range(len(held) - 1, max(-1, len(held) - 1 - self.lookback_frames), -1):
            if held[index][1] >= self.neg_threshold:
                start, gap = index, 0
            else:
                gap += 1
                if gap > self.lookback_gap_frames:
                    break
        return start

    def _decide(self, probability: float) -> Decision:
        """The turn policy on this frame, with the candidate's voiced frames before it."""
        evidence = self.evidence
        if evidence is None:
            evidence = Evidence(probability, playing=self.hearing is not Hearing.CLEAR)
        elif evidence.probability != probability:
            evidence = replace(evidence, probability=probability)
        voiced = self._voiced if self._state == "candidate" else 0
        return decide(evidence, voiced, self.policy)

    def _maybe_start(self, decision: Decision, now: float) -> list[EndpointEvent]:
        if decision not in (Decision.START, Decision.INTERRUPT):
            return []
        self._state = "speech"
        self._speculating = False
        audio = self._lead + b"".join(self._frames)
        event = self._event(EndpointKind.SPEECH_STARTED, now, audio)
        return [replace(event, interrupt=decision is Decision.INTERRUPT)]

    def _drop_candidate(self) -> None:
        """A blip shorter than min_speech: back to idle, its audio becomes pre-speech."""
        self._prespeech.extend(zip(self._frames, self._probabilities, strict=True))
        self._frames, self._probabilities = [], []
        self._state = "idle"

    def _check_length(self, now: float) -> list[EndpointEvent]:
        if len(self._frames) < self.max_frames:
            return []
        audio = self._lead + b"".join(self._frames)
        event = self._event(EndpointKind.ENDPOINT, now, audio, forced=True)
        self._finish(len(self._frames))
        return [event]

    def _utterance_audio(self) -> bytes:
        end = min(len(self._frames), self._last_voiced_index + 1 + self.pad_frames)
        return self._lead + b"".join(self._frames[:end])

    def _end(self, now: float) -> EndpointEvent:
        event = self._event(EndpointKind.ENDPOINT, now, self._utterance_audio())
        self._finish(self._last_voiced_index + 1 + self.pad_frames)
        return event

    def _finish(self, used: int) -> None:
        # Silence after the padding may be the pre-speech of the next utterance.
        self._prespeech.extend(zip(self._frames[used:], self._probabilities[used:], strict=True))
        self._frames, self._probabilities = [], []
        self._lead = b""
        self._state = "idle"
        self._speculating = False
        self._silence_run = 0

    def _event(
        self, kind: EndpointKind, now: float, audio: bytes = b"", forced: bool = False
    ) -> EndpointEvent:
        return EndpointEvent(kind, now, self._speech_start, self._last_voiced, audio, forced)


class Vad(Protocol):
    """A speech probability per chunk (engines.vad.SileroVad), with recurrent state."""

    def probability(self, chunk: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class Endpointer:
    """Silero VAD + EndpointLogic: feed 512-sample chunks, get endpointing events.

    The VAD runs in its own single worker thread (its recurrent state must see the
    chunks in order, and model calls never block the event loop).
    """

    def __init__(self, settings: VadSettings, vad: Vad | None = None) -> None:
        self.settings = settings
        self.logic = EndpointLogic(settings)
        # Tells what the microphone may be hearing besides the user (see echo.py).
        self.hearing: Callable[[], Hearing] | None = None
        # The echo canceller's evidence on the chunk just read (turn_policy), given the
        # VAD's probability; set by echo.cancel_echo.
        self.evidence: Callable[[float], Evidence] | None = None
        # The audio core scores every chunk on its own thread: the probability of the chunk
        # being fed, or None (then the VAD runs here). `on_reset` resets the VAD over there.
        self.frame_probability: Callable[[bytes], float | None] | None = None
        self.on_reset: Callable[[], None] | None = None
        # What an utterance keeps of the chunk being fed (the audio core's UtteranceAudio),
        # or None: the chunk itself.
        self.kept_audio: Callable[[bytes], bytes] | None = None
        self._vad = vad
        self._given = vad is not None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="pivoice vad")

    @property
    def in_speech(self) -> bool:
        return self.logic.in_speech

    async def load(self) -> None:
        if self._vad is None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _load(self) -> Vad:
        if self._vad is None:
            from ..engines.vad import silero_vad

            self._vad = silero_vad(self.settings.state_span)
        return self._vad

    def second_vad(self) -> Vad | None:
        """Blocking: another VAD of this endpointer's kind with its own recurrent state (the
        audio core scores the linear echo filter's output with it, core.LinearScore); None
        where the VAD was handed in (a test's fake)."""
        if self._given:
            return None
        from ..engines.vad import SileroVad

        return SileroVad()

    def probability(self, chunk: bytes) -> float:
        """Blocking: the speech probability of one chunk (runs the model)."""
        if len(chunk) != CHUNK_BYTES:
            raise ValueError(f"the endpointer takes {CHUNK_BYTES}-byte chunks, got {len(chunk)}")
        vad = self._load()
        samples = np.frombuffer(chunk, dtype="<i2").astype(np.float32) / 32768.0
        return vad.probability(samples)

    async def feed(self, chunk: bytes, now: float | None = None) -> list[EndpointEvent]:
        """Process one chunk captured at `now` (default: the time of the call)."""
        if now is None:
            now = time.monotonic()
        prob = self.frame_probability(chunk) if self.frame_probability is not None else None
        if prob is None:
            loop = asyncio.get_running_loop()
            prob = await loop.run_in_executor(self._executor, self.probability, chunk)
        kept = self.kept_audio(chunk) if self.kept_audio is not None else chunk
        return self._process(prob, kept, now)

    def _process(self, prob: float, chunk: bytes, now: float) -> list[EndpointEvent]:
        self.logic.hearing = self.hearing() if self.hearing is not None else Hearing.CLEAR
        self.logic.evidence = self.evidence(prob) if self.evidence is not None else None
        return self.logic.process(prob, chunk, now)

    def feed_sync(self, chunk: bytes, now: float) -> list[EndpointEvent]:
        return self._process(self.probability(chunk), chunk, now)

    def flush(self, now: float | None = None) -> list[EndpointEvent]:
        return self.logic.flush(time.monotonic() if now is None else now)

    def reset(self) -> None:
        """Forget the current utterance and the VAD's state (e.g. after a pause)."""
        self.logic.reset()
        if self.on_reset is not None:
            self.on_reset()
            return
        vad = self._vad
        if vad is not None:
            self._executor.submit(vad.reset)

    def reset_vad(self) -> None:
        """Blocking: forget the VAD's recurrent state (on the thread that runs it)."""
        if self._vad is not None:
            self._vad.reset()

    def close(self) -> None:
        self._executor.shutdown(wait=False)
