"""What every bench section's figures are made of: medians and 90th percentiles (never means:
a voice turn's latency has a long tail, and the median is what a user meets most), and the
markdown tables they are printed in."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import numpy as np


def summarize(values: Iterable[float | None]) -> dict[str, float | int] | None:
    clean = [float(v) for v in values if v is not None]
    if not clean:
        return None
    return {
        "median": round(statistics.median(clean), 1),
        "p90": round(float(np.percentile(clean, 90)), 1),
        "n": len(clean),
    }


def median(values: Iterable[float | None]) -> float | None:
    clean = [float(v) for v in values if v is not None]
    return statistics.median(clean) if clean else None


def render_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        padded = (
            str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i])
            for i, c in enumerate(cells)
        )
        return "| " + " | ".join(padded) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])
