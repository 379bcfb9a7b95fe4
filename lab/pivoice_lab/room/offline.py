"""The barge-in decision offline: the satellite's own canceller, VAD and fast barge-in, run
chunk by chunk on a recorded scene, so a change to the turn policy can be scored on many
scenes in seconds before the live bench (under load) decides.

A scene: a reply played in full (the canceller and the echo estimate settle, as after the
bench's first question), 1.2 s of quiet, a second reply; optionally the user talks over the
second reply at `onset_s` after it starts, at `gain_db` against the echo's own level at the
microphone (0: the user as loud as the echo). The speaker path and room are the lab's
(acoustics.py); the reference is handed over aligned to what plays, plus `ref_late_ms`.
`--barge-in-before S` calls a barge-in S seconds before the second reply, so the voice over it
meets a barge-in's trial (the bench's chained case: the first reply after a barge-in).

What it reports per scene: whether the fast barge-in fired while the user spoke and how
long after the voice's onset (the decision; the live cut adds 30-60 ms), and how many times
it fired with nobody speaking (self barge-ins). An offline score is a hypothesis: the live
bench under load decides (docs/room.md, session 9-10).

`--record FILE` keeps every chunk's evidence; `--replay FILE` scores the turn policy as it
is now on that evidence in seconds, without AEC3 or Silero (`replay`): exact up to a
scene's first recorded barge-in (the canceller restarts its second filter there), so a
variant that decides sooner is scored exactly, one that decides later a little harshly.
With `--linear --linear-gate 0` the linear filter's evidence is recorded on every chunk
with its ERLE estimate, so `--replay` can score any gate (`--replay-gate DB`) or none of it
(`--replay-gate off`: AEC3's rules alone) on one recording (the second Silero's state then
runs on where the live one is reset when the gate opens: close, not exact).
"""

from __future__ import annotations

import json
import math
import pickle
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from wyoming_pivoice.audio import (
    CHUNK_SAMPLES,
    CHUNK_SECONDS,
    Act,
    EchoCanceller,
    FastBargeIn,
    LinearScore,
    float_to_pcm16,
    tune_linear,
)
from wyoming_pivoice.engines import RecentSileroVad, SileroVad, silero_vad
from wyoming_pivoice.satellite import EchoSettings, Evidence, TurnPolicy, VadSettings, policy_from

from .acoustics import RATE, RoomAcoustics
from .scene import GAP_S, two_replies


@dataclass(frozen=True)
class Scene:
    room: RoomAcoustics
    onset_s: float | None = 1.0  # the user's onset after the second reply starts; None: no user
    gain_db: float = 0.0  # the user's active level against the echo's active level
    ref_late_ms: float = 0.0
    user: str = ""  # a label
    gap_s: float = GAP_S  # between the replies (live: the question, the server's answer)
    move_ms: float = 0.0  # the second reply's reference this much early: the delay moved
    # A barge-in this long before the second reply starts (None: none): its voice then meets
    # a barge-in's trial, as the first reply after a barge-in does live (bench chained).
    barge_in_before_s: float | None = None


@dataclass
class Outcome:
    scene: dict
    detected_after_s: float | None = None  # the fast barge-in's decision after the onset
    self_barge_ins: list[float] = field(default_factory=list)  # fired with nobody speaking:
    # seconds after the first reply's start
    # The reply held (a voice over it, maybe: turn_policy.suspect) after the onset; and held
    # with nobody speaking (seconds after the first reply's start). Offline the echo plays
    # on through a hold (live it stops): what comes after a hold is scored open loop.
    held_after_s: float | None = None
    false_holds: list[float] = field(default_factory=list)
    user_db: float | None = None
    echo_db: float | None = None
    voice_s: float | None = None  # how long the user's voice lasts
    # Over the voice's first 0.5 s, chunk by chunk: (VAD probability, excess over the echo).
    # …and of the linear filter beside AEC3 (VAD, excess; None: none).
    trace: list[tuple] = field(default_factory=list)
    # Every chunk's evidence, with its end in seconds after the voice's onset (or the first
    # reply's start), when `record`: a policy variant replays on it (`replay`).
    evidence: list[tuple[float, Evidence]] = field(default_factory=list)
    linear_erle: list[float] = field(default_factory=list)  # per recorded chunk: its estimate
    erle_db: float | None = None  # the canceller's ERLE estimate at the scene's end
    process_ms: float | None = None  # the canceller's median time per 32 ms chunk


