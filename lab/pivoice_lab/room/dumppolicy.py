"""A live bench room's capture side run again, whole, on what its microphone and speaker really
gave: the `--aec-dump` (microphone and reference as the canceller got them) fed chunk by chunk
to the satellite's own EchoCanceller, Silero and FastBargeIn, as the audio core runs them.

dumpreplay.py asks whether a leak is AEC3's own; this asks what the capture side as it is now
decides on the same input: a change to the echo estimate or the turn policy is weighed on the
frames that made a live self-made turn, in seconds, before a bench is spent on it.

    python -m pivoice_lab.room.dumppolicy B.json DIR/room/-3dB-…-aec

Every INTERRUPT outside a user's span (bench JSON `user_spans`, 0.3 s of slack) is the echo
taken for the user; for every span the room played over a reply, how soon after its onset it was
decided (None: not before the live satellite cut the reply there; after that the dump holds no
reply to decide over). The canceller is told of the live barge-ins where they happened, so it
runs as it did live. Open loop otherwise: a decision here does not cut the reference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio import CHUNK_SAMPLES, CHUNK_SECONDS, Act, EchoCanceller, FastBargeIn
from wyoming_pivoice.engines import silero_vad
from wyoming_pivoice.satellite import EchoSettings, VadSettings, policy_from

from .acoustics import RATE
from .align import read_dump
from .echolog import BARGE_IN
from .livereplay import SLACK_S, WITHIN_S, CaseReplay, decided_over, span_at

PIECE_SAMPLES = RATE // 10  # the reference handed over 100 ms at a time, as the sink does
LEAD_SECONDS = 0.5  # …this far ahead of the capture
REFRACTORY_S = 1.0  # after a decision the endpointer holds an utterance: no second count
FORMAT = AudioFormat(RATE, 2, 1)


@dataclass
class DumpReplay(CaseReplay):
    chunks: int = 0  # 32 ms chunks run


def replay(pairs: np.ndarray, first: float, barge_ins: list[float],
           spans: list[tuple[float, float]], over: list[float], name: str = "",
           trace: bool = False) -> DumpReplay:  # fmt: skip
    """`pairs` (n × 2 int16: microphone, reference) from monotonic `first`; the live barge-ins'
    times; the users' (onset, end) spans and the onsets the room played over a reply."""
    result = DumpReplay(name)
    canceller = EchoCanceller(EchoSettings())
    vad = silero_vad(VadSettings().state_span)
    policy = policy_from(VadSettings())
    fast = FastBargeIn(policy)
    mic, ref = pairs[:, 0], pairs[:, 1]
    fed, cuts, next_cut = 0, sorted(barge_ins), 0
    decided: dict[int, float] = {}
    quiet_until = -1.0
    for n in range(len(mic) // CHUNK_SAMPLES):
        end = (n + 1) * CHUNK_SAMPLES
        while fed < min(end + LEAD_SECONDS * RATE, len(ref)):
            piece = ref[fed : fed + PIECE_SAMPLES]
            if np.any(piece):  # the sink reports what it plays; silence between replies is not
                canceller.reference(piece.tobytes(), FORMAT, fed / RATE)
            fed += PIECE_SAMPLES
        at = first + end / RATE
        while next_cut < len(cuts) and cuts[next_cut] <= at:
            next_cut += 1
            canceller.barge_in()
        cleaned = canceller.process(mic[end - CHUNK_SAMPLES : end].tobytes(), end / RATE)
        samples = np.frombuffer(cleaned, dtype="<i2").astype(np.float32) / 32768
        evidence = canceller.evidence(vad.probability(samples))
        result.chunks += 1
        if trace and any(a - 0.3 <= at <= a + 1.0 for a in over):
            print(f"  {at:.3f} ref {canceller.chunk_ref_db:6.1f} VAD {evidence.probability:.2f} "
                  f"residual {evidence.residual_db} expected {evidence.expected_residual_db}"
                  f" playing {evidence.playing} settled {evidence.settled}")  # fmt: skip
        act = fast.step(evidence, in_speech=at < quiet_until)
        if act is not Act.INTERRUPT or at < quiet_until:
            continue
        quiet_until = at + REFRACTORY_S
        user = span_at(spans, at)
        if user is None:
            result.self_barge_ins.append(round(at, 3))
        elif at <= _live_cut(cuts, spans[user]) + CHUNK_SECONDS:
            decided.setdefault(user, at - spans[user][0])
            quiet_until = max(quiet_until, spans[user][1] + SLACK_S)
        fast = FastBargeIn(policy)
    result.decided_after_s = decided_over(spans, over, decided)
    return result


def _live_cut(cuts: list[float], span: tuple[float, float]) -> float:
    """When the live satellite cut the reply over this span (inf: it did not). After that the
    dump holds no reply to decide over: a later decision here is not one live could make."""
    return next((c for c in cuts if span[0] - SLACK_S <= c <= span[1] + SLACK_S), float("inf"))


def replay_case(bench_json: Path, case_dir: Path, trace: bool = False) -> DumpReplay:
    """One room of a bench (its JSON and the room's directory under --workdir/room)."""
    cases = {c["name"]: c for c in json.loads(bench_json.read_text())["room"]["cases"]}
    case = cases[case_dir.name]
    log = (case_dir / "satellite.log").read_text()
    read = read_dump(case_dir / "aec.raw", log)
    if read is None:
        raise SystemExit(f"{case_dir}: no aec.raw, or its satellite.log names no AEC dump")
    pairs, first = read
    barge_ins = [float(m.group(1)) for m in BARGE_IN.finditer(log)]
    spans = [(a, b) for a, b in case.get("user_spans", [])]
    over = [t["onset"] for t in case.get("trials", []) if t.get("over_reply")]
    return replay(pairs, first, barge_ins, spans, over, case_dir.name, trace)


def main() -> None:  # pragma: no cover - a lab tool
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("rooms", type=Path, nargs="+", help="rooms' directories (aec.raw)")
    parser.add_argument("--trace", action="store_true", help="every chunk near the users' onsets")
    args = parser.parse_args()
    for room in args.rooms:
        result = replay_case(args.bench_json, room, args.trace)
        ms = [round(d * 1000) if d is not None else None for d in result.decided_after_s]
        print(
            f"{result.name}: {result.chunks} chunks; echo taken for the user at "
            f"{result.self_barge_ins}; over replies within {WITHIN_S * 1000:.0f} ms "
            f"{result.within}/{len(ms)}: {ms}"
        )


if __name__ == "__main__":  # pragma: no cover
    main()
