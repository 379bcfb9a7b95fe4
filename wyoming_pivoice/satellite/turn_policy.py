"""The one turn-taking rule of both modes: does what the microphone hears now start a turn,
interrupt a reply, or neither?

`decide(evidence, voiced_frames, policy)` is a pure function, called once per 32 ms frame
by the endpointer (endpoint.EndpointLogic) while no utterance is under way. Its decision
reaches the modes only through the endpointer's events: a `SPEECH_STARTED` whose
`interrupt` is True is a barge-in (stop the reply, the utterance is the next request).
The standalone pipeline and the Home Assistant satellite both consume those events.

The probabilities are the endpointer's VAD: Silero with a recurrent state at most 0.5 s old
(engines.vad.RecentSileroVad, --vad-state-span). Carried through the stream, the state read a
voice over a reply 10-20 times lower after seconds of AEC3's suppressed echo, and AEC3's leaks
as low; the figures below were measured with that carried state (sessions 11-20) and the rules
kept with the fresh one, which reads the leaks higher: the residual tests keep them out
(docs/room.md, sessions 21-22).
The evidence comes from the echo canceller (echo.py), frame by frame:
- `playing`: a reply, or its echo's tail, may be in this frame;
- `coupling_db`: how loud the speaker comes back into the microphone (echo level minus
  reference level, estimated while replies play). Below `no_coupling_db` (a headset, a
  speaker in another room) there is no echo to guard against: the user's voice starts a
  turn over a reply exactly as it does in silence;
- `residual_db` / `expected_residual_db`: the cleaned frame's level and what the echo alone
  would leave of the reference playing now (coupling minus what the canceller achieves).
  A voice over the reply stands above that; what AEC3 leaks does not, or not for long.
  A voice far above it (strong_margin_db) interrupts within 64 ms of Silero calling it
  speech, sooner than speech starts in silence: each frame waited is the reply talking
  over the user. One Silero is sure of (≥ echo_threshold) counts ≥ residual_margin_db over
  it for sure_min_speech_frames (96 ms): in the first 1.5 s after the canceller's start the
  estimate counts on no cancelling (sessions 18-22: after a barge-in too), and a voice at
  the echo's level stood only 4-11 dB over the full echo there, at Silero 0.99-1.00 (live,
  session 18: decided 387 ms after its onset). Silero itself must say speech (≥ threshold),
  except for a plain voice:
  ≥ plain_margin_db (20 dB) over it at Silero ≥ plain_threshold (0.1) for 4 frames. AEC3's
  double-talk suppression blurs a voice under a loud echo and Silero lags it by 100-500 ms at
  0.0-0.3; the echo's leaks that far over stand at Silero 0.00-0.05 (live, session 11-12).
  Silero at nothing is never enough: offline, 4 such frames made 19 self barge-ins in 185
  scenes; a rule at Silero ≥ 0.15 made one live when the estimate fell 31 dB in one frame
  (session 12; echo.py now holds its fall to 3 dB a frame).
A start the rules above do not take yet may still be the user: a frame over a reply ≥
hold_margin_db over what the echo alone would leave, at Silero ≥ hold_threshold, for
hold_min_frames, is `suspect`. The audio core then *holds* the reply (pauses it, keeping the
rest: core.FastBargeIn, speaker.ContinuousSink.hold), so the echo dies away and the voice, if
it is one, stands clear for these rules; if they have not said INTERRUPT within hold_frames
the reply plays on where it stopped (LiveKit agents' "false interruption": pause, resume).
Without an estimate yet (the first half second of the first reply), a start over a reply
needs the VAD's `echo_threshold` for `echo_min_speech_frames`, the rule before this one.
Where the canceller runs a linear filter beside AEC3 (EchoSettings.linear_barge_in, off by
default) and it cancels, `linear_*` carry the same figures of its output, which keeps a voice
AEC3's suppression takes off: Silero ≥ linear_threshold on it and ≥ linear_margin_db over
what the echo alone leaves there, for linear_min_speech_frames (docs/room.md, session 14).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Below this the microphone does not hear the speaker (−35 dB: a headset's leak; the rooms
# of the bench couple at −3 to −20 dB).
NO_COUPLING_DB = -35.0
# A voice over a reply must stand this far above the residual the echo alone would leave.
RESIDUAL_MARGIN_DB = 6.0
# …and this far above it, the voice is plain: it starts sooner than speech in silence.
STRONG_MARGIN_DB = 12.0
# …and this far, it counts before Silero is sure (TurnPolicy.plain_threshold).
PLAIN_MARGIN_DB = 20.0


class Decision(str, Enum):
    IGNORE = "ignore"  # this frame is not the user's voice
    WAIT = "wait"  # it is, but there is too little of it yet to start
    START = "start"  # the user started speaking; nothing plays
    INTERRUPT = "interrupt"  # the user started speaking over a reply: stop it


@dataclass(frozen=True)
class Evidence:
    """One frame as the VAD and the echo canceller see it (levels in dBFS)."""

    probability: float  # VAD speech probability of the cleaned frame
    playing: bool = False  # a reply, or its echo's tail, may be heard in this frame
    coupling_db: float | None = None  # echo level − reference level; None: not known yet
    residual_db: float | None = None  # the cleaned frame's level
    expected_residual_db: float | None = None  # what the echo alone would leave now
    # The canceller's achievement is counted in that (not a reply's first moments, nor the
    # first seconds after the canceller's start, where the full echo is expected instead).
    settled: bool = True
    # The same of the linear filter beside AEC3 (echo.py, mdf.py): its output keeps a voice
    # that AEC3's suppression takes off; None: no linear filter.
    linear_probability: float | None = None  # VAD speech probability of its output
    linear_residual_db: float | None = None
    linear_expected_db: float | None = None
    # The frame as the microphone heard it, before cancelling (the audio core's debug log:
    # what the canceller took off a leak or a voice is read from it).
    mic_db: float | None = None
    # How much the cleaned frame's last 192 ms look like the reply's echo: their normalised
    # correlation with the reference at the echo's delay (audio/echomatch.py), 0-1; None: not
    # measured (no delay known yet, or the VAD heard nothing worth weighing).
    echo_match: float | None = None

    @property
    def echo_heard(self) -> bool:
        """Whether the microphone may hear a reply in this frame."""
        if not self.playing:
            return False
        return self.coupling_db is None or self.coupling_db > NO_COUPLING_DB

    @property
    def excess_db(self) -> float | None:
        """How far the cleaned frame stands above what the echo alone would leave."""
        if self.residual_db is None or self.expected_residual_db is None:
            return None
        return self.residual_db - self.expected_residual_db

    @property
    def linear_excess_db(self) -> float | None:
        """How far the linear filter's output stands above what the echo alone leaves in it."""
        if self.linear_residual_db is None or self.linear_expected_db is None:
            return None
        return self.linear_residual_db - self.linear_expected_db