def run_scene(
    scene: Scene,
    reply: tuple[bytes, int],
    user: np.ndarray | None,
    vad: SileroVad | RecentSileroVad,
    vad_settings: VadSettings | None = None,
    record: bool = False,
    linear_vad: SileroVad | None = None,
    echo_settings: EchoSettings | None = None,
    policy: TurnPolicy | None = None,
) -> Outcome:
    """Two replies through `scene.room`; `user` (16 kHz float) over the second at its onset."""
    two = two_replies(scene.room, reply, user, scene.onset_s, scene.gain_db, gap_s=scene.gap_s)
    mic, first, onset, end = two.mic, two.first, two.onset, two.end
    total = len(mic)
    outcome = Outcome(asdict(scene))
    if onset is not None and end is not None:
        outcome.voice_s = (end - onset) / RATE
        outcome.user_db = two.user_db
        outcome.echo_db = round(two.echo_db, 1)
    if echo_settings is None:
        echo_settings = EchoSettings(linear_barge_in=linear_vad is not None)
    canceller = EchoCanceller(echo_settings)
    linear = LinearScore(linear_vad) if linear_vad is not None else None
    two.feed_reference(canceller, scene.ref_late_ms / 1000, scene.move_ms / 1000)
    vad.reset()
    policy = policy or policy_from(vad_settings or VadSettings())
    fast = FastBargeIn(policy)
    costs: list[float] = []
    barge_in_at = None
    if scene.barge_in_before_s is not None:
        barge_in_at = two.second - round(scene.barge_in_before_s * RATE)
    for n in range(total // CHUNK_SAMPLES):
        lo = n * CHUNK_SAMPLES
        if barge_in_at is not None and lo >= barge_in_at:
            canceller.barge_in()
            barge_in_at = None
        chunk = float_to_pcm16(mic[lo : lo + CHUNK_SAMPLES])
        started = time.perf_counter()
        cleaned = canceller.process(chunk, (n + 1) * CHUNK_SECONDS)
        costs.append(time.perf_counter() - started)
        outcome.erle_db = round(canceller.estimate.erle_db, 1)
        outcome.process_ms = round(statistics.median(costs) * 1000, 3)
        samples = np.frombuffer(cleaned, dtype="<i2").astype(np.float32) / 32768
        probability = vad.probability(samples)
        linear_probability = linear.score(canceller) if linear is not None else None
        evidence = canceller.evidence(probability, linear_probability)
        chunk_end = lo + CHUNK_SAMPLES
        if record:
            outcome.evidence.append(((chunk_end - (onset or first)) / RATE, evidence))
            outcome.linear_erle.append(canceller.linear_estimate.erle_db)
        speaking = onset is not None and end is not None and onset < chunk_end <= end + RATE // 4
        if speaking and onset is not None and chunk_end - onset <= RATE // 2:
            excess, lin = evidence.excess_db, evidence.linear_excess_db
            outcome.trace.append(
                (round(probability, 2), excess and round(excess, 1),
                 evidence.linear_probability and round(evidence.linear_probability, 2),
                 lin and round(lin, 1))
            )  # fmt: skip
        act = fast.step(evidence, in_speech=False)
        if act is Act.HOLD:
            if speaking and onset is not None:
                if outcome.held_after_s is None:
                    outcome.held_after_s = round((chunk_end - onset) / RATE, 3)
            else:
                outcome.false_holds.append(round((chunk_end - first) / RATE, 2))
        if act is Act.INTERRUPT:
            if speaking and onset is not None:
                if outcome.detected_after_s is None:
                    outcome.detected_after_s = round((chunk_end - onset) / RATE, 3)
                canceller.barge_in()
                if not record:
                    break  # the live reply is cut here: nothing more to score
                fast = FastBargeIn(policy)  # a new candidate, as after a live cut
                continue
            outcome.self_barge_ins.append(round((chunk_end - first) / RATE, 2))
    return outcome


def replay(outcome: Outcome, policy: TurnPolicy, linear_gate_db: float | None = None) -> Outcome:
    """`outcome`'s scene scored again from its recorded evidence (run_scene with `record`)
    by a FastBargeIn of `policy`: what the turn policy as it is now decides there. With
    `linear_gate_db` the linear filter's evidence counts only where its recorded ERLE
    estimate was at least that (inf: never, AEC3's rules alone)."""
    again = Outcome(outcome.scene, user_db=outcome.user_db, echo_db=outcome.echo_db,
                    voice_s=outcome.voice_s)  # fmt: skip
    fast = FastBargeIn(policy)
    voice_s = outcome.voice_s if outcome.scene["onset_s"] is not None else None
    erles = outcome.linear_erle or [math.inf] * len(outcome.evidence)
    for (at, evidence), erle in zip(outcome.evidence, erles, strict=True):
        # `at`: after the onset (or the first reply's start)
        if linear_gate_db is not None and erle < linear_gate_db:
            evidence = replace(evidence, linear_probability=None, linear_residual_db=None,
                               linear_expected_db=None)  # fmt: skip
        act = fast.step(evidence, in_speech=False)
        speaking = voice_s is not None and 0 < at <= voice_s + 0.25  # run_scene's
        if act is Act.HOLD:
            if not speaking:
                again.false_holds.append(round(at, 2))
            elif again.held_after_s is None:
                again.held_after_s = round(at, 3)
        if act is not Act.INTERRUPT:
            continue
        if speaking:
            again.detected_after_s = round(at, 3)
            return again  # the live reply is cut here
        again.self_barge_ins.append(round(at, 2))
    return again


def summarise(outcomes: Iterable[Outcome], within_s: float = 0.3) -> dict:
    """Detection rate, decision latencies and self barge-ins over the scenes."""
    outcomes = list(outcomes)
    talked = [o for o in outcomes if o.scene["onset_s"] is not None]
    detected = [o.detected_after_s for o in talked if o.detected_after_s is not None]
    return {
        "scenes": len(outcomes),
        "talked_over": len(talked),
        "detected": len(detected),
        "decided_within": sum(d <= within_s for d in detected),
        "median_decision_s": statistics.median(detected) if detected else None,
        "self_barge_ins": sum(len(o.self_barge_ins) for o in outcomes),
        # The sound stops at a hold or a barge-in, whichever comes first.
        "stopped_within": sum(
            min(t for t in (o.held_after_s, o.detected_after_s) if t is not None) <= within_s
            for o in talked
            if o.held_after_s is not None or o.detected_after_s is not None
        ),
        "false_holds": sum(len(o.false_holds) for o in outcomes),
        # echo alone: the canceller's ERLE estimate at the scene's end (dB)
        "echo_alone_erle_db": [o.erle_db for o in outcomes if o.scene["onset_s"] is None],
        "median_process_ms": _median(o.process_ms for o in outcomes),
    }


def _median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(statistics.median(kept), 3) if kept else None


def aec3_config(text: str) -> dict[str, float | int | bool]:
    """`--aec3-config`: "field=value,..." with each field an EchoCanceller3Config path
    (pivoice_aec3.CONFIG_FIELDS) or its unique ending ("trigger_threshold",
    "nearend_tuning.mask_lf.enr_transparent"); values true/false, integers or floats."""
    if not text:
        return {}
    import pivoice_aec3

    fields: list[str] = list(pivoice_aec3.CONFIG_FIELDS)
    config: dict[str, float | int | bool] = {}
    for item in filter(None, text.split(",")):
        key, value = item.split("=")
        matches = [f for f in fields if f == key or f.endswith("." + key)]
        if len(matches) != 1:
            raise SystemExit(f"--aec3-config {key}: {len(matches)} fields match")
        low = value.lower()
        parsed: float | int | bool
        if low in ("true", "false"):
            parsed = low == "true"
        elif value.lstrip("-").isdigit():
            parsed = int(value)
        else:
            parsed = float(value)
        config[matches[0]] = parsed
    return config


# The two target rooms (the bench's), and rooms no rule was tuned on (session 13):
# other levels, delays, tails, drift, with and without the small speaker's distortion.
ROOMS = {
    "-6": RoomAcoustics(-6, 150, RoomAcoustics.tail_for_rt60(0.7), seed=1, highpass_hz=200,
                        clip_db=6, drift_ppm=100),
    "-3": RoomAcoustics(-3, 250, RoomAcoustics.tail_for_rt60(0.7), seed=2, highpass_hz=200,
                        clip_db=6, drift_ppm=-100),
    "-10": RoomAcoustics(-10, 20, RoomAcoustics.tail_for_rt60(0.4), seed=5, drift_ppm=50),
    "-4": RoomAcoustics(-4, 100, RoomAcoustics.tail_for_rt60(0.5), seed=6, highpass_hz=150,
                        drift_ppm=-50),
    "0": RoomAcoustics(0, 60, RoomAcoustics.tail_for_rt60(0.3), seed=7, highpass_hz=250,
                       clip_db=3, drift_ppm=30),
}  # fmt: skip


def main() -> None:  # pragma: no cover - a lab tool
    """python -m pivoice_lab.room.offline: the issue's rooms, the bench's commands over a
    Piper reply at the echo's level (±6 dB), and echo alone; a JSON summary."""
    import argparse

    from ..bench.corpus import ARCTIC_WAV, build, human_recording, read_wav_float

    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/pivoice-offline-corpus"))
    parser.add_argument("--gains", default="-6,0,6")
    parser.add_argument("--onsets", default="0.7,1.1,2.0")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--voices", type=Path, nargs="*", default=[], help="more users (WAV)")
    parser.add_argument("--rooms", default="-6,-3", help=f"of {', '.join(ROOMS)}")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--record", type=Path, help="keep every scene's evidence here")
    parser.add_argument("--replay", type=Path, help="score the policy on --record's file")
    parser.add_argument(
        "--linear", action="store_true", help="the linear filter beside AEC3 (EchoSettings)"
    )
    parser.add_argument("--drift", type=float, help="every room's drift (ppm), e.g. 0: one clock")
    parser.add_argument(
        "--linear-filter", default="mdf", help="mdf (SpeexDSP's) or aec3 (AEC3's own, native/aec3)"
    )
    parser.add_argument("--linear-gate", type=float, help="dB (echo.LINEAR_MIN_ERLE_DB)")
    parser.add_argument("--aec3-blocks", type=int, help="AEC3's filter length in 4 ms blocks")
    parser.add_argument("--replay-gate", help="dB, or off: the linear gate on --replay")
    parser.add_argument("--linear-rule", help="threshold,margin dB,frames (TurnPolicy.linear_*)")
    parser.add_argument("--move", type=float, default=0.0, help="ms: the second reply's delay")
    parser.add_argument(
        "--canceller", default="livekit", help="livekit or aec3 (ours, EchoSettings.canceller)"
    )
    parser.add_argument("--aec3-config", default="", help="field=value,... (our AEC3's config)")
    parser.add_argument("--hold", action="store_true", help="hold the reply (--hold-reply)")
    parser.add_argument(
        "--barge-in-before",
        type=float,
        help="s: a barge-in this long before the second reply (its voice meets a trial)",
    )
    parser.add_argument(
        "--state-span",
        type=int,
        default=VadSettings().state_span,
        help="Silero's state at most this many chunks old (--vad-state-span; 0: carried)",
    )
    args = parser.parse_args()
    policy = policy_from(VadSettings(hold_reply=args.hold))
    if args.linear_rule:
        threshold, margin, frames = args.linear_rule.split(",")
        policy = replace(
            policy,
            linear_threshold=float(threshold),
            linear_margin_db=float(margin),
            linear_min_speech_frames=int(frames),
        )
    if args.replay:
        recorded = pickle.loads(args.replay.read_bytes())
        gate = None
        if args.replay_gate is not None:
            gate = math.inf if args.replay_gate == "off" else float(args.replay_gate)
        _report([replay(o, policy, gate) for o in recorded], args.gains, args.json)
        return
    tune_linear(args.linear_gate, args.aec3_blocks, aec3_config(args.aec3_config))
    reply = _reply(args.corpus / "reply.pcm")
    corpus = build(args.corpus)
    users = [u for u in corpus if u.kind == "command"][: args.users]
    voices = [(u.id, _trim(u.samples())) for u in users]
    voices.append(("arctic", _trim(read_wav_float(human_recording(ARCTIC_WAV)))))
    voices += [(path.stem, _trim(read_wav_float(path))) for path in args.voices]
    rooms = [ROOMS[key] for key in args.rooms.split(",")]
    if args.drift is not None:
        rooms = [replace(room, drift_ppm=args.drift) for room in rooms]
    vad = silero_vad(args.state_span)
    linear_vad = SileroVad() if args.linear else None
    settings = EchoSettings(
        linear_barge_in=args.linear, linear_filter=args.linear_filter, canceller=args.canceller
    )
    record = args.record is not None
    outcomes = []
    for room in rooms:
        alone = Scene(room, onset_s=None, move_ms=args.move, barge_in_before_s=args.barge_in_before)
        outcomes.append(
            run_scene(alone, reply, None, vad, record=record, linear_vad=linear_vad,
                      echo_settings=settings, policy=policy)
        )  # fmt: skip
        for name, voice in voices:
            for gain in (float(g) for g in args.gains.split(",")):
                for onset in (float(o) for o in args.onsets.split(",")):
                    scene = Scene(
                        room, onset, gain, user=name, move_ms=args.move,
                        barge_in_before_s=args.barge_in_before,
                    )  # fmt: skip
                    outcomes.append(
                        run_scene(scene, reply, voice, vad, record=record,
                                  linear_vad=linear_vad, echo_settings=settings, policy=policy)
                    )  # fmt: skip
    if args.record:
        args.record.write_bytes(pickle.dumps(outcomes))
    _report(outcomes, args.gains, args.json)


def _report(outcomes: list[Outcome], gains: str, path: Path | None) -> None:  # pragma: no cover
    by_gain = {
        gain: summarise(o for o in outcomes if o.scene["gain_db"] == float(gain))
        for gain in gains.split(",")
    }
    rooms = {
        f"{o.scene['room']['echo_db']:g}dB/{o.scene['room']['delay_ms']:g}ms" for o in outcomes
    }
    by_room = {
        room: summarise(
            o
            for o in outcomes
            if f"{o.scene['room']['echo_db']:g}dB/{o.scene['room']['delay_ms']:g}ms" == room
        )
        for room in sorted(rooms)
    }
    report = {"all": summarise(outcomes), "by_gain": by_gain, "by_room": by_room}
    print(json.dumps(report, indent=1))
    if path:
        kept = [asdict(o) | {"evidence": [], "linear_erle": []} for o in outcomes]
        path.write_text(json.dumps([*kept, report], indent=1))


REPLY = (
    "Sure. Here is a short story about a cat who lived by the sea. Every morning she walked "
    "along the harbour and watched the boats come in with their nets full."
)


def _reply(path: Path) -> tuple[bytes, int]:
    """One Piper reply, synthesized once and kept (Piper's noise makes each take differ)."""
    from wyoming_pivoice.engines import PiperTts, TtsSettings

    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tts = PiperTts(TtsSettings())
        path.write_bytes(tts.synthesize(REPLY))
        path.with_suffix(".rate").write_text(str(tts.sample_rate))
    return path.read_bytes(), int(path.with_suffix(".rate").read_text())


def _trim(samples: np.ndarray) -> np.ndarray:
    """The voiced span, so the onset is the voice's."""
    from ..bench.corpus import speech_edges

    start, end = speech_edges(samples)
    return samples[max(0, round((start - 0.02) * RATE)) : round((end + 0.05) * RATE)]


if __name__ == "__main__":  # pragma: no cover
    main()
