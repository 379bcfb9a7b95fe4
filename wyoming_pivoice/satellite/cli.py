"""`wyoming-pivoice satellite`: command-line options → SatelliteSettings."""

from __future__ import annotations

import argparse
import logging
import uuid

from ..startup import client_uri, server_uri
from ..zeroconf import ZeroconfSettings
from .settings import EchoSettings, MicSettings, SatelliteSettings, SndSettings, VadSettings

_LOGGER = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "satellite",
        help="the on-device loop: standalone (--server) or for Home Assistant (--uri)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    mode = parser.add_argument_group("mode (one of)")
    mode.add_argument(
        "--server",
        type=client_uri,
        default=None,
        help="standalone: the pivoice server, tcp://HOST:10800; with --uri: our server is "
        "HA's conversation agent, and its reply to this satellite's turn plays as it is "
        "written (HA's copy of it is dropped)",
    )
    mode.add_argument(
        "--uri",
        type=server_uri,
        default=None,
        help="Home Assistant mode: serve the Wyoming satellite protocol, e.g. tcp://0.0.0.0:10700",
    )

    mic = parser.add_argument_group("microphone (16 kHz mono 16-bit; default: the default device)")
    mic_source = mic.add_mutually_exclusive_group()
    mic_source.add_argument(
        "--mic-device", default=None, help="PortAudio input device: index or part of its name"
    )
    mic_source.add_argument(
        "--mic-command",
        default=None,
        help="command writing raw s16le 16 kHz mono to stdout, e.g. "
        "'arecord -r 16000 -c 1 -f S16_LE -t raw'",
    )
    mic_source.add_argument("--mic-wav", default=None, help="a WAV file as the microphone")
    mic_source.add_argument(
        "--mic-stdin", action="store_true", help="raw s16le 16 kHz mono on standard input"
    )
    mic.add_argument(
        "--mic-pace",
        choices=["auto", "realtime", "none"],
        default="auto",
        help="auto: a WAV plays at real time, a command or stdin may not run more "
        "than 250 ms ahead of real time (a live mic is never delayed); "
        "none: as fast as it comes",
    )

    snd = parser.add_argument_group("speaker (default: the default device)")
    snd_sink = snd.add_mutually_exclusive_group()
    snd_sink.add_argument(
        "--snd-device",
        default=None,
        help="PortAudio output device: index or part of its name; 'null' discards the audio",
    )
    snd_sink.add_argument(
        "--snd-command",
        default=None,
        help="command reading raw PCM on stdin; {rate} {channels} {width} "
        "{bits} {n} are filled in per reply, e.g. "
        "'aplay -r {rate} -c {channels} -f S16_LE -t raw'",
    )
    snd_sink.add_argument(
        "--snd-wav",
        default=None,
        help="write replies into this WAV ({n} in the name: one file per reply)",
    )
    snd.add_argument(
        "--snd-realtime",
        action="store_true",
        help="pace --snd-wav / null output like a real speaker",
    )

    aec = parser.add_argument_group(
        "audio processing on the microphone (WebRTC APM: echo cancellation with the played "
        "audio as reference)"
    )
    aec.add_argument(
        "--no-aec",
        action="store_true",
        help="no echo cancellation (only where the microphone cannot hear the speaker)",
    )
    aec.add_argument("--noise-suppression", action="store_true", help="WebRTC noise suppression")
    aec.add_argument("--auto-gain", action="store_true", help="WebRTC automatic gain control")
    aec.add_argument("--high-pass", action="store_true", help="WebRTC high-pass filter")

    vad = parser.add_argument_group("voice activity (Silero VAD)")
    vad.add_argument("--vad-threshold", type=float, default=VadSettings.threshold)
    vad.add_argument(
        "--vad-silence-ms",
        type=int,
        default=VadSettings.silence_ms,
        help="silence that ends an utterance",
    )
    vad.add_argument(
        "--vad-prespeech-ms",
        type=int,
        default=VadSettings.prespeech_ms,
        help="audio kept from before the speech started",
    )
    vad.add_argument(
        "--vad-min-speech-ms",
        type=int,
        default=VadSettings.min_speech_ms,
        help="shorter sounds never start an utterance",
    )
    vad.add_argument(
        "--vad-pad-ms",
        type=int,
        default=VadSettings.pad_ms,
        help="silence kept after the last voiced frame",
    )
    vad.add_argument("--vad-max-speech-s", type=float, default=VadSettings.max_speech_s)
    vad.add_argument(
        "--speculate-ms",
        type=int,
        default=VadSettings.speculate_ms,
        help="start ASR and the LLM after this much silence, before the window closes (0: off)",
    )

    turn = parser.add_argument_group("turns")
    turn.add_argument(
        "--pipeline",
        choices=["streaming", "sequential"],
        default="streaming",
        help="sequential: whole transcript, whole reply, one synthesize, and play once all "
        "its audio is in, as Home Assistant's non-streaming TTS does (the baseline, no "
        "speculation)",
    )
    turn.add_argument("--timing-log", default=None, help="append one JSON line per turn here")
    turn.add_argument(
        "--no-barge-in", action="store_true", help="speech during a reply does not stop it"
    )
    turn.add_argument("--max-turns", type=int, default=None, help="exit after this many turns")
    turn.add_argument(
        "--conversation-id",
        default=None,
        help="conversation to continue (default: a new one per run; '' = no history)",
    )
    turn.add_argument("--language", default="en", help="ASR language ('auto' to detect)")
    turn.add_argument(
        "--min-clause-chars",
        type=int,
        default=SatelliteSettings.min_clause_chars,
        help="first-phrase TTS: cut the reply at a clause once this long",
    )
    turn.add_argument(
        "--server-retry-s",
        type=float,
        default=SatelliteSettings.server_retry_s,
        help="how long a request waits for an unreachable server",
    )

    ha = parser.add_argument_group("Home Assistant mode (--uri)")
    ha.add_argument("--name", default=None, help="satellite name shown in Home Assistant")
    ha.add_argument("--area", default=None)
    ha.add_argument("--no-zeroconf", action="store_true", help="do not advertise over mDNS")
    ha.add_argument("--zeroconf-name", default=None)
    ha.add_argument("--zeroconf-host", default=None, help="address to advertise; default: detected")
    ha.add_argument(
        "--wake-word",
        default=None,
        help="local wake word (okay_nabu, hey_jarvis, hey_mycroft, alexa or a "
        "microWakeWord .json); without it VAD alone starts a turn",
    )
    ha.add_argument(
        "--remote-wake",
        action="store_true",
        help="Home Assistant mode: stream audio continuously and let HA detect the wake word",
    )
    ha.add_argument("--awake-wav", default=None, help="played when the wake word is heard")
    ha.add_argument("--done-wav", default=None, help="played when the request is heard")
    ha.add_argument(
        "--timer-finished-wav",
        default=None,
        help="played when a timer finishes (default: a built-in ring; '' for none)",
    )
    ha.add_argument(
        "--timer-finished-wav-repeat",
        nargs=2,
        metavar=("REPEAT", "DELAY"),
        type=float,
        default=(0, 1.0),
        help="ring REPEAT times (0: until stopped by speech, the wake word or 'stop'; "
        "5 minutes at most), DELAY seconds apart",
    )
    ha.add_argument(
        "--ha-entity-id",
        default=None,
        help="with --server: this satellite's entity id in HA, which HA 2026.10+ sends with "
        "each turn (default: assist_satellite.<name>, as HA names it)",
    )
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> SatelliteSettings:
    language = None if args.language in (None, "", "auto") else args.language
    conversation_id = args.conversation_id
    if conversation_id is None:
        conversation_id = f"pivoice-satellite-{uuid.uuid4().hex[:12]}"
    return SatelliteSettings(
        server=args.server,
        server_retry_s=args.server_retry_s,
        uri=args.uri,
        mic=MicSettings(
            device=args.mic_device,
            command=args.mic_command,
            wav=args.mic_wav,
            stdin=args.mic_stdin,
            pace=args.mic_pace,
        ),
        snd=SndSettings(
            device=args.snd_device,
            command=args.snd_command,
            wav=args.snd_wav,
            realtime=args.snd_realtime,
        ),
        vad=VadSettings(
            threshold=args.vad_threshold,
            silence_ms=args.vad_silence_ms,
            prespeech_ms=args.vad_prespeech_ms,
            min_speech_ms=args.vad_min_speech_ms,
            speculate_ms=args.speculate_ms,
            pad_ms=args.vad_pad_ms,
            max_speech_s=args.vad_max_speech_s,
        ),
        echo=EchoSettings(
            echo_cancellation=not args.no_aec,
            noise_suppression=args.noise_suppression,
            high_pass_filter=args.high_pass,
            auto_gain_control=args.auto_gain,
        ),
        pipeline=args.pipeline,
        timing_log=args.timing_log,
        barge_in=not args.no_barge_in,
        max_turns=args.max_turns,
        conversation_id=conversation_id or None,
        language=language,
        min_clause_chars=args.min_clause_chars,
        name=args.name,
        area=args.area,
        zeroconf=ZeroconfSettings(
            enabled=not args.no_zeroconf, name=args.zeroconf_name, host=args.zeroconf_host
        ),
        wake_word=args.wake_word,
        remote_wake=args.remote_wake,
        awake_wav=args.awake_wav,
        done_wav=args.done_wav,
        timer_finished_wav=args.timer_finished_wav,
        timer_repeat=max(0, int(args.timer_finished_wav_repeat[0])),
        timer_delay=max(0.0, float(args.timer_finished_wav_repeat[1])),
        ha_entity_id=args.ha_entity_id,
    )


def run(args: argparse.Namespace) -> int:
    from .. import startup  # asyncio and the rest: not needed for --help

    settings = settings_from_args(args)
    for spec, want_input in ((settings.mic.device, True), (settings.snd.device, False)):
        problem = startup.audio_device_problem(spec, want_input)
        if problem:
            raise startup.StartupError(problem, code=2)
    if settings.uri:
        return startup.run(lambda: _home_assistant(settings), fast_exit=True)
    if not settings.server:
        _LOGGER.error("satellite needs --server tcp://HOST:PORT (standalone) or --uri (for HA)")
        return 2
    return startup.run(lambda: _standalone(settings), fast_exit=True)


# Each mode's modules load inside `startup.run`: a signal while they import ends quietly.


async def _home_assistant(settings: SatelliteSettings) -> int:
    from .ha import serve_ha_satellite

    return await serve_ha_satellite(settings)


async def _standalone(settings: SatelliteSettings) -> int:
    from .pipeline import Satellite
    from .wake import WakeWordError

    try:
        satellite = Satellite(settings)
    except (WakeWordError, ValueError) as err:
        _LOGGER.error("%s", err)
        return 2
    return await satellite.run_until_signal()
