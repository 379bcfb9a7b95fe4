"""Figures from the bench's turn records, and the table printed from them.

Medians and 90th percentiles only (never means): a voice turn's latency has a long
tail and the median is what a user meets most. Ratios are taken between figures of
the same run.
"""

from __future__ import annotations

import statistics
from typing import Any

from .remote import render as render_remote
from .room import render as render_room
from .tables import median, render_table, summarize

# Stage rows of the table: (key in a turn's "stages_ms", label, boundary it measures).
STAGES: tuple[tuple[str, str, str], ...] = (
    ("endpoint_wait", "VAD endpoint wait", "last voiced frame → endpoint declared"),
    ("asr", "ASR", "ASR request (endpoint, or speculation start) → transcript"),
    ("asr_after_endpoint", "ASR after endpoint", "endpoint → transcript (≤ 0: ready before)"),
    ("llm_first_token", "LLM first token", "transcript → first reply token"),
    ("first_phrase", "LLM to first phrase", "first token → first phrase sent to TTS"),
    ("tts_first_audio", "TTS first audio", "phrase sent to TTS → first audio back"),
    ("play_start", "to speaker", "first audio back → first sample played"),
    ("e2e_from_endpoint", "E2E from endpoint", "endpoint → first reply sample played"),
    ("e2e_from_last_voiced", "E2E from last voiced", "last voiced frame → first reply sample"),
    (
        "compute",
        "model compute",
        "ASR + LLM (to the first phrase; sequential: whole reply) + TTS first audio, as the "
        "server timed them in that turn",
    ),
    ("overhead", "pipeline overhead", "E2E minus model compute minus the designed wait"),
    (
        "compute_replay",
        "compute in isolation",
        "the same, replayed on the same inputs in the bench process (--replay)",
    ),
    (
        "e2e_from_speech_end",
        "E2E from speech end",
        "end of the voice in the WAV (known from the file) → first reply sample",
    ),
)


def stage_table(turns: list[dict[str, Any]], configs: list[str]) -> dict[str, dict[str, Any]]:
    """{config: {stage: summary}} over the turns without an error."""
    table: dict[str, dict[str, Any]] = {}
    for config in configs:
        mine = [t for t in turns if t["config"] == config and not t.get("error")]
        table[config] = {
            key: summarize(t["stages_ms"].get(key) for t in mine) for key, _, _ in STAGES
        }
    return table


def per_utterance(turns: list[dict[str, Any]], config: str, key: str) -> dict[str, float]:
    """Median of a stage per utterance, over the rounds."""
    out: dict[str, float] = {}
    for uid in dict.fromkeys(t["utterance"] for t in turns):
        value = median(
            t["stages_ms"].get(key)
            for t in turns
            if t["config"] == config and t["utterance"] == uid and not t.get("error")
        )
        if value is not None:
            out[uid] = value
    return out


def ratio_block(
    turns: list[dict[str, Any]], top: str, bottom: str, key: str = "e2e_from_last_voiced"
) -> dict[str, Any] | None:
    """top/bottom of a stage, per utterance (median over rounds) and the median of those."""
    a, b = per_utterance(turns, top, key), per_utterance(turns, bottom, key)
    ratios = {uid: round(a[uid] / b[uid], 3) for uid in a if uid in b and b[uid] > 0}
    if not ratios:
        return None
    overall_a = median(t["stages_ms"].get(key) for t in turns if t["config"] == top)
    overall_b = median(t["stages_ms"].get(key) for t in turns if t["config"] == bottom)
    return {
        "stage": key,
        "per_utterance": ratios,
        "median": round(statistics.median(ratios.values()), 3),
        "ratio_of_medians": round(overall_a / overall_b, 3) if overall_a and overall_b else None,
    }


def gain_block(
    turns: list[dict[str, Any]], better: str, baseline: str, key: str = "e2e_from_last_voiced"
) -> dict[str, Any] | None:
    """baseline − better in ms, per utterance (medians over rounds) and its median."""
    a, b = per_utterance(turns, better, key), per_utterance(turns, baseline, key)
    gains = {uid: round(b[uid] - a[uid], 1) for uid in a if uid in b}
    if not gains:
        return None
    mine = [t for t in turns if t["config"] == better]
    return {
        "stage": key,
        "per_utterance_ms": gains,
        "median_ms": round(statistics.median(gains.values()), 1),
        "difference_of_medians_ms": round(
            (median(t["stages_ms"].get(key) for t in turns if t["config"] == baseline) or 0)
            - (median(t["stages_ms"].get(key) for t in mine) or 0),
            1,
        ),
        "speculation_used": sum(1 for t in mine if t.get("speculation", {}).get("used")),
        "speculation_cancelled": sum(t.get("speculation", {}).get("cancelled", 0) for t in mine),
        "turns": len(mine),
    }


