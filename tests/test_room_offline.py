"""The lab's offline barge-in evaluator on real parts (AEC3, Silero, the core's FastBargeIn):
what it scores is what the satellite decides, so its answers must hold on a plain scene."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pivoice_lab.bench.room import target_cases
from pivoice_lab.room.offline import Scene, replay, run_scene, summarise
from tests.helpers import make_speech, read_wav
from wyoming_pivoice.engines import SileroVad

pytestmark = pytest.mark.slow  # Silero and AEC3 over ~40 s of audio

ROOM = target_cases()[0].acoustics(seed=1)


def _read(path):
    return read_wav(path)[:2]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("offline")
    reply = _read(
        make_speech(
            "Here is a joke about cats. Why did the cat sit on the computer? To keep an eye "
            "on the mouse. And then it fell asleep on the keyboard.",
            folder / "reply.wav", rate=22050, pad_before=0.0, pad_after=0.0,
        )
    )  # fmt: skip
    pcm, _ = _read(make_speech("Stop, turn off the kitchen lights.", folder / "user.wav",
                               voice="en-us+f3", pad_before=0.0, pad_after=0.0))  # fmt: skip
    user = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    return reply, user, SileroVad()


def test_echo_alone_never_barges_in_and_a_voice_over_it_does(parts):
    reply, user, vad = parts
    alone = run_scene(Scene(ROOM, onset_s=None), reply, None, vad)
    assert alone.self_barge_ins == []
    louder = run_scene(Scene(ROOM, onset_s=1.5, gain_db=6.0), reply, user, vad)
    assert louder.detected_after_s is not None and 0 < louder.detected_after_s < 1.0
    assert louder.user_db == pytest.approx(louder.echo_db + 6.0, abs=0.5)  # the level asked
    summary = summarise([alone, louder])
    assert summary["talked_over"] == 1 and summary["detected"] == 1
    assert summary["self_barge_ins"] == 0


def test_a_barge_in_before_the_second_reply_puts_its_voice_in_the_trial(parts):
    """--barge-in-before: the voice over the first reply after a barge-in (the bench's
    chained case) meets a barge-in's trial, where at most echo.TRIAL_ERLE_DB of the
    cancelling measured before counts (here ~19 dB was); louder than the echo, it is still
    decided."""
    reply, user, vad = parts
    scene = Scene(ROOM, onset_s=1.5, gain_db=6.0)
    plain = run_scene(scene, reply, user, vad, record=True)
    trial = run_scene(replace(scene, barge_in_before_s=0.6), reply, user, vad, record=True)

    def expected(outcome):  # over the reply, settled, in the second before the voice
        return [
            e.expected_residual_db for t, e in outcome.evidence
            if -1.0 < t < 0 and e.playing and e.settled and e.expected_residual_db is not None
        ]  # fmt: skip

    pairs = list(zip(expected(plain), expected(trial), strict=True))
    assert len(pairs) > 20
    assert all(b >= a - 0.5 for a, b in pairs)  # the cap only ever expects more echo
    assert min(b for _, b in pairs) > min(a for a, _ in pairs) + 3
    assert trial.detected_after_s is not None and 0 < trial.detected_after_s < 1.0


# AEC3's rules out of reach: every margin over the expected residual. (With the ERLE kept
# through a barge-in, the voice after the scene's recorded barge-in stands far over it.)
OUT_OF_REACH = {"residual_margin_db": 200.0, "strong_margin_db": 200.0, "plain_margin_db": 200.0}


def test_recorded_evidence_replays_the_same_decisions(parts):
    """A policy variant is scored on the recorded evidence: replaying the shipped policy on
    it must find the barge-in where the live run of the same scene found it."""
    from wyoming_pivoice.audio import Act, FastBargeIn
    from wyoming_pivoice.satellite import VadSettings, policy_from

    reply, user, vad = parts
    policy = policy_from(VadSettings())
    outcome = run_scene(Scene(ROOM, onset_s=1.5, gain_db=6.0), reply, user, vad, record=True)
    fast = FastBargeIn(policy)
    fired = [t for t, evidence in outcome.evidence if fast.step(evidence, False) is Act.INTERRUPT]
    assert fired and fired[0] == pytest.approx(outcome.detected_after_s, abs=1e-3)
    # `replay` (the tool's --replay) scores it the same; a policy that never takes a frame
    # over the echo for the user (margins out of reach) finds nothing there.
    again = replay(outcome, policy)
    assert again.detected_after_s == outcome.detected_after_s
    assert again.self_barge_ins == outcome.self_barge_ins == []
    deaf = replace(policy, **OUT_OF_REACH)
    assert replay(outcome, deaf).detected_after_s is None


def test_the_linear_filter_is_weighed_only_where_it_cancels(parts):
    """The linear filter beside AEC3 (session 14): in the target room with the speaker on the
    microphone's clock its evidence is offered over the second reply and its echo alone
    interrupts nothing; with the room's ±100 ppm of drift it cancels too little (3 dB
    offline) and is never offered, so the decisions are AEC3's alone, as before."""
    from wyoming_pivoice.satellite import EchoSettings

    reply, user, vad = parts
    on = {"linear_vad": SileroVad(), "echo_settings": EchoSettings(linear_barge_in=True)}
    shared = replace(ROOM, drift_ppm=0.0)
    alone = run_scene(Scene(shared, onset_s=None), reply, None, vad, record=True, **on)
    assert alone.self_barge_ins == []
    offered = [e for _, e in alone.evidence if e.linear_probability is not None]
    assert offered and all(e.playing for e in offered)
    over = run_scene(Scene(shared, onset_s=1.5, gain_db=-3.0), reply, user, vad, **on)
    assert over.detected_after_s is not None and over.self_barge_ins == []
    drifting = run_scene(Scene(ROOM, onset_s=None), reply, None, vad, record=True, **on)
    assert drifting.self_barge_ins == []
    assert all(e.linear_probability is None for _, e in drifting.evidence)


