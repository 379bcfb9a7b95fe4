"""What the echo alone left live: the turn policy's evidence over replies, read from the
satellite logs of `bench --room` (DEBUG lines `Over the reply at T: VAD p, mic m dB, residual r dB,
expected e dB`, the audio core's `Barge-in on the audio thread at T` and the timing log).

A rule that counts a frame the user's voice must not count what the echo leaves. This takes
every frame over a reply outside the users' utterances (from 1 s before a turn's speech start
to 0.5 s after its last voiced frame, and from 1.5 s before to 5 s after a barge-in: the user
goes on talking into the echo's tail) and, for each margin over the expected residual and each
Silero floor, counts the frames that would pass and the longest run of them in a row (what a
rule needing N frames is weighed against):

    python -m pivoice_lab.room.echolog /tmp/bench/room/*aec/satellite.log

Headset and no-AEC cases are skipped (no echo evidence).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

OVER = re.compile(
    r"Over the reply at ([\d.]+): VAD ([\d.]+), (?:mic \S+ dB, )?"
    r"residual (\S+) dB, expected (\S+) dB"
)
BARGE_IN = re.compile(r"Barge-in on the audio thread at ([\d.]+)")
SEQUENCE_GAP_S = 0.1  # frames further apart than this are two sequences


@dataclass(frozen=True)
class Frame:
    at: float  # monotonic capture time
    probability: float
    excess_db: float  # residual − expected residual


def read_log(log: Path) -> tuple[list[Frame], list[float], list[tuple[float, float]]]:
    """The frames over replies, the barge-ins, and the turns' (speech start, last voiced)."""
    frames, barge_ins = [], []
    for line in log.read_text(errors="replace").splitlines():
        if m := OVER.search(line):
            if "None" in (m.group(3), m.group(4)):
                continue
            excess = float(m.group(3)) - float(m.group(4))
            frames.append(Frame(float(m.group(1)), float(m.group(2)), excess))
        elif m := BARGE_IN.search(line):
            barge_ins.append(float(m.group(1)))
    turns = []
    timing = log.with_name("timing.jsonl")
    if timing.is_file():
        for line in timing.read_text().splitlines():
            stamps = json.loads(line)["stamps"]
            if start := stamps.get("speech_start"):
                turns.append((start, stamps.get("last_voiced") or start + 3.0))
    return frames, barge_ins, turns


def echo_alone(logs: Iterable[Path]) -> list[list[Frame]]:
    """The frames no user was speaking in, as runs of consecutive chunks."""
    sequences: list[list[Frame]] = []
    for log in logs:
        if "headset" in log.parent.name or "noaec" in log.parent.name:
            continue
        frames, barge_ins, turns = read_log(log)
        spans = [(b - 1.5, b + 5.0) for b in barge_ins] + [(s - 1.0, e + 0.5) for s, e in turns]
        current: list[Frame] = []
        for frame in frames:
            if any(a <= frame.at <= b for a, b in spans):
                continue
            if current and frame.at - current[-1].at > SEQUENCE_GAP_S:
                sequences.append(current)
                current = []
            current.append(frame)
        if current:
            sequences.append(current)
    return sequences


def longest_run(sequences: list[list[Frame]], passes: Callable[[Frame], bool]) -> tuple[int, int]:
    """(frames that pass, the longest run of them in a row)."""
    total = longest = 0
    for sequence in sequences:
        run = 0
        for frame in sequence:
            run = run + 1 if passes(frame) else 0
            total += passes(frame)
            longest = max(longest, run)
    return total, longest


def _passes(margin_db: float, floor: float) -> Callable[[Frame], bool]:
    return lambda f: f.excess_db >= margin_db and f.probability >= floor


def main() -> None:  # pragma: no cover - a lab tool
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("logs", type=Path, nargs="+", help="satellite.log files of bench --room")
    parser.add_argument("--margins", default="-12,-6,0,6,12,15,20,25")
    parser.add_argument("--floors", default="0,0.05,0.1,0.15,0.5,0.85")
    args = parser.parse_args()
    sequences = echo_alone(args.logs)
    print(f"{sum(len(s) for s in sequences)} frames over replies with nobody speaking")
    print("margin dB | Silero ≥ | frames | longest run")
    for margin in (float(m) for m in args.margins.split(",")):
        for floor in (float(f) for f in args.floors.split(",")):
            total, longest = longest_run(sequences, _passes(margin, floor))
            print(f"{margin:+6.0f} | {floor:.2f} | {total} | {longest}")


if __name__ == "__main__":  # pragma: no cover
    main()
