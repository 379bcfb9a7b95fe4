"""Typed settings of `wyoming-pivoice satellite`: each field carries its flag (options.py),
so the CLI (cli.py) and the add-on's options (addon.py) are made from them; the fields'
order is `--help`'s."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import Addon, client_uri, nest, opt, server_uri
from ..text import MIN_CLAUSE_CHARS
from ..zeroconf import ZeroconfSettings

DEFAULT_HA_PORT = 10700


@dataclass(frozen=True)
class MicSettings:
    device: str | None = opt(  # None: the default device
        None,
        "--mic-device",
        exclusive="source",
        help="PortAudio input device: index or part of its name",
        addon=Addon("str?"),
    )
    command: str | None = opt(
        None,
        "--mic-command",
        exclusive="source",
        help="command writing raw s16le 16 kHz mono to stdout, e.g. "
        "'arecord -r 16000 -c 1 -f S16_LE -t raw'",
        addon=Addon("str?"),
    )
    wav: str | None = opt(
        None, "--mic-wav", exclusive="source", help="a WAV file as the microphone"
    )
    stdin: bool = opt(
        False, "--mic-stdin", exclusive="source", help="raw s16le 16 kHz mono on standard input"
    )
    # A file is paced, a live mic never delayed.
    pace: str = opt(
        "auto",
        "--mic-pace",
        choices=["auto", "realtime", "none"],
        help="auto: a WAV plays at real time, a command or stdin may not run more "
        "than 250 ms ahead of real time (a live mic is never delayed); "
        "none: as fast as it comes",
    )


@dataclass(frozen=True)
class SndSettings:
    device: str | None = opt(
        None,
        "--snd-device",
        exclusive="sink",
        help="PortAudio output device: index or part of its name; 'null' discards the audio",
        addon=Addon("str?"),
    )
    command: str | None = opt(
        None,
        "--snd-command",
        exclusive="sink",
        help="command reading raw PCM on stdin; {rate} {channels} {width} "
        "{bits} {n} are filled in per reply, e.g. "
        "'aplay -r {rate} -c {channels} -f S16_LE -t raw'",
        addon=Addon("str?"),
    )
    wav: str | None = opt(
        None,
        "--snd-wav",
        exclusive="sink",
        help="write replies into this WAV ({n} in the name: one file per reply)",
    )
    realtime: bool = opt(
        False, "--snd-realtime", help="pace --snd-wav / null output like a real speaker"
    )


@dataclass(frozen=True)
class VadSettings:
    threshold: float = opt(0.5, "--vad-threshold", addon=Addon("float(0.05,0.95)"))
    # While a reply (or its echo's tail) may be heard, speech must reach this to start, for
    # this long: what AEC3 leaves of the echo comes in bursts (Silero ≤ 0.68 once settled,
    # up to 0.99 for ~250 ms when it leaks), a voice over the reply goes on.
    echo_threshold: float = 0.85
    echo_min_speech_ms: int = 250
    # An utterance that started over a reply ends after this much silence (lab room.words).
    echo_silence_ms: int = 600
    # Hold (pause) a reply on what may be a voice over it and play it on if it was not
    # (turn_policy.suspect; docs/room.md, session 16): the sound stops sooner over a loud echo,
    # but live a false hold and two scored self barge-ins came with it once: off until measured.
    hold_reply: bool = opt(
        False, "--hold-reply", help="pause a reply on a possible voice over it (experimental)"
    )
    # Silero's recurrent state at most this many 32 ms chunks old (engines.vad.RecentSileroVad;
    # 0: carried through the stream). Over a reply it reads a voice at the echo's level sooner:
    # offline 133 -> 146/180 within 300 ms; live (targets bench, load 4.4-4.7) 13/13, 16/16 and
    # 15/16 in three runs, against 74 % in five runs carried. It reads AEC3's leaks higher too:
    # the three live ones that made a self-made turn or barge-in (session 21) all came in a
    # barge-in's trial, and the one read with both filters' levels was the unconverged fresh
    # filter's own, which the policy no longer weighs (echo.EchoCanceller; docs/room.md).
    state_span: int = opt(
        16,  # engines.vad.STATE_SPAN_CHUNKS (0.5 s)
        "--vad-state-span",
        help="restart Silero's state so it is never older than this many 32 ms chunks (0: "
        "carry it through the stream)",
    )
    silence_ms: int = opt(
        300,
        "--vad-silence-ms",
        help="silence that ends an utterance",
        addon=Addon("int(100,3000)"),
    )
    prespeech_ms: int = opt(
        300, "--vad-prespeech-ms", help="audio kept from before the speech started"
    )
    min_speech_ms: int = opt(
        150, "--vad-min-speech-ms", help="shorter sounds never start an utterance"
    )
    # Start ASR (and the LLM) after this much silence; 0: off. 64 ms is 2 frames: with the
    # 300 ms window (10 frames) the turn starts 256 ms sooner. With ASR at ~150 ms a void
    # speculation is cheap; bench, 28 turns each: 32/64/96/120 ms → E2E 515/572/570/644 ms,
    # 12/8/8/2 speculations voided by speech resuming, nothing lost. 32 ms fires on every
    # dip between words; 64 ms is the measured middle. 3 rounds each, 42 turns: 32 ms → 484 ms
    # with 18 void, 64 ms → 504 ms with 12 void: not worth a third more wasted ASR runs.
    speculate_ms: int = opt(
        64,
        "--speculate-ms",
        help="start ASR and the LLM after this much silence, before the window closes (0: off)",
    )
    pad_ms: int = opt(100, "--vad-pad-ms", help="silence kept after the last voiced frame")
    max_speech_s: float = opt(20.0, "--vad-max-speech-s")  # an utterance this long is ended


@dataclass(frozen=True)
class EchoSettings:
    """The capture path's audio processing (WebRTC's APM, see echo.py)."""

    echo_cancellation: bool = opt(
        True,
        "--no-aec",
        help="no echo cancellation (only where the microphone cannot hear the speaker)",
    )
    noise_suppression: bool = opt(False, "--noise-suppression", help="WebRTC noise suppression")
    high_pass_filter: bool = opt(False, "--high-pass", help="WebRTC high-pass filter")
    auto_gain_control: bool = opt(False, "--auto-gain", help="WebRTC automatic gain control")
    # A linear echo filter (SpeexDSP's, audio/mdf.py) beside AEC3 whose output keeps a voice
    # that AEC3's suppression takes off under a loud reply: barge-in weighs it too where it
    # cancels (echo.LINEAR_MIN_ERLE_DB). Off: it follows neither clock drift nor an echo delay
    # that moves from reply to reply, and live it never reached its gate (docs/room.md,
    # session 14); the lab turns it on (room.offline --linear).
    linear_barge_in: bool = False
    # Whose linear output: "mdf" (SpeexDSP's) or "aec3", AEC3's own (audio/aec3.py, native/aec3).
    linear_filter: str = "mdf"
    # Whose AEC3: "livekit" (its APM) or "aec3", ours (audio/aec3.py, native/aec3), whose
    # suppressor the lab can tune (aec3.CONFIG); livekit's where ours is not installed.
    canceller: str = opt(
        "livekit",
        "--echo-canceller",
        choices=["livekit", "aec3"],
        help="whose WebRTC AEC3: livekit's APM, or aec3 (ours, native/aec3/build.sh builds "
        "it; livekit's where it is not installed)",
    )
    # What the canceller compares, frame by frame (WebRTC's aecdump, in spirit): where the
    # reference stood against the echo is read from it (lab: room.align).
    dump: str | None = opt(
        None,
        "--aec-dump",
        help="write what the echo canceller compares to this file, for diagnosis: raw 16 kHz "
        "s16le, 2 channels (microphone, reference), at most 10 minutes",
    )

    @property
    def active(self) -> bool:
        """Whether the APM runs at all."""
        return self.echo_cancellation or self.always_process

    @property
    def always_process(self) -> bool:
        """Every chunk comes out of the APM. With echo cancellation alone, only chunks that
        may hold echo do; the rest pass untouched, so speech outside replies is as captured."""
        return self.noise_suppression or self.high_pass_filter or self.auto_gain_control


MODE = "mode (one of)"
TURNS = "turns"
HA = "Home Assistant mode (--uri)"


def _language(value: str | None) -> str | None:
    return None if value in (None, "", "auto") else value


@dataclass(frozen=True)
class SatelliteSettings:
    server: str | None = opt(  # standalone: the pivoice server, tcp://HOST:PORT
        None,
        "--server",
        type=client_uri,
        group=MODE,
        help="standalone: the pivoice server, tcp://HOST:10800; with --uri: our server is "
        "HA's conversation agent, and its reply to this satellite's turn plays as it is "
        "written (HA's copy of it is dropped)",
    )
    uri: str | None = opt(  # Home Assistant mode: serve the satellite protocol here
        None,
        "--uri",
        type=server_uri,
        group=MODE,
        help="Home Assistant mode: serve the Wyoming satellite protocol, e.g. tcp://0.0.0.0:10700",
    )
    mic: MicSettings = nest(
        MicSettings, group="microphone (16 kHz mono 16-bit; default: the default device)"
    )
    snd: SndSettings = nest(SndSettings, group="speaker (default: the default device)")
    echo: EchoSettings = nest(
        EchoSettings,
        group="audio processing on the microphone (WebRTC APM: echo cancellation with the "
        "played audio as reference)",
    )
    vad: VadSettings = nest(VadSettings, group="voice activity (Silero VAD)")
    pipeline: str = opt(
        "streaming",
        "--pipeline",
        choices=["streaming", "sequential"],
        group=TURNS,
        help="sequential: whole transcript, whole reply, one synthesize, and play once all "
        "its audio is in, as Home Assistant's non-streaming TTS does (the baseline, no "
        "speculation)",
    )
    timing_log: str | None = opt(
        None, "--timing-log", group=TURNS, help="append one JSON line per turn here"
    )
    barge_in: bool = opt(
        True, "--no-barge-in", group=TURNS, help="speech during a reply does not stop it"
    )
    max_turns: int | None = opt(
        None, "--max-turns", type=int, group=TURNS, help="exit after this many turns"
    )
    conversation_id: str | None = opt(  # cli.py: a new one per run when not given
        None,
        "--conversation-id",
        group=TURNS,
        help="conversation to continue (default: a new one per run; '' = no history)",
    )
    language: str | None = opt(
        "en",
        "--language",
        group=TURNS,
        convert=_language,
        help="ASR language ('auto' to detect)",
        addon=Addon("str?", key="satellite_language"),
    )
    min_clause_chars: int = opt(  # first-phrase TTS: cut at a clause this long
        MIN_CLAUSE_CHARS,
        "--min-clause-chars",
        group=TURNS,
        help="first-phrase TTS: cut the reply at a clause once this long",
    )
    server_retry_s: float = opt(  # a request waits this long for an unreachable server
        10.0,
        "--server-retry-s",
        group=TURNS,
        help="how long a request waits for an unreachable server",
    )
    # Home Assistant mode
    name: str | None = opt(
        None,
        "--name",
        group=HA,
        help="satellite name shown in Home Assistant",
        addon=Addon("str?", key="satellite_name"),
    )
    area: str | None = opt(None, "--area", group=HA, addon=Addon("str?", key="satellite_area"))
    zeroconf: ZeroconfSettings = nest(ZeroconfSettings, group=HA)
    wake_word: str | None = opt(  # a local wake word; None: VAD alone starts a turn
        None,
        "--wake-word",
        group=HA,
        help="local wake word (okay_nabu, hey_jarvis, hey_mycroft, alexa or a "
        "microWakeWord .json); without it VAD alone starts a turn",
        addon=Addon("str?", default="okay_nabu"),
    )
    remote_wake: bool = opt(  # HA mode: stream all audio and let Home Assistant find the wake word
        False,
        "--remote-wake",
        group=HA,
        help="Home Assistant mode: stream audio continuously and let HA detect the wake word",
    )
    awake_wav: str | None = opt(
        None, "--awake-wav", group=HA, help="played when the wake word is heard"
    )
    done_wav: str | None = opt(
        None, "--done-wav", group=HA, help="played when the request is heard"
    )
    timer_finished_wav: str | None = opt(  # None: the built-in ring; "": no timer sound
        None,
        "--timer-finished-wav",
        group=HA,
        help="played when a timer finishes (default: a built-in ring; '' for none)",
    )
    timer_repeat: int = opt(  # rings of a finished timer; 0: until stopped (5 min at most)
        0,
        "--timer-finished-wav-repeat",
        nargs=2,
        metavar=("REPEAT", "DELAY"),
        type=float,
        cli_default=(0, 1.0),
        convert=lambda pair: max(0, int(pair[0])),
        group=HA,
        help="ring REPEAT times (0: until stopped by speech, the wake word or 'stop'; "
        "5 minutes at most), DELAY seconds apart",
    )
    timer_delay: float = opt(  # seconds between two rings
        1.0, reads="timer_finished_wav_repeat", convert=lambda pair: max(0.0, float(pair[1]))
    )
    # HA mode with --server (our server is HA's agent): the entity id HA sends as the turn's
    # satellite_id; None: assist_satellite.<name slugified>, as HA names it.
    ha_entity_id: str | None = opt(
        None,
        "--ha-entity-id",
        group=HA,
        help="with --server: this satellite's entity id in HA, which HA 2026.10+ sends with "
        "each turn (default: assist_satellite.<name>, as HA names it)",
    )
