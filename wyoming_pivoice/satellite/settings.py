"""Typed settings of `wyoming-pivoice satellite` (argparse stays in cli.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..text import MIN_CLAUSE_CHARS
from ..zeroconf import ZeroconfSettings

DEFAULT_HA_PORT = 10700


@dataclass(frozen=True)
class MicSettings:
    device: str | None = None  # PortAudio device index or part of its name; None: default
    command: str | None = None  # raw s16le 16 kHz mono on stdout
    wav: str | None = None
    stdin: bool = False
    # auto: a WAV plays at real time, a command/stdin may not run ahead of real time by
    # more than 250 ms (a file is paced, a live mic never delayed); realtime; none.
    pace: str = "auto"


@dataclass(frozen=True)
class SndSettings:
    device: str | None = None
    command: str | None = None  # raw PCM on stdin; {rate} {channels} {width} {bits} substituted
    wav: str | None = None
    realtime: bool = False  # pace the WAV/null sink like a speaker


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.5
    # While a reply (or its echo's tail) may be heard, speech must reach this to start, for
    # this long: what AEC3 leaves of the echo comes in bursts (Silero ≤ 0.68 once settled,
    # up to 0.99 for ~250 ms when it leaks), a voice over the reply goes on.
    echo_threshold: float = 0.85
    echo_min_speech_ms: int = 250
    silence_ms: int = 300  # the silence window that ends an utterance
    prespeech_ms: int = 300  # audio kept from before the speech started
    min_speech_ms: int = 150  # shorter blips never start an utterance
    # Start ASR (and the LLM) after this much silence; 0: off. 64 ms is 2 frames: with the
    # 300 ms window (10 frames) the turn starts 256 ms sooner. With ASR at ~150 ms a void
    # speculation is cheap; bench, 28 turns each: 32/64/96/120 ms → E2E 515/572/570/644 ms,
    # 12/8/8/2 speculations voided by speech resuming, nothing lost. 32 ms fires on every
    # dip between words; 64 ms is the measured middle. 3 rounds each, 42 turns: 32 ms → 484 ms
    # with 18 void, 64 ms → 504 ms with 12 void: not worth a third more wasted ASR runs.
    speculate_ms: int = 64
    pad_ms: int = 100  # silence kept after the last voiced frame
    max_speech_s: float = 20.0  # an utterance this long is ended anyway


@dataclass(frozen=True)
class EchoSettings:
    """The capture path's audio processing (WebRTC's APM, see echo.py)."""

    echo_cancellation: bool = True
    noise_suppression: bool = False
    high_pass_filter: bool = False
    auto_gain_control: bool = False

    @property
    def active(self) -> bool:
        """Whether the APM runs at all."""
        return self.echo_cancellation or self.always_process

    @property
    def always_process(self) -> bool:
        """Every chunk comes out of the APM. With echo cancellation alone, only chunks that
        may hold echo do; the rest pass untouched, so speech outside replies is as captured."""
        return self.noise_suppression or self.high_pass_filter or self.auto_gain_control


@dataclass(frozen=True)
class SatelliteSettings:
    server: str | None = None  # standalone: the pivoice server, tcp://HOST:PORT
    server_retry_s: float = 10.0  # a request waits this long for an unreachable server
    uri: str | None = None  # Home Assistant mode: serve the satellite protocol here
    mic: MicSettings = field(default_factory=MicSettings)
    snd: SndSettings = field(default_factory=SndSettings)
    vad: VadSettings = field(default_factory=VadSettings)
    echo: EchoSettings = field(default_factory=EchoSettings)
    pipeline: str = "streaming"  # streaming | sequential
    timing_log: str | None = None
    barge_in: bool = True
    max_turns: int | None = None
    conversation_id: str | None = None
    language: str | None = "en"
    min_clause_chars: int = MIN_CLAUSE_CHARS  # first-phrase TTS: cut at a clause this long
    # Home Assistant mode
    name: str | None = None
    area: str | None = None
    zeroconf: ZeroconfSettings = field(default_factory=ZeroconfSettings)
    wake_word: str | None = None  # a local wake word; None: VAD alone starts a turn
    remote_wake: bool = False  # HA mode: stream all audio and let Home Assistant find the wake word
    awake_wav: str | None = None
    done_wav: str | None = None
    timer_finished_wav: str | None = None  # None: the built-in ring; "": no timer sound
    timer_repeat: int = 0  # rings of a finished timer; 0: until stopped (5 min at most)
    timer_delay: float = 1.0  # seconds between two rings
    # HA mode with --server (our server is HA's agent): the entity id HA sends as the turn's
    # satellite_id; None: assist_satellite.<name slugified>, as HA names it.
    ha_entity_id: str | None = None
