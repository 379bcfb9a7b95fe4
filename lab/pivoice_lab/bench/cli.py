"""`wyoming-pivoice bench`: the latency bench, the peers, the knobs and the soak."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from wyoming_pivoice.satellite import SatelliteSettings, VadSettings

from .options import BenchOptions


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="time whole voice turns through the real satellite and server on the real models",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Builds a spoken corpus, starts a server on loopback (no zeroconf) and runs each "
            "utterance as a full turn through the satellite (file mic at real-time pace), "
            "alternating the streaming pipeline (with and without speculative endpointing) "
            "and the sequential one. Prints medians and p90 per stage; --json writes it all."
        ),
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="times each utterance is said per pipeline (default 3; with --soak alone, 0)",
    )
    parser.add_argument(
        "--utterances", type=int, default=None, help="use only the first N utterances of the corpus"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the full results here")
    parser.add_argument(
        "--corpus-dir",
        type=Path,
        default=None,
        help="where the corpus WAVs are made (and reused); default: the workdir",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="logs and corpus; default: a new temporary folder",
    )
    parser.add_argument(
        "--pipelines", default="streaming,sequential", help="comma-separated: streaming, sequential"
    )
    parser.add_argument(
        "--vad-silence-ms",
        type=int,
        default=VadSettings.silence_ms,
        help="the silence window that ends an utterance",
    )
    parser.add_argument(
        "--speculate-ms",
        type=int,
        default=VadSettings.speculate_ms,
        help="speculative endpointing of the streaming pipeline",
    )
    parser.add_argument(
        "--no-speculation-baseline",
        action="store_true",
        help="skip the streaming pipeline with speculate-ms 0",
    )
    parser.add_argument("--min-clause-chars", type=int, default=SatelliteSettings.min_clause_chars)
    parser.add_argument(
        "--replay",
        action="store_true",
        help="also replay each turn's model compute in this process (the models' cost in "
        "isolation; the overhead figure uses the server's own timing of each turn)",
    )
    parser.add_argument(
        "--compute-reps",
        type=int,
        default=2,
        help="replay each turn's model compute this often and keep the least",
    )
    parser.add_argument(
        "--no-latency",
        action="store_true",
        help="skip the turn bench (e.g. only --knobs or --peers)",
    )
    parser.add_argument(
        "--realtime-playback",
        action="store_true",
        help="the null speaker takes as long as playing the reply would",
    )
    parser.add_argument("--turn-timeout", type=float, default=120.0)
    parser.add_argument(
        "--server",
        default=None,
        metavar="URI",
        help="bench a server that is already running (tcp://HOST:PORT) "
        "instead of starting one; --server-arg is then ignored",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the server (repeatable), e.g. --server-arg=--asr-beam-size=5",
    )
    parser.add_argument(
        "--satellite-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the satellite of --room (repeatable), e.g. "
        "--satellite-arg=--hold-reply",
    )

    peers = parser.add_argument_group("peers")
    peers.add_argument(
        "--peers",
        action="store_true",
        help="time wyoming-faster-whisper and wyoming-piper where installed",
    )
    peers.add_argument(
        "--peers-venv",
        type=Path,
        default=None,
        help="a venv holding the peers (they are never installed by the bench)",
    )
    peers.add_argument("--peer-rounds", type=int, default=3)

    knobs = parser.add_argument_group("knobs")
    knobs.add_argument(
        "--knobs",
        action="store_true",
        help="measure the engine settings (int8/float32, beam, timestamps, "
        "trimming, threads, KV reuse, TTS preload)",
    )
    knobs.add_argument("--knob-reps", type=int, default=2)
    knobs.add_argument(
        "--knob-parts",
        default="asr,llm,tts,overlap",
        help="which engines' knobs, comma-separated (default: all four)",
    )

    parser.add_argument(
        "--room",
        action="store_true",
        help="the satellite process in simulated rooms whose speaker echoes into the mic: "
        "self-made turns, barge-in, ERLE, with echo cancellation on and off "
        "(alone, it skips the latency bench)",
    )
    parser.add_argument(
        "--room-cases",
        choices=["targets", "grid", "shared-clock", "wide", "chained", "all"],
        default="targets",
        help="targets: issue #20's rooms (small speaker, 0.7 s tail, ±100 ppm), a headset and "
        "AEC off; grid: the older grid of levels and delays; shared-clock: the two echo rooms "
        "without drift; wide: rooms the targets do not cover (0 dB, a 400 ms delay, a fan, a "
        "recorded person over the reply); chained: the targets' echo rooms and headset, each "
        "round's second command said over the first reply after a barge-in",
    )
    parser.add_argument(
        "--room-rounds",
        type=int,
        default=1,
        help="each room's script this often (5 replies and 2 barge-ins a round; chained: 4 and 2)",
    )
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help="N busy processes (at the server's priority) beside the room runs and the knobs",
    )

    knowledge = parser.add_argument_group("local knowledge")
    knowledge.add_argument(
        "--knowledge",
        action="store_true",
        help="what --knowledge costs a turn: retrieval and prompt assembly on generated notes, "
        "first phrase with knowledge on and off (in this process; alone, it skips the rest)",
    )
    knowledge.add_argument("--knowledge-mb", type=float, default=10.0, help="notes to generate")

    parser.add_argument(
        "--ha-follow",
        action="store_true",
        help="first sound of the same reply standalone and in Home Assistant mode (following "
        "our server, and HA's own audio) against a stand-in of HA 2026.10's pipeline, on the "
        "server's embedded models with the LLM greedy so the replies are equal (alone: it "
        "skips the rest); --rounds (default 5) rounds of a one- and a three-sentence reply",
    )
    parser.add_argument(
        "--wer",
        action="store_true",
        help="word error rate on the household corpus (59 commands and questions, 8 voices, "
        "a real recording) through the satellite, the server on the whole clip, plain "
        "faster-whisper and wyoming-faster-whisper where installed (alone, it skips the "
        "latency bench); --utterances limits it",
    )

    soak = parser.add_argument_group("soak")
    soak.add_argument(
        "--soak",
        type=int,
        default=0,
        metavar="N",
        help="N turns through the whole loop, sampling RSS and descriptors "
        "(alone, it skips the latency bench)",
    )
    soak.add_argument(
        "--soak-every", type=int, default=10, metavar="K", help="sample every K turns"
    )
    parser.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    pipelines = tuple(p.strip() for p in args.pipelines.split(",") if p.strip())
    unknown = set(pipelines) - {"streaming", "sequential"}
    if unknown:
        raise SystemExit(f"unknown pipeline(s): {', '.join(sorted(unknown))}")
    alone = args.soak or args.room or args.wer
    rounds = args.rounds if args.rounds is not None else (0 if alone else 3)
    return BenchOptions(
        rounds=rounds,
        utterances=args.utterances,
        corpus_dir=args.corpus_dir,
        workdir=args.workdir,
        silence_ms=args.vad_silence_ms,
        speculate_ms=args.speculate_ms,
        pipelines=pipelines,
        speculation_baseline=not args.no_speculation_baseline,
        min_clause_chars=args.min_clause_chars,
        replay=args.replay,
        compute_reps=args.compute_reps,
        latency=not args.no_latency and rounds > 0,
        peers=args.peers,
        peers_venv=args.peers_venv,
        peer_rounds=args.peer_rounds,
        knobs=args.knobs,
        knob_reps=args.knob_reps,
        knob_parts=tuple(p.strip() for p in args.knob_parts.split(",") if p.strip()),
        soak=args.soak,
        soak_every=args.soak_every,
        server_args=list(args.server_arg),
        satellite_args=list(args.satellite_arg),
        server_uri=args.server,
        realtime_playback=args.realtime_playback,
        turn_timeout=args.turn_timeout,
        room=args.room,
        room_cases=args.room_cases,
        room_rounds=args.room_rounds,
        load=args.load,
        wer=args.wer,
    )


def run(args: argparse.Namespace) -> int:
    from . import report, runner

    # Per-turn INFO logs from the satellite and server clients would drown the progress bar.
    if logging.getLogger().level < logging.WARNING:
        for name in ("wyoming_pivoice.satellite", "wyoming_pivoice.timing", "faster_whisper"):
            logging.getLogger(name).setLevel(logging.WARNING)
    if args.ha_follow:  # its own section (bench/ha_follow.py)
        from . import ha_follow

        result = ha_follow.run(args.rounds or 5, args.workdir, args.vad_silence_ms)
        sys.stdout.write(ha_follow.render(result))
    elif args.knowledge:  # its own section, in this process (bench/knowledge.py)
        from . import knowledge

        result = knowledge.run(args.knowledge_mb, args.rounds or 3, args.workdir)
        sys.stdout.write(knowledge.render(result))
    else:
        result = runner.run(options_from_args(args))
        sys.stdout.write(report.render(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        sys.stderr.write(f"wrote {args.json}\n")
    return 0
