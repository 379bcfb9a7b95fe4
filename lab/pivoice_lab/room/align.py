"""Where the satellite put its reference and its microphone against what the room played and
heard: the satellite's `--aec-dump` (what AEC3 compared, frame by frame) beside the room's
recordings (`Room(record=True)`), window by window, by cross-correlation.

A sample the room played at time P that the satellite placed at P + r, and whose echo the room
captured at P + D and the satellite placed at P + D + m, reaches AEC3 with a lag of D + m − r:
`reference_ms` is r, `microphone_ms` m. A reference placed later than its echo (r > D + m)
cannot be cancelled; a lag that moves between replies is one AEC3 must find again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wyoming_pivoice.audio import normalised_xcorr

from .acoustics import RATE

SILENT_RMS = 1e-3  # a window quieter than −60 dBFS places nothing
DUMP_START = re.compile(r"AEC dump to \S+ from monotonic ([\d.]+)")


def read_dump(dump: Path, log: str) -> tuple[np.ndarray, float] | None:
    """A `--aec-dump` file as (n × 2 int16: microphone, reference) and the monotonic time of
    its first sample, from the satellite's log; None where either is missing."""
    match = DUMP_START.search(log)
    if match is None or not dump.is_file():
        return None
    pairs = np.frombuffer(dump.read_bytes(), dtype="<i2").reshape(-1, 2)
    return pairs, float(match.group(1))


@dataclass(frozen=True)
class Placement:
    at: float  # monotonic time of the window's start
    reference_ms: float | None  # how much later the reference was placed than it played
    microphone_ms: float | None  # how much later the microphone was placed than captured


def shift(
    placed: np.ndarray, truth: np.ndarray, offset: int, window: int, search: int
) -> int | None:
    """d (samples) such that placed[:window] matches truth[offset + d:][:window] best, |d| ≤
    search; None where either is silent or they do not match (normalised peak < 0.8)."""
    lo = offset - search
    if lo < 0 or offset + window + search > len(truth) or len(placed) < window:
        return None
    a = placed[:window].astype(np.float64)
    b = truth[lo : offset + window + search].astype(np.float64)
    if np.sqrt(np.mean(a * a)) < SILENT_RMS:
        return None
    match = normalised_xcorr(a, b)  # 2 * search + 1 lags
    k = int(np.argmax(match))
    if match[k] < 0.8:
        return None
    return k - search


def placements(
    dump: np.ndarray,
    dump_start: float,
    room_mic: np.ndarray,
    room_source: np.ndarray,
    room_start: float,
    times: list[float],
    window_s: float = 0.256,
    search_s: float = 0.15,
) -> list[Placement]:
    """At each monotonic time in `times`: `dump` (n × 2: microphone, reference, as s16 from
    --aec-dump; its first sample at `dump_start`) against the room's microphone and what it
    played (float, from `room_start`)."""
    window, search = round(window_s * RATE), round(search_s * RATE)
    out = []
    for at in times:
        i = round((at - dump_start) * RATE)
        j = round((at - room_start) * RATE)
        if i < 0 or i + window > len(dump):
            out.append(Placement(at, None, None))
            continue
        found = []
        for channel, truth in ((1, room_source), (0, room_mic)):
            placed = dump[i : i + window, channel].astype(np.float64) / 32768
            d = shift(placed, truth, j, window, search)
            found.append(None if d is None else round(-d / RATE * 1000, 2))
        out.append(Placement(at, found[0], found[1]))
    return out
