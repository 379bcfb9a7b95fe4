"""`wyoming-pivoice bench` on the real models: it runs, and its JSON holds sane figures.

Never a speed assertion: speed claims come from running the bench, not from tests. The
run is tiny (2 utterances, 1 round, streaming and sequential) and uses the session's
server, so it adds well under a minute.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pivoice_lab.bench import corpus, report, runner, server_compute, servers
from pivoice_lab.bench.cli import add_parser, options_from_args
from pivoice_lab.bench.soak import growth
from wyoming_pivoice.compute_log import Compute, ComputeLog, Load, read

STAGE_KEYS = {key for key, _label, _boundary in report.STAGES}


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-corpus")


@pytest.fixture(scope="module")
def bench_result(
    server_port: int, corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    options = runner.BenchOptions(
        rounds=1,
        utterances=2,
        corpus_dir=corpus_dir,
        workdir=tmp_path_factory.mktemp("bench"),
        server_uri=f"tcp://127.0.0.1:{server_port}",
        warmup=False,
        compute_reps=1,
        speculation_baseline=False,
        soak=2,
        soak_every=1,
    )
    result = runner.run(options)
    # What --json writes must survive a round trip.
    return json.loads(json.dumps(result))


def test_corpus_is_short_spoken_commands(corpus_dir: Path) -> None:
    utterances = corpus.build(corpus_dir, limit=2)
    assert len(corpus.LINES) >= 12
    for utterance in utterances:
        assert 0.5 < utterance.speech_s < 6.0
        assert utterance.speech_start_s >= corpus.PAD_BEFORE_S - 0.05
        # At least the silence window (and then some) after the voice ends.
        assert utterance.duration_s - utterance.speech_end_s > 0.5


def test_bench_turns_are_real(bench_result: dict) -> None:
    turns = bench_result["turns"]
    assert len(turns) == 4  # 2 utterances × streaming, sequential × 1 round
    assert {t["config"] for t in turns} == {"streaming", "sequential"}
    for turn in turns:
        assert turn["error"] is None, turn
        assert turn["transcript"].strip()
        assert turn["heard"], turn["transcript"]
        assert turn["reply"].strip()
        stages = turn["stages_ms"]
        assert stages["e2e_from_last_voiced"] > 0
        assert stages["e2e_from_endpoint"] > 0
        # The endpoint comes after the last voiced frame by about the silence window.
        assert 0 < stages["endpoint_wait"] < 2000
        assert stages["e2e_from_last_voiced"] >= stages["e2e_from_endpoint"]
        assert stages["compute"] > 0
        # No log of the shared server to read here, so compute comes from the replay.
        assert turn["compute_source"] == "replay"
        replayed = turn["replay_compute_ms"]
        assert replayed["asr"] > 0 and replayed["tts_first_audio"] > 0 and replayed["llm"] > 0
        assert turn["asr_audio_s"] > 0.5


def test_bench_summary_keys(bench_result: dict) -> None:
    meta = bench_result["meta"]
    assert meta["silence_window_ms"] == 300
    assert meta["turns"] == 4 and meta["seconds"] > 0
    for config in ("streaming", "sequential"):
        stages = bench_result["stages"][config]
        assert set(stages) >= STAGE_KEYS
        e2e = stages["e2e_from_last_voiced"]
        assert e2e["n"] == 2 and 0 < e2e["median"] <= e2e["p90"]
    ratio = bench_result["ratios"]["streaming_over_sequential"]
    assert set(ratio["per_utterance"]) == {"kitchen", "time"}
    assert ratio["median"] > 0
    processes = bench_result["processes"]
    assert processes["server"]["peak_rss_mb"] > 100  # it holds three models
    assert processes["satellite (bench process)"]["peak_rss_mb"] > 0
    assert processes["server"]["cpu_s"] > 0


def test_soak_samples(bench_result: dict) -> None:
    soak = bench_result["soak"]
    assert soak["turns"] == 2 and soak["errors"] == 0
    assert [s["turn"] for s in soak["samples"]] == [0, 1, 2]
    for name in ("server", "satellite"):
        assert soak["growth"][name]["rss_start_mb"] > 0
        assert soak["growth"][name]["fds_end"] > 0


def test_rendered_table_names_every_stage(bench_result: dict) -> None:
    text = report.render(bench_result)
    for _key, label, _boundary in report.STAGES:
        assert label in text
    assert "streaming / sequential" in text
    assert "Soak: 2 turns" in text


def test_growth_is_measured_after_warmup() -> None:
    def sample(turn: int, rss: float, fds: int) -> dict:
        return {
            "turn": turn,
            "server": {"rss_mb": rss, "fds": fds},
            "satellite": {"rss_mb": rss / 2, "fds": fds},
        }

    samples = [
        sample(0, 100.0, 10),
        sample(10, 200.0, 12),
        sample(20, 202.0, 12),
        sample(30, 204.0, 12),
    ]
    result = growth(samples, warmup_turns=10)
    assert result["server"]["rss_start_mb"] == 200.0
    assert result["server"]["rss_growth_pct"] == 2.0
    assert result["server"]["fds_growth"] == 0


def test_ratios_are_per_utterance_medians() -> None:
    def turn(config: str, uid: str, e2e: float) -> dict:
        return {
            "config": config,
            "utterance": uid,
            "error": None,
            "stages_ms": {"e2e_from_last_voiced": e2e},
            "speculation": {"used": True},
        }

    turns = [
        turn("a", "x", 100),
        turn("a", "x", 300),
        turn("b", "x", 400),
        turn("a", "y", 50),
        turn("b", "y", 200),
        turn("b", "y", 200),
    ]
    block = report.ratio_block(turns, "a", "b")
    assert block["per_utterance"] == {"x": 0.5, "y": 0.25}
    assert block["median"] == 0.375
    gain = report.gain_block(turns, "a", "b")
    assert gain["per_utterance_ms"] == {"x": 200.0, "y": 150.0}


def test_cli_options() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    options = options_from_args(parser.parse_args(["bench", "--soak", "50"]))
    assert options.soak == 50 and not options.latency  # --soak alone skips the latency bench
    options = options_from_args(
        parser.parse_args(
            ["bench", "--rounds", "2", "--pipelines", "streaming", "--speculate-ms", "120"]
        )
    )
    assert options.latency and options.rounds == 2
    assert [c.name for c in runner.configs_for(options)] == ["streaming", "streaming_nospec"]


def test_server_compute_is_attributed_to_its_turn() -> None:
    t0 = 9.0  # monotonic time of the turn's endpoint
    records: list[Load | Compute] = [
        Load(1.0, "llm", "model", 1.5),
        Compute(10.0, "asr", "1", "tiny.en", 0.7, audio_seconds=1.5),
        Compute(10.3, "tts", "2", "joe", 0.25, first=0.15, audio_seconds=1.0),
        Compute(10.4, "llm", "3", "model", 0.4, first=0.05, tokens_in=40, tokens_out=8),
        Compute(30.0, "asr", "4", "tiny.en", 0.9, audio_seconds=1.0),  # another turn's
    ]
    turn = {
        "pipeline": "streaming",
        "error": None,
        "reply": "Sure, the lights are on now. Anything else?",
        "speculation": {"used": False},
        "stages_ms": {},
        "stamps": {
            "speech_start": t0 - 2,
            "endpoint": t0,
            "transcript": t0 + 1.0,
            "first_played": t0 + 1.3,
            "playback_done": t0 + 1.5,
        },
    }
    assert server_compute.attribute([turn], records, min_clause_chars=24) == 1
    compute = turn["server_compute_ms"]
    assert compute["asr"] == 700.0 and compute["tts_first_audio"] == 150.0
    # 8 tokens in the reply: (0.4 - 0.05) / 7 per token; the first phrase holds 28 of its 43
    # characters, so 5 of them.
    assert compute["llm_tokens"] == 5
    assert compute["llm"] == round((0.05 + 4 * 0.35 / 7) * 1000, 1)
    assert turn["stages_ms"]["overhead"] == round((1.3 - compute["total"] / 1000) * 1000, 1)

    # Sequential: the whole reply, and the whole synthesis (nothing plays before it is in).
    sequential = {**turn, "pipeline": "sequential", "stages_ms": {}}
    assert server_compute.attribute([sequential], records, min_clause_chars=24) == 1
    compute = sequential["server_compute_ms"]
    assert compute["llm"] == 400.0 and compute["tts_first_audio"] == 250.0
    assert compute["total"] == 700.0 + 400.0 + 250.0

    # An engine that cannot count tokens (remote): the phrase's share of the characters.
    uncounted = [
        replace(r, tokens_in=None, tokens_out=None) if isinstance(r, Compute) else r
        for r in records
    ]
    streaming = {**turn, "stages_ms": {}}
    assert server_compute.attribute([streaming], uncounted, min_clause_chars=24) == 1
    assert streaming["server_compute_ms"]["llm"] == round((0.05 + 0.35 * 28 / 43) * 1000, 1)


def test_compute_log_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "compute.jsonl"
    log = ComputeLog(path)
    before = time.monotonic()
    log.record_load("asr", "tiny.en", 0.75)
    log.record_compute("llm", "qwen", 0.4, first=0.05, tokens_in=40, tokens_out=8)
    log.record_compute("tts", "joe", 0.25, first=0.15, audio_seconds=1.0)
    with open(path, "a") as out:
        out.write('{"at": 1.0, "event": "load"')  # a line still being written
    records = read(path)
    assert [type(r) for r in records] == [Load, Compute, Compute]
    load, llm, tts = records
    assert load == Load(load.at, "asr", "tiny.en", 0.75)
    assert before - 1e-6 <= load.at <= llm.at <= tts.at <= time.monotonic() + 1e-6
    assert (llm.kind, llm.model, llm.tokens_in, llm.tokens_out, llm.first) == (
        "llm",
        "qwen",
        40,
        8,
        0.05,
    )
    assert tts.audio_seconds == 1.0 and tts.tokens_in is None
    assert llm.request != tts.request
    log.close()

    silent = ComputeLog(None)  # no path: records nothing, counts nothing
    silent.record_load("asr", "tiny.en", 1.0)
    silent.record_compute("asr", "tiny.en", 1.0)
    assert not silent.enabled and silent.prompt_tokens(object(), []) is None


def test_our_server_writes_its_compute_log(tmp_path: Path) -> None:
    """The real server (its own process, as the bench starts it) records its model loads and
    each request, token counts by its own model."""
    import asyncio

    with servers.pivoice_server(tmp_path / "server.log") as server:
        assert set(server.load_s) == {"asr", "tts", "llm"}
        assert all(seconds > 0 for seconds in server.load_s.values())
        asyncio.run(servers.warm(server.uri))  # one request to each model
        # A request's record follows its last reply event: wait for all three.
        deadline = time.monotonic() + 10
        while len(computed := {r.kind: r for r in server.compute() if isinstance(r, Compute)}) < 3:
            assert time.monotonic() < deadline, f"compute records: {server.compute()}"
            time.sleep(0.05)
    assert set(computed) == {"asr", "llm", "tts"}
    asr, llm, tts = computed["asr"], computed["llm"], computed["tts"]
    assert asr.audio_seconds == 0.5 and asr.model
    assert llm.first is not None and 0 < llm.first <= llm.seconds
    assert llm.tokens_in is not None and llm.tokens_in > 10  # the system prompt and "Hello."
    assert llm.tokens_out is not None and llm.tokens_out >= 1
    assert tts.first is not None and tts.audio_seconds is not None and tts.audio_seconds > 0.2


def test_peer_tts_comparison_times_first_audio_and_complete_audio(server_port: int) -> None:
    """The peers' TTS measurement, against our own server as the 'peer' (same protocol):
    every figure is a real timing, and a reply's audio is complete only after it began."""
    import asyncio

    from pivoice_lab.bench import peers

    uri = f"tcp://127.0.0.1:{server_port}"
    result = asyncio.run(peers._compare_tts(uri, uri, 1, 24, None))
    assert result["status"] == "ok"
    assert len(result["replies"]) == len(peers.THREE_SENTENCE_REPLIES)
    for reply in result["replies"]:
        assert reply["first_phrase"] and reply["text"].startswith(reply["first_phrase"])
        assert 0 < reply["peer_ms"] < reply["peer_complete_ms"]
    # Three sentences take longer to complete than the first one to start.
    assert result["peer_complete_ms"]["median"] > result["peer_ms"]["median"]
    assert (
        0 < result["ratio_pivoice_first_phrase_vs_complete"] < result["ratio_pivoice_first_phrase"]
    )


def test_bench_modules_import_no_circle() -> None:
    """Every import in bench/ (function-level ones too) points one way: no module reaches
    itself again through others."""
    import ast

    folder = Path(corpus.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:  # from .x / from . import x
                found |= {node.module} if node.module else {a.name for a in node.names}
        graph[path.stem] = {name.split(".")[0] for name in found}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for name in graph.get(start, ()):
            if name == target or (name not in seen and reaches(name, target, seen | {name})):
                return True
        return False

    assert [m for m in graph if reaches(m, m, set())] == []