@dataclass(frozen=True)
class TurnPolicy:
    """The thresholds (from VadSettings: policy_from)."""

    threshold: float = 0.5
    echo_threshold: float = 0.85
    min_speech_frames: int = 5  # 150 ms
    echo_min_speech_frames: int = 8  # 250 ms
    no_coupling_db: float = NO_COUPLING_DB
    residual_margin_db: float = RESIDUAL_MARGIN_DB
    strong_margin_db: float = STRONG_MARGIN_DB
    barge_in_lead_frames: int = 2  # a reply the mic does not hear stops this much sooner
    # A voice ≥ strong_margin_db over what the echo alone would leave, Silero ≥ threshold:
    # this many frames (64 ms). Offline (lab room.offline: 3 Piper replies, 3 rooms, 4
    # espeak voices and a recorded one at the echo's level, 72 barge-ins) the 5 frames of
    # speech in silence decided 17/72 within 250 ms of the onset, 3 frames 49/72; echo alone
    # never reached 1 such frame (the sound stops 30-60 ms after the decision). Session 12
    # (3 rooms, 9 voices, 3 onsets, at the echo's level: 81 barge-ins, replayed on the same
    # recording): 3 frames 41/81 within 250 ms (median 249 ms), 2 frames 51/81 (201 ms); live
    # echo alone (7419 frames over replies, loaded benches) never had Silero ≥ 0.5 less than
    # 4 dB *under* the expected residual, so one frame fewer keeps a wide margin.
    strong_min_speech_frames: int = 2
    # A voice Silero is sure of (≥ echo_threshold) and ≥ residual_margin_db over what the echo
    # alone would leave, under strong_margin_db: this many frames, not echo_min_speech_frames.
    # For the first 1.5 s of echo after the canceller's start (until session 23, after a
    # barge-in too) the expected residual is the full echo (echo.CONVERGE_FRAMES), and a
    # voice at the echo's level stood -7 to +11 dB over it at Silero 0.90-1.00 (live, sessions
    # 18-19: decided 290-390 ms after its onset). Live echo alone (four benches, load 4.4-4.8,
    # 8688 frames over replies: lab room.echolog) never had Silero ≥ 0.5 on a frame ≥ 6 dB
    # over; at ≥ 0.85, 1 frame ≥ 0 dB and 5 ≥ -6 dB (3 in a row), and recorded leaks stood
    # 2-5.5 dB over at Silero 0.94-0.99 (the tests): the margin stays.
    sure_min_speech_frames: int = 3
    # A voice far over what the echo alone would leave while Silero is still unsure: over a
    # reply AEC3's double-talk suppression takes a voice under a loud echo down and apart, and
    # Silero lagged it live by 8-12 frames at 0.1-0.3 (session 12's late −3 dB decisions,
    # 419-579 ms). Live echo alone (sessions 11-13's benches, 7919 frames over replies, the
    # users' turns left out: lab room.echolog) never had Silero ≥ 0.1 on a frame ≥ 20 dB over,
    # nor twice in a row ≥ 12 dB over; its leaks that far over stand at Silero 0.00-0.05 (up
    # to 8 frames in a row). Four frames (128 ms): the one leak that fooled the estimate (session
    # 12, in the tests) had two. Offline (room.offline, 5 rooms, 9 voices, 180 barge-ins at
    # 0/−3 dB): within 300 ms of the onset 116 → 123 (3 frames: 125), 0 self barge-ins.
    # Session 19 tried 0.01 (session 18's benches: no frame of echo alone counted at 0.01 had
    # another within the forget window): its bench made a self barge-in 0.4-0.6 s into a reply
    # in the -3 dB room, where AEC3 took 0-15 dB off for 8 chunks at Silero 0.03-0.27, 11-35 dB
    # over the expected residual (docs/room.md, session 19). 0.1 would have waited one more frame.
    plain_threshold: float = 0.1
    plain_margin_db: float = PLAIN_MARGIN_DB
    plain_min_speech_frames: int = 4
    # The linear filter's output beside AEC3 (Evidence.linear_*): a frame counts when the VAD
    # on it says speech and it stands this far over what the echo alone leaves in it.
    linear_threshold: float = 0.5
    linear_margin_db: float = 6.0
    linear_min_speech_frames: int = 3
    # Holding the reply (`suspect`). Offline (lab room.offline --record, 5 rooms, 5 voices at
    # 0/−3 dB under the echo, onsets 0.7/1.1/2.0 s: 150 voices, 26 min of echo alone, load ~1):
    # two frames ≥ 6 dB over the expected residual at Silero ≥ 0.02 came 150/150 voices, 122
    # within 250 ms of the onset (median 153 ms), and never on the echo alone; at any Silero
    # (0.00: AEC3's leaks look like that) 141/150 but 337 times on the echo, once every 5 s.
    hold: bool = False  # VadSettings.hold_reply
    hold_threshold: float = 0.02
    hold_margin_db: float = 6.0
    hold_min_frames: int = 2
    # How long a held reply waits for the rules to take the voice before it plays on (the
    # echo's delay, up to 250 ms in the rooms, and its tail must die away first), and how
    # long after it plays on before another hold (a leak the resumed reply makes).
    hold_frames: int = 25  # 800 ms
    # …and only if the frame after them does not raise the expected residual by hold_leap_db
    # (the reply's next words coming back a frame or two before the estimate rises: live, two
    # holds with nobody speaking in the room tests, 11-16 dB over at Silero 0.02-0.09 as a
    # reply started or went on after a pause). Offline it costs 6 of 150 holds within 300 ms.
    # Nor while the estimate is not settled (Evidence.settled): both such holds came there.
    hold_confirm_frames: int = 1
    hold_leap_db: float = 10.0
    hold_gap_frames: int = 31  # 1 s
    # A frame over a reply whose cleaned audio correlates this well with the reference at the
    # echo's delay is the echo passing the canceller, not the user (Evidence.echo_match): AEC3's
    # lapses under load, 17-31 dB over the expected residual at Silero 0.5-0.98, which no
    # margin above tells from a voice. Replayed from live dumps (load 5-6, −6 dB/150 ms,
    # 0.7 s tail): a lapse matched 0.63, the users' voices over the same replies 0.00-0.20,
    # the uncancelled microphone (voice and echo at the same level) 0.11-0.47.
    echo_match_max: float = 0.5


