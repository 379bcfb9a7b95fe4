"""The satellite's chain and the contract of each stage, in one place.

    AudioSource ─► WakeDetector ─► EndpointDetector ─► endpointing events
    └──────────────── listener.Listener ──────────────┘
    events ─► Transcriber ─► Responder ─► phrases ─► Synthesizer ─► audio ─► AudioSink
              └─────────── pipeline.TurnRun ──────────────────────┘        pipeline.Player

The listener is shared by both modes; in Home Assistant mode HA runs the middle of the chain
(its pipeline) and the satellite keeps the two ends. Implementations: audio/mic.py (mics),
wake.py, endpoint.py, stages.py (the server-facing three), audio/speaker.py (sinks). All audio
at the mic end is audio/format.py's: 16 kHz mono s16le in 512-sample (32 ms) chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from wyoming.audio import AudioFormat

from ..audio.format import seconds

if TYPE_CHECKING:
    from ..timing import TurnClock
    from .turn_policy import Evidence


# ---- the value types the stages hand each other (implementations import them) -------------


class Hearing(str, Enum):
    """What else the microphone may hear besides the user (the echo canceller knows)."""

    CLEAR = "clear"  # nothing plays: speech starts at the threshold
    ECHO = "echo"  # a reply or its tail: what is left of its echo must not start speech
    # Kept for old callers: with continuous playout no reply settles anew (read as ECHO).
    SETTLING = "settling"


class EndpointKind(str, Enum):
    SPEECH_STARTED = "speech-started"  # audio: the pre-speech audio and the speech so far
    SPECULATE = "speculate"  # audio: what ENDPOINT will carry if no speech follows
    SPEECH_RESUMED = "speech-resumed"  # after SPECULATE: the speculation is void
    ENDPOINT = "endpoint"  # audio: pre-speech + speech + trailing pad


@dataclass(frozen=True)
class EndpointEvent:
    kind: EndpointKind
    time: float  # monotonic time of the frame that caused the event
    speech_start: float  # time of the utterance's first voiced frame
    last_voiced: float  # time of its latest voiced frame
    audio: bytes = b""
    forced: bool = False  # ENDPOINT because the utterance reached max_speech_s
    # SPEECH_STARTED over a reply (turn_policy.Decision.INTERRUPT): a barge-in; both modes
    # stop the reply on it and take the utterance as the next request.
    interrupt: bool = False

    @property
    def seconds(self) -> float:
        return seconds(len(self.audio))


@dataclass(frozen=True)
class AudioPiece:
    """Audio of a reply, as the synthesizer hands it to the speaker."""

    pcm: bytes
    fmt: AudioFormat
    run: int = 0  # which audio run of the reply (the server speaks one per phrase)


class Tap(Protocol):
    """Who hears of what a sink plays (the echo canceller's reference)."""

    def reference(self, pcm: bytes, fmt: AudioFormat, due: float) -> None:
        """`pcm` is due to start playing at monotonic time `due`."""

    def cut(self, at: float) -> None:
        """Nothing handed over plays after monotonic time `at` (a stop)."""

    def hold(self, at: float) -> None:
        """Nothing handed over plays after monotonic time `at`, and the reply may play on
        later (a hold: no barge-in yet)."""


# ---- the stages ---------------------------------------------------------------------------


class AudioSource(Protocol):
    """The microphone. Optionally also `chunk_time: float | None`: the monotonic time the
    chunk just read was captured, for sources that know it better than the time of the
    read (a paced file)."""

    async def open(self) -> None: ...

    async def read(self) -> bytes | None:
        """Exactly CHUNK_BYTES of 16 kHz mono s16le, or None at the end of the stream."""
        ...

    async def close(self) -> None: ...


class WakeDetector(Protocol):
    """A local wake word (wake.WakeWord)."""

    name: str  # as configured
    phrase: str  # as spoken, e.g. "Okay Nabu"

    async def async_detect(self, chunk: bytes) -> bool:
        """True if the word ends in this chunk."""
        ...

    async def async_reset(self) -> None:
        """Forget the audio so far (after a detection, so one word fires once)."""
        ...

    def close(self) -> None: ...


class EndpointDetector(Protocol):
    """Speech start, speculation and endpoint (endpoint.Endpointer: Silero VAD)."""

    # What the microphone may hear besides the user (set by the echo canceller).
    hearing: Callable[[], Hearing] | None
    # The canceller's evidence on the chunk just read, given its VAD probability: what
    # turn_policy.decide weighs (set by the echo canceller).
    evidence: Callable[[float], Evidence] | None

    @property
    def in_speech(self) -> bool:
        """An utterance has started and not ended."""
        ...

    async def load(self) -> None: ...

    async def feed(self, chunk: bytes, now: float | None = None) -> list[EndpointEvent]:
        """One chunk captured at monotonic time `now` → the events it causes. A
        SPEECH_STARTED with `interrupt` is a barge-in (turn_policy: the one rule)."""
        ...

    def flush(self, now: float | None = None) -> list[EndpointEvent]:
        """The stream ended: an utterance under way ends here."""
        ...

    def reset(self) -> None:
        """Forget the current utterance (the wake word itself is no part of a request)."""
        ...

    def close(self) -> None: ...


class Transcriber(Protocol):
    """Speech → text (stages.Recognizer: the server's ASR)."""

    async def transcribe(self, audio: bytes, clock: TurnClock) -> str: ...


class Responder(Protocol):
    """Text → the reply, as pieces of text while it is written (stages: the server's LLM).
    One per turn: it keeps that turn's final text."""

    final_text: str | None  # the whole reply, once it has ended

    def respond(self, text: str, clock: TurnClock) -> AsyncIterator[str]: ...


class Synthesizer(Protocol):
    """Phrases → audio (stages: the server's TTS)."""

    async def speak(
        self,
        phrases: asyncio.Queue[str | None],
        audio: asyncio.Queue[AudioPiece | None],
        clock: TurnClock,
    ) -> None:
        """Turn phrases (None ends them) into audio pieces (None ends them)."""
        ...


class AudioSink(Protocol):
    """The speaker."""

    first_sample_at: float | None  # when the current reply's first sample was heard
    tap: Tap | None  # hears what is played (the echo canceller's reference)

    async def play(self, pcm: bytes, fmt: AudioFormat) -> None:
        """Queue audio of the current reply; returns without waiting for it to play."""
        ...

    async def drain(self) -> None:
        """Return once everything queued has been played."""
        ...

    async def stop(self) -> None:
        """Fall silent now (barge-in): what is queued is dropped."""
        ...

    async def close(self) -> None: ...
