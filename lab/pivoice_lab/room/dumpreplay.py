"""Is a leak AEC3's own, or live timing's? A bench room's `--aec-dump` (the microphone and the
reference as the satellite's canceller got them, frame by frame) replayed through one livekit
AEC3, never restarted, set beside the live frame lines (`Over the reply at T: …`).

Where the live residual and the replayed one agree, AEC3 did that on that input: the leak is
not a late loop, a moved reference or the barge-in's trial. (`bench --room` keeps the dump of
a room that made a self-made turn or a self barge-in.)

    python -m pivoice_lab.room.dumpreplay /tmp/bench/room/-3dB-…-aec --over 10

prints the frames over the reply whose live residual stood `--over` dB or more over the
expected residual, with the replayed residual beside it (the users' own voices among them:
the bench JSON's `user_spans` tell which).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .align import read_dump
from .echolog import OVER

RATE = 16000
FRAME = RATE // 100  # AEC3 takes 10 ms at a time


def replay(pairs: np.ndarray) -> np.ndarray:
    """The output of one AEC3 (livekit's, the satellite's default) fed `pairs` (n × 2 int16:
    microphone, reference) 10 ms at a time."""
    from wyoming_pivoice.audio import load_apm
    from wyoming_pivoice.satellite import EchoSettings

    apm = load_apm(EchoSettings())
    mic, ref = pairs[:, 0].copy(), pairs[:, 1].copy()
    out = np.zeros_like(mic)
    for i in range(0, len(mic) - FRAME + 1, FRAME):
        out[i : i + FRAME], _ = apm.frame(ref[i : i + FRAME].tobytes(), mic[i : i + FRAME])
    return out


def _db(samples: np.ndarray) -> float:
    x = samples.astype(np.float64) / 32768
    return 10 * float(np.log10(np.mean(x * x) + 1e-12))


@dataclass(frozen=True)
class Row:
    at: float  # monotonic: the chunk's capture
    live_mic_db: float
    live_residual_db: float
    expected_db: float
    replayed_residual_db: float


def compare(log: str, first: float, out: np.ndarray, chunk: int = 512) -> list[Row]:
    """Each live frame line beside the same chunk of the replay `out`, whose first sample is
    at monotonic `first` (the chunk ending at the line's time)."""
    rows = []
    for line in log.splitlines():
        match = OVER.search(line)
        mic = re.search(r"mic (\S+) dB", line)
        if match is None or mic is None:
            continue
        at = float(match.group(1))
        end = round((at - first) * RATE)
        if end - chunk < 0 or end > len(out):
            continue
        rows.append(
            Row(at, float(mic.group(1)), float(match.group(3)), float(match.group(4)),
                _db(out[end - chunk : end]))
        )  # fmt: skip
    return rows


def main() -> None:  # pragma: no cover - a lab tool
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("case", type=Path, help="a bench room's directory (aec.raw, satellite.log)")
    parser.add_argument("--over", type=float, default=10.0, help="dB over the expected residual")
    args = parser.parse_args()
    log = (args.case / "satellite.log").read_text()
    read = read_dump(args.case / "aec.raw", log)
    if read is None:
        parser.error(f"{args.case}: no aec.raw, or its satellite.log names no AEC dump")
    pairs, first = read
    rows = compare(log, first, replay(pairs))
    print(f"{len(rows)} frames over replies")
    for row in rows:
        if row.live_residual_db - row.expected_db >= args.over and row.live_mic_db > -45:
            print(
                f"{row.at:.3f}: mic {row.live_mic_db:.1f}, live residual "
                f"{row.live_residual_db:.1f}, replayed {row.replayed_residual_db:.1f}, "
                f"expected {row.expected_db:.1f} dBFS"
            )


if __name__ == "__main__":  # pragma: no cover
    main()
