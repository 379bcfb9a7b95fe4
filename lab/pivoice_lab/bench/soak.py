"""`bench --soak N`: N turns through the whole loop, watching memory and descriptors.

One streaming satellite (speculation on, one conversation id, so the server's history
store is exercised too) says the corpus over and over against the server. Every
`every` turns the RSS and open descriptors of the server and of the satellite (this
process) are sampled. Growth is measured from the first sample after warm-up (the first
tenth of the turns, at least `every`) to the last: caches and allocator pools fill during
warm-up, a leak keeps growing after it.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

from . import procstats
from .progress import Progress
from .rig import Config, Rig
from .tables import summarize

if TYPE_CHECKING:
    from .corpus import Utterance
    from .options import BenchOptions
    from .servers import Child


def _sample(turn: int, server: Child, began: float, errors: int) -> dict[str, Any]:
    gc.collect()  # count what is really held, not garbage awaiting a collection
    figures: dict[str, Any] = {
        "turn": turn,
        "seconds": round(time.monotonic() - began, 1),
        "errors": errors,
    }
    theirs = server.sample()  # None: a server we cannot look at (not on this machine)
    for name, proc in (("server", theirs), ("satellite", procstats.sample())):
        if proc is not None:
            figures[name] = {
                "rss_mb": round(proc.rss_mb, 1),
                "fds": proc.fds,
                "threads": proc.threads,
                "cpu_s": round(proc.cpu_s, 1),
            }
    return figures


def growth(samples: list[dict[str, Any]], warmup_turns: int) -> dict[str, Any]:
    after = [s for s in samples if s["turn"] >= warmup_turns] or samples[-1:]
    first, last = after[0], samples[-1]
    out: dict[str, Any] = {}
    for name in ("server", "satellite"):
        if name not in last:
            continue
        start, end = first[name], last[name]
        out[name] = {
            "from_turn": first["turn"],
            "rss_start_mb": start["rss_mb"],
            "rss_end_mb": end["rss_mb"],
            "rss_max_mb": max(s[name]["rss_mb"] for s in after),
            "rss_growth_pct": round((end["rss_mb"] - start["rss_mb"]) / start["rss_mb"] * 100, 2),
            "fds_start": start["fds"],
            "fds_end": end["fds"],
            "fds_max": max(s[name]["fds"] for s in after),
            "fds_growth": end["fds"] - start["fds"],
        }
    return out


async def soak(server: Child, utterances: list[Utterance], options: BenchOptions) -> dict:
    config = Config(
        "soak",
        f"streaming (speculate {options.speculate_ms} ms)",
        "streaming",
        options.speculate_ms,
    )
    rig = Rig(
        config,
        server.uri,
        options.silence_ms,
        conversation_id="pivoice-bench-soak",
        realtime_playback=options.realtime_playback,
        min_clause_chars=options.min_clause_chars,
    )
    await rig.start()
    pcm = [u.pcm() for u in utterances]
    every = max(1, options.soak_every)
    warmup = max(every, options.soak // 10)
    began = time.monotonic()
    errors = 0
    error_texts: dict[str, int] = {}
    samples = [_sample(0, server, began, errors)]
    bar = Progress(options.soak, "soak")
    e2e: list[float] = []
    try:
        for index in range(options.soak):
            outcome = await rig.turn(pcm[index % len(pcm)], options.turn_timeout)
            record = outcome.records[0] if outcome.records else None
            problem = None if record is not None else "no turn"
            if record is not None:
                problem = record.get("error")
                value = record["ms"].get("e2e_from_last_voiced")
                if value is not None:
                    e2e.append(value)
            if outcome.timed_out:
                problem = problem or "timed out"
            if problem:
                errors += 1
                error_texts[problem] = error_texts.get(problem, 0) + 1
            if (index + 1) % every == 0 or index + 1 == options.soak:
                samples.append(_sample(index + 1, server, began, errors))
            bar.step(f"turn {index + 1}" + (f" error: {problem}" if problem else ""))
    finally:
        await rig.stop()
    return {
        "turns": options.soak,
        "seconds": round(time.monotonic() - began, 1),
        "errors": errors,
        "error_kinds": error_texts,
        "every": every,
        "warmup_turns": warmup,
        "pipeline": config.label,
        "conversation": "one conversation id for all turns (the server keeps its last 6)",
        "e2e_from_last_voiced_ms": summarize(e2e),
        "samples": samples,
        "growth": growth(samples, warmup),
    }