def _linear_voice(evidence: Evidence, policy: TurnPolicy) -> bool:
    """Whether the linear filter's output holds a voice over the echo (TurnPolicy.linear_*)."""
    prob, excess = evidence.linear_probability, evidence.linear_excess_db
    if prob is None or excess is None:
        return False
    return prob >= policy.linear_threshold and excess >= policy.linear_margin_db


def suspect(evidence: Evidence, policy: TurnPolicy) -> bool:
    """Whether this frame over a reply may be the user's voice though the rules of `decide`
    do not take it yet: enough to hold the reply, not to stop it (TurnPolicy.hold_*)."""
    if not evidence.playing or evidence.coupling_db is None:
        return False
    if evidence.coupling_db <= policy.no_coupling_db:
        return False  # no echo: `decide` takes a voice over the reply as fast as it can be
    if not evidence.settled:
        return False
    excess = evidence.excess_db
    return (
        excess is not None
        and excess >= policy.hold_margin_db
        and evidence.probability >= policy.hold_threshold
        and not _is_echo(evidence, policy)
    )


def _is_echo(evidence: Evidence, policy: TurnPolicy) -> bool:
    """Whether the frame is the reply's echo let through (TurnPolicy.echo_match_max)."""
    return evidence.echo_match is not None and evidence.echo_match >= policy.echo_match_max


