"""What the remote LLM engine adds (`bench --server-arg=--llm-url=…`).

The same text turns go, alternately, to the bench's server (conversation on the remote
engine) and to a second server with the same options but the local engine (--llm-model);
each is timed from the client: the first `handled-chunk`, the whole reply, and the time
per piece after the first. With the remote engine serving the same GGUF (e.g. llama-cpp-
python's server on the embedded SmolLM2), the differences are the remote path's overhead:
HTTP, SSE, JSON and the client library on top of the same model compute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from wyoming.client import AsyncClient
from wyoming.event import Event

from .tables import render_table, summarize

# The server options that make the conversation remote; the local twin runs without them.
REMOTE_FLAGS = (
    "--llm-url",
    "--llm-api-key",
    "--llm-remote-model",
    "--llm-timeout",
    "--llm-fallback",
)


def uses_remote(server_args: list[str]) -> bool:
    return any(_flag(arg) == "--llm-url" for arg in server_args)


def without_remote(server_args: list[str]) -> list[str]:
    """The server's options without the remote engine's (`--flag=value` or `--flag value`)."""
    kept: list[str] = []
    skip_value = False
    for arg in server_args:
        if skip_value:
            skip_value = False
            continue
        if _flag(arg) in REMOTE_FLAGS:
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    return kept


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0]


async def _turn(uri: str, text: str, timeout: float) -> dict[str, Any]:
    """One conversation turn (no history), timed from sending it."""
    start = time.monotonic()
    pieces = 0
    first: float | None = None

    async def converse() -> str | None:
        """The turn's reply read to its end; the reason when it failed."""
        nonlocal pieces, first
        async with AsyncClient.from_uri(uri) as client:
            await client.write_event(Event("transcript", {"text": text}))
            while True:
                event = await client.read_event()
                if event is None or event.type == "error":
                    return "closed" if event is None else str(event.data.get("text") or "error")
                if event.type == "handled-chunk":
                    pieces += 1
                    first = first or time.monotonic() - start
                elif event.type == "handled-stop":
                    return None

    error = await asyncio.wait_for(converse(), timeout)
    if error is not None:
        return {"error": error}
    total = time.monotonic() - start
    per_piece = (total - first) / (pieces - 1) if first is not None and pieces > 1 else None
    return {
        "first_ms": None if first is None else round(first * 1000, 1),
        "total_ms": round(total * 1000, 1),
        "per_piece_ms": None if per_piece is None else round(per_piece * 1000, 2),
        "pieces": pieces,
    }


async def compare(
    texts: list[str],
    engines: dict[str, str],
    rounds: int,
    timeout: float = 120.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Each text on each engine's server (name → Wyoming URI), alternating, `rounds` times."""
    turns: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    names = list(engines)
    for name in names:  # one untimed turn each: first-call costs
        await _turn(engines[name], texts[0], timeout)
    for round_index in range(rounds):
        for position, text in enumerate(texts):
            shift = (round_index + position) % len(names)
            for name in names[shift:] + names[:shift]:
                turns[name].append(await _turn(engines[name], text, timeout))
                if progress is not None:
                    progress(f"{name} {position}")
    summary = {
        name: {
            key: summarize(t.get(key) for t in done)
            for key in ("first_ms", "total_ms", "per_piece_ms", "pieces")
        }
        | {"errors": sum(1 for t in done if t.get("error")), "turns": len(done)}
        for name, done in turns.items()
    }
    return {"turns": turns, "summary": summary, "overhead": _overhead(summary)}


def _overhead(summary: dict[str, Any]) -> dict[str, float | None]:
    """remote − local, of the medians."""
    remote, local = summary.get("remote") or {}, summary.get("local") or {}
    out: dict[str, float | None] = {}
    for key in ("first_ms", "per_piece_ms", "total_ms"):
        a, b = remote.get(key), local.get(key)
        out[key] = None if not a or not b else round(a["median"] - b["median"], 2)
    return out


def render(section: dict[str, Any]) -> list[str]:
    summary = section["summary"]
    names = list(summary)
    rows = []
    for key, label in (
        ("first_ms", "first piece (ms)"),
        ("per_piece_ms", "per piece after it (ms)"),
        ("total_ms", "whole reply (ms)"),
        ("pieces", "pieces"),
    ):
        rows.append([label, *[_cell(summary[n].get(key)) for n in names]])
    rows.append(["errors", *[f"{summary[n]['errors']}/{summary[n]['turns']}" for n in names]])
    out = [
        f"Remote LLM engine ({section.get('remote_model') or 'remote'} at "
        f"{section.get('url')}) against the local engine ({section.get('local_model')}), "
        "text turns through each server, median / p90:",
        render_table(["", *names], rows),
    ]
    overhead = section["overhead"]
    out.append(
        "Remote overhead (remote − local, medians): "
        + ", ".join(
            f"{label} {overhead[key]:+.1f} ms"
            for key, label in (
                ("first_ms", "first piece"),
                ("per_piece_ms", "per piece"),
                ("total_ms", "whole reply"),
            )
            if overhead.get(key) is not None
        )
    )
    out.append("")
    return out


def _cell(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "–"
    return f"{summary['median']:.1f} / {summary['p90']:.1f}"
