"""The bench run: corpus → server → turns through the real satellite → figures.

One server (a child process on loopback, no zeroconf) serves every pipeline; each
pipeline configuration is its own in-process satellite, and turns alternate between
them utterance by utterance (the order rotates each time) so that drift, caches and
background load hit all of them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from wyoming_pivoice import __version__, timing
from wyoming_pivoice.engines import AsrSettings, LlmSettings, TtsSettings
from wyoming_pivoice.settings import ServerSettings

from . import corpus as corpus_mod
from . import procstats, remote, report, server_compute, servers
from .options import BenchOptions
from .progress import Progress
from .rig import Config, Rig, TurnOutcome

_LOGGER = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[3]


def configs_for(options: BenchOptions) -> list[Config]:
    configs = []
    if "streaming" in options.pipelines:
        spec = options.speculate_ms
        configs.append(Config("streaming", f"streaming (speculate {spec} ms)", "streaming", spec))
        if options.speculation_baseline and spec > 0:
            configs.append(Config("streaming_nospec", "streaming (no speculation)", "streaming", 0))
    if "sequential" in options.pipelines:
        configs.append(Config("sequential", "sequential", "sequential", 0))
    return configs


def run(options: BenchOptions) -> dict[str, Any]:
    began = time.monotonic()
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="pivoice-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    corpus_dir = options.corpus_dir or workdir / "corpus"
    utterances = corpus_mod.build(corpus_dir, options.utterances)
    configs = configs_for(options) if options.latency else []
    result: dict[str, Any] = {
        "meta": _meta(options, utterances, configs),
        "corpus": [
            {
                "id": u.id,
                "text": u.text,
                "voice": u.voice,
                "kind": u.kind,
                "file_s": round(u.duration_s, 2),
                "speech_s": round(u.speech_s, 2),
            }
            for u in utterances
        ],
        "configs": {
            c.name: {"label": c.label, "pipeline": c.pipeline, "speculate_ms": c.speculate_ms}
            for c in configs
        },
    }
    remote_llm = bool(options.rounds) and remote.uses_remote(options.server_args)
    if configs or options.peers or options.soak or remote_llm or options.wer:
        _server_sections(result, options, utterances, configs, workdir)
    if options.room:
        result["room"] = _room(options, utterances, workdir)
    if options.knobs:
        from . import knobs
        from .room import busy_load

        asr, llm, tts = _engine_settings(options.server_args)
        total = len(utterances) * options.knob_reps * 4 + max(options.knob_reps, 3) + 2
        bar = Progress(total, "knobs")
        with busy_load(options.load):
            result["knobs"] = knobs.run(
                utterances,
                asr,
                llm,
                tts,
                options.min_clause_chars,
                options.knob_reps,
                progress=bar.step,
                parts=options.knob_parts,
            )
            result["knobs"]["load"] = {
                "busy_processes": options.load,
                "cores": os.cpu_count(),
                "load_average_1m_end": round(os.getloadavg()[0], 2),
            }
    result["meta"]["seconds"] = round(time.monotonic() - began, 1)
    result["meta"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    result["meta"]["workdir"] = str(workdir)
    return result


def _server_sections(
    result: dict[str, Any],
    options: BenchOptions,
    utterances: list[corpus_mod.Utterance],
    configs: list[Config],
    workdir: Path,
) -> None:
    """The sections that need a server: latency turns (+ compute replay), peers, soak."""
    spawn = time.monotonic()
    with _server(options, workdir) as server:
        if server.proc is not None:
            result["models"] = {
                "load_s": server.load_s,
                "ready_s": round(time.monotonic() - spawn, 2),
                "note": "ASR, TTS and LLM load side by side in worker threads; ready_s is "
                "from spawning the server to all three loaded",
            }
        else:
            result["models"] = {
                "note": f"server already running at {server.uri}: load times not seen"
            }
        asyncio.run(servers.warm(server.uri))
        server_before = server.sample()
        self_before = procstats.sample()
        if configs:
            turns, audio = asyncio.run(_latency(options, utterances, configs, server.uri))
            server_after = server.sample()
            self_after = procstats.sample()  # before any replay loads models in this process
            count = max(1, len(turns))
            result["processes"] = {}
            if server_before is not None and server_after is not None:
                result["processes"]["server"] = _proc(server_after, server_before, count)
            sat = _proc(self_after, self_before, count)
            sat["note"] = f"{len(configs)} satellites (one per pipeline) share this process"
            result["processes"]["satellite (bench process)"] = sat
            if server.compute_log is not None:
                attributed = server_compute.attribute(
                    turns, server.compute(), options.min_clause_chars
                )
                result["meta"]["compute_source"] = (
                    f"compute log: {attributed}/{len(turns)} turns timed by the server itself"
                )
            if options.replay or server.compute_log is None:
                from .compute import replay

                bar = Progress(len(turns), "model compute")
                replay(
                    turns,
                    audio,
                    *_engine_settings(options.server_args),
                    options.min_clause_chars,
                    reps=options.compute_reps,
                    progress=bar.step,
                )
            result["turns"] = turns
            _summarize(result, turns, configs)
        if options.peers:
            from . import peers

            bar = Progress(len(utterances) + len(peers.THREE_SENTENCE_REPLIES), "peers")
            result["peers"] = peers.run(
                utterances,
                server.uri,
                workdir,
                options.peers_venv,
                _engine_settings(options.server_args)[0],
                options.min_clause_chars,
                rounds=options.peer_rounds,
                progress=bar.step,
            )
        if options.wer:
            result["wer"] = _wer(options, server.uri, workdir)
        if options.soak:
            from .soak import soak

            result["soak"] = asyncio.run(soak(server, utterances, options))
        if options.rounds and server.proc is not None and remote.uses_remote(options.server_args):
            result["remote_llm"] = _remote_overhead(options, utterances, server, workdir)


def _wer(options: BenchOptions, uri: str, workdir: Path) -> dict[str, Any]:
    """The household corpus through every ASR path, scored against its text (bench/wer.py)."""
    from . import peers, wer

    corpus_dir = (options.corpus_dir or workdir / "corpus") / "household"
    utterances = corpus_mod.build(corpus_dir, options.utterances, corpus_mod.HOUSEHOLD)
    asr = _engine_settings(options.server_args)[0]
    load_start = [round(x, 2) for x in os.getloadavg()]
    bar = Progress(len(utterances), "wer satellite")
    satellite, turns = asyncio.run(
        wer.satellite_transcripts(
            uri,
            utterances,
            options.silence_ms,
            options.speculate_ms,
            options.turn_timeout,
            bar.step,
        )
    )
    texts = {"satellite": satellite, "server": asyncio.run(wer.server_transcripts(uri, utterances))}
    texts["plain"] = wer.plain_transcripts(utterances, asr)
    peer = peers.whisper_transcripts(utterances, workdir, options.peers_venv, asr)
    if peer["status"] == "ok":
        texts["wyoming-faster-whisper"] = peer["texts"]
    section = wer.section(utterances, texts)
    section["turns"] = turns
    section["wyoming-faster-whisper"] = {k: v for k, v in peer.items() if k != "texts"}
    section["load_average"] = {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]}
    return section


def _room(options: BenchOptions, utterances: list, workdir: Path) -> dict[str, Any]:
    from . import room

    cases = {
        "targets": room.target_cases(),
        "grid": room.default_cases(),
        "shared-clock": room.shared_clock_cases(),
        "wide": room.wide_cases(),
        "chained": room.chained_cases(),
        "all": room.target_cases() + room.default_cases(),
    }[options.room_cases]
    # Its own server, replies capped short (see room.ROOM_SERVER_ARGS), unless --server.
    args = [*room.ROOM_SERVER_ARGS, *options.server_args]
    serving = (
        contextlib.nullcontext(servers.attach(options.server_uri))
        if options.server_uri
        else servers.pivoice_server(workdir / "room-server.log", args)
    )
    with serving as server:
        asyncio.run(servers.warm(server.uri))
        result = room.run(
            server.uri,
            utterances,
            workdir / "room",
            cases,
            options.room_rounds,
            options.load,
            options.satellite_args,
        )
        if options.server_uri:
            result["server_args"] = [f"--server {options.server_uri}"]
        return result


def _server(options: BenchOptions, workdir: Path) -> contextlib.AbstractContextManager:
    if options.server_uri:
        return contextlib.nullcontext(servers.attach(options.server_uri))
    return servers.pivoice_server(workdir / "server.log", options.server_args)


def _proc(after: procstats.ProcSample, before: procstats.ProcSample, turns: int) -> dict:
    return {
        "peak_rss_mb": round(after.peak_rss_mb, 1),
        "rss_mb": round(after.rss_mb, 1),
        "cpu_s": round(after.cpu_s - before.cpu_s, 2),
        "cpu_ms_per_turn": round((after.cpu_s - before.cpu_s) * 1000 / turns, 1),
        "fds": after.fds,
        "threads": after.threads,
    }


def _server_settings(server_args: list[str]) -> ServerSettings:
    """The settings the server runs with (its CLI parsed with the bench's extra args)."""
    from wyoming_pivoice.server import settings_from_argv

    return settings_from_argv(server_args)


def _engine_settings(server_args: list[str]) -> tuple[AsrSettings, LlmSettings, TtsSettings]:
    settings = _server_settings(server_args)
    return settings.asr, settings.llm, settings.tts


def _remote_overhead(
    options: BenchOptions,
    utterances: list[corpus_mod.Utterance],
    server: servers.Child,
    workdir: Path,
) -> dict[str, Any]:
    """The bench's server (remote engine) against a twin on the local engine, same turns."""
    from wyoming_pivoice.engines import RemoteChat, RemoteLlmError
    from wyoming_pivoice.models import resolve_llm

    settings = _server_settings(options.server_args)
    assert settings.remote_llm is not None
    try:
        remote_model = asyncio.run(RemoteChat(settings.remote_llm, settings.llm).model())
    except RemoteLlmError as err:
        remote_model = f"? ({err})"
    texts = [u.text for u in utterances]
    local_args = remote.without_remote(options.server_args)
    with servers.pivoice_server(workdir / "server-local.log", local_args) as local:
        asyncio.run(servers.warm(local.uri))
        bar = Progress(options.rounds * len(texts) * 2, "remote LLM")
        section = asyncio.run(
            remote.compare(
                texts,
                {"remote": server.uri, "local": local.uri},
                options.rounds,
                options.turn_timeout,
                bar.step,
            )
        )
    section.update(
        url=settings.remote_llm.url,
        remote_model=remote_model,
        local_model=resolve_llm(settings.llm.model).stem,
        local_server_args=local_args,
    )
    return section


async def _latency(
    options: BenchOptions, utterances: list[corpus_mod.Utterance], configs: list[Config], uri: str
) -> tuple[list[dict], dict[int, bytes]]:
    rigs = {
        c.name: Rig(
            c,
            uri,
            options.silence_ms,
            realtime_playback=options.realtime_playback,
            min_clause_chars=options.min_clause_chars,
        )
        for c in configs
    }
    for rig in rigs.values():
        await rig.start()
    pcm = {u.id: u.pcm() for u in utterances}
    if options.warmup:  # one untimed turn per pipeline: first-call costs, VAD state
        for rig in rigs.values():
            await rig.turn(pcm[utterances[0].id], options.turn_timeout)
    turns: list[dict] = []
    audio: dict[int, bytes] = {}
    bar = Progress(options.rounds * len(utterances) * len(configs), "bench")
    try:
        for round_index in range(options.rounds):
            for position, utterance in enumerate(utterances):
                shift = (round_index + position) % len(configs)
                for config in configs[shift:] + configs[:shift]:
                    outcome = await rigs[config.name].turn(pcm[utterance.id], options.turn_timeout)
                    turn = _turn_record(config, round_index, utterance, outcome)
                    if outcome.audio is not None:
                        audio[len(turns)] = outcome.audio
                    turns.append(turn)
                    e2e = turn["stages_ms"].get("e2e_from_last_voiced")
                    bar.step(
                        f"{config.name} {utterance.id} "
                        + (f"{e2e:.0f} ms" if e2e is not None else turn["error"] or "")
                    )
    finally:
        for rig in rigs.values():
            await rig.stop()
    return turns, audio


def _turn_record(
    config: Config, round_index: int, utterance: corpus_mod.Utterance, outcome: TurnOutcome
) -> dict[str, Any]:
    base = {
        "config": config.name,
        "pipeline": config.pipeline,
        "speculate_ms": config.speculate_ms,
        "round": round_index,
        "utterance": utterance.id,
    }
    if not outcome.records:
        return {
            **base,
            "error": "no turn (the VAD heard no speech)" if not outcome.timed_out else "timed out",
            "stages_ms": {},
            "stamps": {},
            "transcript": "",
            "reply": "",
        }
    record = outcome.records[0]
    stamps = record["stamps"]
    used = bool(record["speculation"]["used"])
    stages = timing.stages(stamps, used)
    speech_end = outcome.started_at + utterance.speech_end_s
    stages["e2e_from_speech_end"] = timing.ms(speech_end, stamps.get("first_played"))
    error = record.get("error")
    if len(outcome.records) > 1:
        error = error or f"the utterance became {len(outcome.records)} turns"
    if outcome.timed_out:
        error = error or "timed out"
    return {
        **base,
        "turn": record["turn"],
        "transcript": record["transcript"],
        "heard": utterance.heard(record["transcript"]),
        "reply": record["reply"],
        "error": error,
        "speculation": record["speculation"],
        "silence_window_ms": record["silence_window_ms"],
        "satellite_ms": record["ms"],
        "stages_ms": stages,
        "stamps": stamps,
        "stamps_from_utterance_start_ms": {
            key: timing.ms(outcome.started_at, value) for key, value in stamps.items()
        },
        "speech_end_in_file_ms": round(utterance.speech_end_s * 1000, 1),
        "asr_audio_s": round(len(outcome.audio) / 32000, 2) if outcome.audio else None,
    }


def _summarize(result: dict[str, Any], turns: list[dict], configs: list[Config]) -> None:
    names = [c.name for c in configs]
    result["stages"] = report.stage_table(turns, names)
    result["heard"] = {
        name: {
            "heard": sum(1 for t in turns if t["config"] == name and t.get("heard")),
            "turns": sum(1 for t in turns if t["config"] == name),
            "errors": sum(1 for t in turns if t["config"] == name and t.get("error")),
        }
        for name in names
    }
    ratios: dict[str, Any] = {}
    if "streaming" in names and "sequential" in names:
        ratios["streaming_over_sequential"] = report.ratio_block(turns, "streaming", "sequential")
    if "streaming" in names and "streaming_nospec" in names:
        ratios["speculation_gain"] = report.gain_block(turns, "streaming", "streaming_nospec")
    ratios["overhead"] = {
        name: (result["stages"][name].get("overhead") or {}).get("median") for name in names
    }
    result["ratios"] = ratios


def _meta(options: BenchOptions, utterances: list, configs: list[Config]) -> dict[str, Any]:
    return {
        "version": __version__,
        "git": _git_commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": _cpu_name(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "system": platform.platform(),
        },
        "libraries": {
            name: _version(name)
            for name in (
                "faster-whisper",
                "ctranslate2",
                "llama_cpp_python",
                "piper-tts",
                "onnxruntime",
                "wyoming",
            )
        },
        "rounds": options.rounds if configs else 0,
        "utterances": len(utterances),
        "turns": options.rounds * len(utterances) * len(configs),
        "silence_window_ms": options.silence_ms,
        "speculate_ms": options.speculate_ms,
        "min_clause_chars": options.min_clause_chars,
        "server_args": options.server_args,
        "playback": "real-time null sink" if options.realtime_playback else "null sink",
        "conversation": "no history: each turn stands alone",
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "seconds": 0.0,
    }


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
