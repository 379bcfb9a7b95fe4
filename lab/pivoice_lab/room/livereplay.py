"""The turn policy replayed on what a live `bench --room` logged: a variant of the barge-in
rules weighed on the frames the satellite really saw under load, before a bench is spent on it.

The satellite's DEBUG lines (`Over the reply at T: VAD p, …, residual r dB, expected e dB`:
echolog.read_log) are fed, frame by frame, to the audio core's own `FastBargeIn` with the
policy asked for; the bench's JSON gives when the user spoke (`user_spans`, on the same
monotonic clock) and which of it the room heard over a reply (its trials' `onset`). Every
INTERRUPT outside a user's span (0.3 s of slack) is a self barge-in; for every span over a
reply, how soon after its onset the policy decided:

    wyoming-pivoice bench --room --workdir DIR --json B.json …
    python -m pivoice_lab.room.livereplay B.json DIR --set plain_threshold=0.01

The policy is the satellite's default (VadSettings) with `--set field=value` on it. What is
replayed is what the live policy let happen: after its barge-in the reply stopped and the echo
died away, so a variant that decides later than the live one is judged on easier frames than it
would have met (an upper bound for it); one that decides sooner is judged fairly up to then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from wyoming_pivoice.audio import Act, FastBargeIn
from wyoming_pivoice.satellite import Evidence, TurnPolicy, VadSettings, policy_from

from .echolog import SEQUENCE_GAP_S, Frame, read_log

SLACK_S = 0.3  # a decision this close to a user's span is the user's (bench/room.py's)
WITHIN_S = 0.3  # #20's target: decided this soon after the onset
ECHO_COUPLING_DB = -6.0  # any coupling the policy takes for an echo: the frames carry no level


@dataclass
class CaseReplay:
    name: str
    self_barge_ins: list[float] = field(default_factory=list)  # monotonic times
    decided_after_s: list[float | None] = field(default_factory=list)  # per span over a reply

    @property
    def within(self) -> int:
        return sum(1 for d in self.decided_after_s if d is not None and d <= WITHIN_S)


def replay(frames: list[Frame], spans: list[tuple[float, float]], over: list[float],
           policy: TurnPolicy, name: str = "") -> CaseReplay:  # fmt: skip
    """One room's frames through FastBargeIn; `spans`: the user's (onset, end); `over`: the
    onsets the room heard over a reply (its barge-in trials)."""
    result = CaseReplay(name)
    decided: dict[int, float] = {}
    fast, previous, busy_until = FastBargeIn(policy), None, None
    for frame in frames:
        if previous is not None and frame.at - previous > SEQUENCE_GAP_S:
            fast = FastBargeIn(policy)  # another reply: the live core's counts end with it
        previous = frame.at
        if busy_until is not None and frame.at <= busy_until:
            continue  # the user's turn under way: the endpointer's, not a barge-in's
        evidence = Evidence(
            frame.probability, playing=True, coupling_db=ECHO_COUPLING_DB,
            residual_db=frame.excess_db, expected_residual_db=0.0,
        )  # fmt: skip
        if fast.step(evidence, in_speech=False) is not Act.INTERRUPT:
            continue
        user = span_at(spans, frame.at)
        if user is None:
            result.self_barge_ins.append(frame.at)
            fast = FastBargeIn(policy)
            continue
        decided.setdefault(user, frame.at - spans[user][0])
        busy_until = spans[user][1] + SLACK_S
        fast = FastBargeIn(policy)
    result.decided_after_s = decided_over(spans, over, decided)
    return result


def span_at(spans: list[tuple[float, float]], at: float) -> int | None:
    """The user's span a decision at `at` belongs to (SLACK_S either side), or None."""
    return next((i for i, (a, b) in enumerate(spans) if a - SLACK_S <= at <= b + SLACK_S), None)


def decided_over(spans: list[tuple[float, float]], over: list[float],
                 decided: dict[int, float]) -> list[float | None]:  # fmt: skip
    """For every span the room played over a reply (its onset in `over`), how soon after the
    onset it was decided (`decided`: by span index), None where it was not."""
    heard = [i for i, (a, _) in enumerate(spans) if any(abs(a - o) < 0.01 for o in over)]
    return [round(decided[i], 3) if i in decided else None for i in heard]


def policy_with(settings: list[str]) -> TurnPolicy:
    """The default policy with `field=value` settings on it (numbers, or true/false)."""
    policy = policy_from(VadSettings())
    types = {f.name: f.type for f in fields(TurnPolicy)}
    changes: dict[str, Any] = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if name not in types:
            raise SystemExit(f"{name!r} is not a TurnPolicy field: one of {', '.join(types)}")
        kind = str(types[name])
        if kind == "bool":
            changes[name] = value.lower() in ("1", "true", "yes")
        else:
            changes[name] = int(value) if kind == "int" else float(value)
    return replace(policy, **changes)


def replay_bench(bench_json: Path, workdir: Path, policy: TurnPolicy) -> list[CaseReplay]:
    """Every echoing room of a bench's run (its JSON and its --workdir)."""
    cases = json.loads(bench_json.read_text())["room"]["cases"]
    results = []
    for case in cases:
        name = case["name"]
        if "headset" in name or "noaec" in name:
            continue
        trials = case.get("trials", [])
        if "user_spans" not in case or not all("onset" in t for t in trials):
            raise SystemExit(
                f"{bench_json} has no user_spans or trial onsets (a bench older than them): run it "
                "again"
            )
        log = workdir / "room" / name / "satellite.log"
        frames, _, _ = read_log(log)
        spans = [(a, b) for a, b in case["user_spans"]]
        over = [t["onset"] for t in trials if t.get("over_reply")]
        results.append(replay(frames, spans, over, policy, name))
    return results


def main() -> None:  # pragma: no cover - a lab tool
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("workdir", type=Path, help="the bench's --workdir")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    args = parser.parse_args()
    for label, settings in (("default", []), ("variant", args.set)):
        if label == "variant" and not settings:
            break
        total_self = total_within = total = 0
        print(f"{label} {' '.join(settings)}")
        for case in replay_bench(args.bench_json, args.workdir, policy_with(settings)):
            ms = [round(d * 1000) if d is not None else None for d in case.decided_after_s]
            print(f"  {case.name}: self barge-ins {len(case.self_barge_ins)}, within "
                  f"{WITHIN_S * 1000:.0f} ms {case.within}/{len(ms)}: {ms}")  # fmt: skip
            total_self += len(case.self_barge_ins)
            total_within += case.within
            total += len(ms)
        print(f"  all: self barge-ins {total_self}, within {WITHIN_S * 1000:.0f} ms "
              f"{total_within}/{total}")  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    main()