def decide(evidence: Evidence, voiced_frames: int, policy: TurnPolicy) -> Decision:
    """Whether this frame is the user's voice and, with the `voiced_frames` of the same
    candidate that were before it, whether the user has started speaking."""
    prob = evidence.probability
    echo = evidence.playing and (
        evidence.coupling_db is None or evidence.coupling_db > policy.no_coupling_db
    )
    if not echo:
        counts, need = prob >= policy.threshold, policy.min_speech_frames
        if evidence.playing:
            # A reply the microphone does not hear (a headset): only the user can be speaking,
            # and each frame waited is the reply talking over them. Measured in the room
            # (load 11-17): decided 226-257 ms after the onset at 5 frames, the sound then
            # gone 30-60 ms later; at 4 frames session 12's bench (load 4.4-4.7) still had
            # one of 7 at 320 ms: 3 frames (96 ms), two fewer than a start in silence.
            need = max(1, need - policy.barge_in_lead_frames)
    else:
        excess = evidence.excess_db
        if excess is None:  # no estimate yet: the VAD alone, held to more
            counts, need = prob >= policy.echo_threshold, policy.echo_min_speech_frames
        else:
            counts = prob >= policy.threshold and excess >= policy.residual_margin_db
            if excess >= policy.strong_margin_db:
                need = policy.strong_min_speech_frames
            elif prob >= policy.echo_threshold:
                need = policy.sure_min_speech_frames
            else:
                need = policy.echo_min_speech_frames
            if not counts and prob >= policy.plain_threshold and excess >= policy.plain_margin_db:
                counts, need = True, policy.plain_min_speech_frames
            if not counts and _linear_voice(evidence, policy):
                counts, need = True, policy.linear_min_speech_frames
        if counts and _is_echo(evidence, policy):
            counts = False  # whatever its level and the VAD say, it is the reply
    if not counts:
        return Decision.IGNORE
    if voiced_frames + 1 < need:
        return Decision.WAIT
    return Decision.INTERRUPT if evidence.playing else Decision.START
