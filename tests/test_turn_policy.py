"""The one turn-taking rule (turn_policy.decide) on synthetic and recorded values, and the
endpointer's barge-in events that both modes consume."""

from __future__ import annotations

from wyoming_pivoice.satellite.endpoint import EndpointKind, EndpointLogic
from wyoming_pivoice.satellite.settings import VadSettings
from wyoming_pivoice.satellite.turn_policy import Decision, Evidence, TurnPolicy, decide

POLICY = TurnPolicy()
FRAME = 0.032


def run(probs: list[float], evidence: list[Evidence | None]) -> list[Decision]:
    """Frame by frame through decide, counting voiced frames as the endpointer does."""
    out, voiced = [], 0
    for prob, ev in zip(probs, evidence, strict=True):
        ev = ev or Evidence(prob)
        ev = Evidence(prob, ev.playing, ev.coupling_db, ev.residual_db, ev.expected_residual_db)
        decision = decide(ev, voiced, POLICY)
        voiced = voiced + 1 if decision is not Decision.IGNORE else 0
        out.append(decision)
    return out


def test_silence_and_voice_with_nothing_playing() -> None:
    assert decide(Evidence(0.2), 0, POLICY) is Decision.IGNORE
    assert decide(Evidence(0.9), 0, POLICY) is Decision.WAIT
    assert decide(Evidence(0.9), POLICY.min_speech_frames - 1, POLICY) is Decision.START


def test_a_headset_barges_in_a_frame_sooner_than_speech_starts_in_silence() -> None:
    headset = Evidence(0.9, True, coupling_db=-60.0, residual_db=-30, expected_residual_db=-30)
    assert decide(headset, 0, POLICY) is Decision.WAIT
    assert decide(headset, POLICY.min_speech_frames - 3, POLICY) is Decision.WAIT
    assert decide(headset, POLICY.min_speech_frames - 2, POLICY) is Decision.INTERRUPT
    # Nothing playing: the full 150 ms, as before.
    assert decide(Evidence(0.9), POLICY.min_speech_frames - 2, POLICY) is Decision.WAIT


def test_what_the_echo_leaves_starts_nothing() -> None:
    # Room at -6 dB: the canceller leaves about the residual it is expected to leave; Silero
    # still calls it speech (it is the reply's voice). Recorded values of a leak included.
    leak = [0.94, 0.97, 0.96, 0.99, 0.98, 0.98, 0.99, 0.92, 0.54, 0.97, 0.99, 0.98]
    excess = [2.0, 3.5, 4.0, 1.0, -2.0, 5.5, 3.0, 0.0, -1.0, 4.5, 5.0, 2.0]
    evidence = [
        Evidence(p, True, -6.0, residual_db=-40 + e, expected_residual_db=-40)
        for p, e in zip(leak, excess, strict=True)
    ]
    assert set(run(leak, evidence)) == {Decision.IGNORE}


def test_a_voice_at_the_echos_level_interrupts() -> None:
    # The user at the echo's level stands the canceller's ERLE (20-30 dB) above the residual.
    probs = [0.3, 0.8, 0.95, 0.97, 0.99, 0.98, 0.99, 0.97, 0.98]
    evidence = [Evidence(p, True, -6.0, -25.0, -48.0) for p in probs]
    decisions = run(probs, evidence)
    assert decisions[0] is Decision.IGNORE
    assert Decision.INTERRUPT in decisions
    # A plain voice (excess ≥ the strong margin) needs less than speech in silence.
    assert decisions.index(Decision.INTERRUPT) == POLICY.strong_min_speech_frames
    assert POLICY.strong_min_speech_frames < POLICY.min_speech_frames


def test_a_weak_excess_needs_the_longer_evidence() -> None:
    probs = [0.95] * 10
    evidence = [Evidence(p, True, -6.0, -40.0, -48.0) for p in probs]  # 8 dB over
    decisions = run(probs, evidence)
    assert decisions.index(Decision.INTERRUPT) == POLICY.echo_min_speech_frames - 1


def test_without_an_estimate_the_vad_alone_is_held_to_more() -> None:
    # The first moments of the first reply: no coupling measured yet.
    mild = [0.6, 0.66, 0.62, 0.65, 0.68, 0.62, 0.7, 0.6, 0.65, 0.6]
    assert set(run(mild, [Evidence(0, True)] * len(mild))) == {Decision.IGNORE}
    loud = [0.95] * 10
    decisions = run(loud, [Evidence(0, True)] * len(loud))
    assert decisions.index(Decision.INTERRUPT) == POLICY.echo_min_speech_frames - 1


def test_the_endpointer_marks_a_start_over_a_reply_as_a_barge_in() -> None:
    """The interface both modes consume: SPEECH_STARTED with `interrupt`."""
    logic = EndpointLogic(VadSettings(speculate_ms=0))
    probs = [0.05] * 5 + [0.95] * 12 + [0.02] * 15
    events = []
    for i, p in enumerate(probs):
        logic.evidence = Evidence(p, True, -6.0, -25.0, -48.0) if i < 20 else Evidence(p)
        events += logic.process(p, bytes(1024), i * FRAME)
    kinds = [e.kind for e in events]
    assert kinds == [EndpointKind.SPEECH_STARTED, EndpointKind.ENDPOINT]
    assert events[0].interrupt
    # The same voice with nothing playing is a plain start.
    logic = EndpointLogic(VadSettings(speculate_ms=0))
    events = []
    for i, p in enumerate(probs):
        events += logic.process(p, bytes(1024), i * FRAME)
    assert events[0].kind is EndpointKind.SPEECH_STARTED and not events[0].interrupt