# ---- text rendering -------------------------------------------------------------------------


def _cell(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "–"
    return f"{summary['median']:.0f} / {summary['p90']:.0f}"


def render(result: dict[str, Any]) -> str:
    """The whole report as text (markdown tables)."""
    out: list[str] = []
    meta = result["meta"]
    configs = result["configs"]
    out.append(
        f"wyoming-pivoice bench — {meta['turns']} turns, {meta['rounds']} round(s) × "
        f"{meta['utterances']} utterances × {len(configs)} pipelines; silence window "
        f"{meta['silence_window_ms']} ms; CPU: {meta['machine']['cpu']} "
        f"({meta['machine']['cores']} cores); took {meta['seconds']:.0f} s"
    )
    out.append("")
    if configs:
        out.extend(_render_latency(result))
    out.extend(_render_resources(result))
    for key, section in (("peers", render_peers), ("knobs", render_knobs), ("soak", render_soak)):
        if result.get(key):
            out.extend(section(result[key]))
    if result.get("wer"):
        from .wer import render as render_wer

        out.extend(render_wer(result["wer"]))
    if result.get("room"):
        out.extend(render_room(result["room"]))
    if result.get("remote_llm"):
        out.extend(render_remote(result["remote_llm"]))
    return "\n".join(out).rstrip() + "\n"


def _render_latency(result: dict[str, Any]) -> list[str]:
    configs = result["configs"]
    out: list[str] = []
    names = list(configs)
    headers = ["stage (ms, median / p90)", *[configs[n]["label"] for n in names]]
    rows = []
    for key, label, _boundary in STAGES:
        rows.append([label, *[_cell(result["stages"][n].get(key)) for n in names]])
    heard = result.get("heard", {})
    rows.append(
        [
            "transcripts heard",
            *[f"{heard[n]['heard']}/{heard[n]['turns']}" if n in heard else "–" for n in names],
        ]
    )
    out.append(render_table(headers, rows))
    out.append("")
    out.append("Boundaries: " + "; ".join(f"{label}: {boundary}" for _k, label, boundary in STAGES))
    out.append("")

    ratio = result.get("ratios", {}).get("streaming_over_sequential")
    if ratio:
        out.append(
            f"Perceived latency (last voiced frame → first reply sample), streaming / "
            f"sequential: median of per-utterance ratios {ratio['median']:.2f} "
            f"(ratio of medians {ratio['ratio_of_medians']:.2f})"
        )
        out.append(
            "  per utterance: "
            + ", ".join(f"{uid} {value:.2f}" for uid, value in ratio["per_utterance"].items())
        )
    gain = result.get("ratios", {}).get("speculation_gain")
    if gain:
        out.append(
            f"Speculative endpointing gain on E2E from last voiced: median "
            f"{gain['median_ms']:.0f} ms per utterance (difference of medians "
            f"{gain['difference_of_medians_ms']:.0f} ms); speculation used in "
            f"{gain['speculation_used']}/{gain['turns']} turns, {gain['speculation_cancelled']} "
            f"cancelled"
        )
    overhead = result.get("ratios", {}).get("overhead")
    if overhead:
        out.append(
            "Pipeline overhead (E2E − model compute − designed wait), median: "
            + ", ".join(
                f"{configs[n]['label']} {v:.0f} ms" for n, v in overhead.items() if v is not None
            )
        )
    out.append("")

    return out


def _render_resources(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    models = result.get("models", {})
    procs = result.get("processes", {})
    if models or procs:
        load = models.get("load_s")
        if load:
            out.append(
                "Model load (s, in parallel threads): "
                + ", ".join(f"{k} {v:.2f}" for k, v in load.items())
                + f"; server ready after {models['ready_s']:.2f} s"
            )
        elif models.get("note"):
            out.append(f"Model load: {models['note']}")
        rows = []
        for name, proc in procs.items():
            rows.append(
                [
                    name,
                    f"{proc['peak_rss_mb']:.0f}",
                    f"{proc['rss_mb']:.0f}",
                    f"{proc['cpu_s']:.1f}",
                    f"{proc['cpu_ms_per_turn']:.0f}",
                ]
            )
        if rows:
            out.append(
                render_table(
                    ["process", "peak RSS MB", "RSS MB at end", "CPU s (run)", "CPU ms / turn"],
                    rows,
                )
            )
        out.append("")

    return out


def render_peers(peers: dict[str, Any]) -> list[str]:
    out = ["Peers (same model files, loopback, requests alternated):"]
    asr = peers.get("asr", {})
    if asr.get("status") == "ok":
        out.append(
            f"  ASR audio-stop → transcript: pivoice {asr['pivoice_ms']['median']:.0f} ms, "
            f"wyoming-faster-whisper {asr['peer_ms']['median']:.0f} ms; ratio pivoice/peer "
            f"{asr['ratio_median']:.2f} (median per utterance)"
        )
    else:
        out.append(f"  ASR: {asr.get('status', 'not run')}")
    tts = peers.get("tts", {})
    if tts.get("status") == "ok":
        out.append(
            f"  TTS first audio, three-sentence reply: wyoming-piper (plain synthesize) "
            f"{tts['peer_ms']['median']:.0f} ms; pivoice same request "
            f"{tts['pivoice_plain_ms']['median']:.0f} ms (ratio {tts['ratio_pivoice_plain']:.2f}),"
            f" pivoice first phrase {tts['pivoice_first_phrase_ms']['median']:.0f} ms (ratio "
            f"{tts['ratio_pivoice_first_phrase']:.2f})"
        )
        out.append(
            f"  TTS as a non-streaming client gets it (wyoming-piper's audio-stop) "
            f"{tts['peer_complete_ms']['median']:.0f} ms; pivoice first phrase ratio "
            f"{tts['ratio_pivoice_first_phrase_vs_complete']:.2f}, same request ratio "
            f"{tts['ratio_pivoice_plain_vs_complete']:.2f}"
        )
    else:
        out.append(f"  TTS: {tts.get('status', 'not run')}")
    out.append("")
    return out


def render_knobs(knobs: dict[str, Any]) -> list[str]:
    load = knobs.get("load") or {}
    beside = (
        f"; {load['busy_processes']} busy processes on {load['cores']} cores, load average "
        f"{load['load_average_1m_end']} at the end"
        if load
        else ""
    )
    out = [f"Knobs (in process, same inputs; median / p90 ms, × default{beside}):"]
    rows = []
    for name, row in knobs.get("asr", {}).get("variants", {}).items():
        rows.append(
            [
                f"ASR {name}",
                _cell(row["ms"]),
                f"{row['vs_default']:.2f}",
                f"heard {row['heard']:.0%}",
            ]
        )
    for name, row in knobs.get("llm", {}).get("variants", {}).items():
        rate = row.get("tokens_per_s")
        rows.append(
            [
                f"LLM {name}",
                _cell(row["first_token_ms"]),
                f"{row['vs_default']:.2f}",
                f"{rate:.0f} tok/s" if rate else "",
            ]
        )
    for name, row in knobs.get("tts", {}).get("variants", {}).items():
        rows.append([f"TTS {name}", _cell(row["ms"]), "", ""])
    for name, row in knobs.get("overlap", {}).get("variants", {}).items():
        if "tts_first_audio_ms" in row:
            rows.append([f"TTS first audio, {name}", _cell(row["tts_first_audio_ms"]), "", ""])
            continue
        rate = row.get("llm_tokens_per_s_while_tts")
        rows.append(
            [
                f"TTS first audio while LLM runs, {name}",
                _cell(row["tts_first_audio_while_llm_ms"]),
                "",
                f"LLM {rate:.0f} tok/s while TTS runs" if rate else "",
            ]
        )
    out.append(render_table(["variant", "ms", "× default", "note"], rows))
    out.append("")
    return out


def render_soak(soak: dict[str, Any]) -> list[str]:
    out = [
        f"Soak: {soak['turns']} turns in {soak['seconds']:.0f} s "
        f"({soak['errors']} errors), samples every {soak['every']} turns:"
    ]
    rows = []
    for sample in soak["samples"]:
        row = [str(sample["turn"])]
        for name in ("server", "satellite"):  # a server not on this machine is not sampled
            proc = sample.get(name)
            row += [f"{proc['rss_mb']:.1f}", str(proc["fds"])] if proc else ["–", "–"]
        rows.append(row)
    out.append(
        render_table(
            ["turn", "server RSS MB", "server fds", "satellite RSS MB", "satellite fds"], rows
        )
    )
    for name, growth in soak["growth"].items():
        out.append(
            f"  {name}: RSS {growth['rss_start_mb']:.1f} → {growth['rss_end_mb']:.1f} MB after "
            f"warm-up ({growth['rss_growth_pct']:+.1f} %), fds {growth['fds_start']} → "
            f"{growth['fds_end']} ({growth['fds_growth']:+d})"
        )
    out.append("")
    return out