def test_the_linear_filter_needs_the_echo_to_stay_put(parts):
    """room.converge: over short replies on one clock the linear filter's ERLE reaches the
    gate; with the echo's delay moving a few ms from reply to reply (a speaker command
    reopened, the room's ticks) it does not, while AEC3 follows."""
    from pivoice_lab.room.converge import settle
    from wyoming_pivoice.audio.echo import LINEAR_MIN_ERLE_DB

    reply, _, _ = parts
    shared = replace(ROOM, drift_ppm=0.0)
    still = settle(shared, reply, replies=5)
    assert still[-1][0] >= LINEAR_MIN_ERLE_DB
    moving = settle(shared, reply, replies=5, move_s=0.005)
    assert moving[-1][0] < LINEAR_MIN_ERLE_DB <= moving[-1][1]


def test_a_recording_with_the_gate_open_replays_any_gate(parts, monkeypatch):
    """`--linear-gate 0 --record`, then `--replay-gate`: the linear filter's evidence is kept
    on every chunk with its ERLE estimate, so one recording scores any gate; a gate out of
    reach leaves AEC3's rules alone (session 15)."""
    import math

    from wyoming_pivoice.audio import echo
    from wyoming_pivoice.satellite import EchoSettings, VadSettings, policy_from

    reply, user, vad = parts
    monkeypatch.setattr(echo, "LINEAR_MIN_ERLE_DB", 0.0)
    on = {"linear_vad": SileroVad(), "echo_settings": EchoSettings(linear_barge_in=True)}
    scene = Scene(replace(ROOM, drift_ppm=0.0), onset_s=1.5, gain_db=-3.0)
    outcome = run_scene(scene, reply, user, vad, record=True, **on)
    assert len(outcome.linear_erle) == len(outcome.evidence)
    # AEC3's own rule out of reach: what is found is the linear filter's doing.
    deaf = replace(policy_from(VadSettings()), **OUT_OF_REACH)
    assert replay(outcome, deaf, linear_gate_db=0.0).detected_after_s is not None
    assert replay(outcome, deaf, linear_gate_db=math.inf).detected_after_s is None
