"""Echo cancellation on the capture path: WebRTC's AEC3 (livekit's AudioProcessingModule; or
ours from native/aec3, aec3.py: EchoSettings.canceller "aec3", or the linear barge-in with
EchoSettings.linear_filter "aec3").

The satellite plays every sample itself, so it holds the exact reference. Both streams
are placed on one 16 kHz timeline of monotonic time:
- the sink reports each piece it hands the speaker with the time that piece is due to
  play (`reference`); pieces of one reply are laid end to end, a gap is silence;
- the capture path (`process`) takes each microphone chunk with the time it was read,
  and for every 10 ms capture frame first feeds AEC3 the reference frame of the same
  instant, then the capture frame.

So AEC3 gets exactly one render frame per capture frame, in real-time order (no bursts
that would overrun its render buffer), and the reference never comes later than its echo:
a piece is due no later than it really plays, and a chunk is read no sooner than it was
captured. What is left — the device's buffering, the room's acoustic delay — is a
positive delay, which AEC3's delay estimator finds (measured here: 400 ms, not 500 ms).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from wyoming.audio import AudioFormat

from ..satellite.protocols import Hearing
from ..satellite.settings import EchoSettings
from ..satellite.turn_policy import NO_COUPLING_DB, Evidence, TurnPolicy
from .aec3 import Aec3
from .apm import LivekitApm
from .echomatch import EchoMatch
from .format import FRAME, RATE
from .mdf import Mdf
from .pcm import StreamingConverter, frame_bytes

if TYPE_CHECKING:
    from ..satellite.protocols import AudioSource

_LOGGER = logging.getLogger(__name__)

# A piece due within this of the previous piece's end continues it (timing jitter);
# later than that, the gap between them is silence.
JOIN_SECONDS = 0.05
KEEP_SECONDS = 2.0  # reference history kept behind the capture position
CAPTURE_WINDOW_SECONDS = 5.0  # see CaptureClock
GAP_SECONDS = 1.0  # a microphone whose reads stay this much later has restarted
# After the reference falls silent, its echo may still arrive for this long
# (the device's buffer, the acoustic delay, the room's tail: RT60 up to 0.8 s).
ECHO_TAIL_SECONDS = 1.0
SILENT_RMS = 1e-4  # a reference frame quieter than this (−80 dBFS) plays no echo
# The echo estimate (turn_policy's evidence): windows of this many audible 10 ms frames
# (0.5 s: the first must be done before a user talks over the first reply — a window with
# the voice in it made a headset look coupled at −15 dB, and the voice was ignored),
# the last few of them kept; the echo now comes from what played up to RECENT_FRAMES ago
# (the device's buffer and the acoustic delay, 0.5 s at most in the rooms we model).
WINDOW_FRAMES = 50
WINDOWS_KEPT = 5
RECENT_FRAMES = 50
FLOOR_WINDOW_FRAMES = 50
# A window where the microphone stands this far over the echo expected of it holds the
# user's voice: it tells nothing of what the canceller achieves.
USER_IN_WINDOW_DB = 3.0
MAX_ERLE_DB = 40.0
ONSET_QUIET_FRAMES = 100  # a reference silent this long (1 s) and sounding again: a reply starts
ONSET_FRAMES = 50  # its first 0.5 s
# …and at least this long after its echo reaches the microphone (a delay echomatch.py finds):
# with a 418 ms echo the 0.5 s ended 80 ms into the echo, where AEC3 left it 10-14 dB over
# what the ERLE promised and Silero said 0.8 (a self barge-in, load 4, session 25). Not the
# whole 0.5 s from there: offline, users 0.7 s into a reply in the 150/250 ms rooms were then
# decided within 300 ms 12/30 times against 28/30 (rooms up to 250 ms are unchanged by this).
ECHO_ONSET_FRAMES = 25
# A new AEC3 converges over its first second or two of echo; what the estimate's first
# windows measure of it is not yet what it does (offline, a reply's first second: ERLE
# estimated ~35 dB while it left residual bursts 10-19 dB over that, Silero 0.35-0.54).
# A barge-in no longer counts as a new filter (see EchoCanceller._barge_in).
CONVERGE_FRAMES = 150
# After a barge-in a fresh AEC3 runs beside the live one (see EchoCanceller) and the better
# of the two over windows of this many 10 ms frames of reply is heard; after TRIAL_WINDOWS
# windows without the user's voice the worse one is dropped.
TRIAL_WINDOW_FRAMES = 50
TRIAL_WINDOWS = 4
# …and the fresh one is heard (and stays) only when it left at most half the residual
# energy: in a window where both held the echo at the floor, the fresh AEC3 won by chance
# while its own filter had not converged, and it passed the reply's last echo whole when its
# reference fell silent (live, session 22: −21 dBFS where the kept one left −62).
TRIAL_MARGIN = 2.0  # 3 dB
# …and in a frame where the filter heard leaves this much more than the other, the other is
# heard: a leak is one filter's own. Live (load 8.9, session 24) the fresh one, heard, passed
# the echo at −23…−33 dBFS for two chunks after a barge-in; Silero said 0.76-0.93 on it while
# the policy weighed the kept one's lower level, and the two together made a self barge-in.
# A voice is in both outputs at about one level, so it does not switch them.
TRIAL_LEAK = 10.0  # 10 dB
# …and until the trial has judged them (TRIAL_WINDOWS windows of reply), the cancelling
# counted is at most this: a frame where both leak is guarded by neither. Live (−6 dB/150 ms,
# load 8.7-9.2, session 28), 0.2-0.45 s into the echo of the second reply after a barge-in,
# the kept AEC3 took 5-13 dB off (one AEC3 on the dump does the same) while the fresh one
# leaked too: Silero 0.93-0.96, 5-18 dB over an estimate that counted the 30-40 dB measured
# before the barge-in: a self barge-in and a self-made turn. At 15 dB that leak stands 3-8 dB
# under the turn policy's margin. The cost, offline (room.offline --barge-in-before 0.6: the
# voice over the first reply after a barge-in; −6/−3 dB rooms, 90 voices at −6/0/+6 dB, load
# ~2): decided within 300 ms 65 → 54 (at the echo's level 23 → 17 of 30), detected 89 → 84
# (30/30 at the echo's level); 10 dB: 49 and 78, 20 dB: 60 and 88. Counting nothing (session
# 23) left a voice no margin: 3/11 within 300 ms live against 17/18.
TRIAL_ERLE_DB = 15.0
# The expected residual falls no faster than this: it stepped down 25-31 dB in one frame
# when a reply's first 0.5 s were over or the ERLE estimate moved (no cancelling counted,
# then all of it), while AEC3 leaked as before — live, a leak then stood 19-23 dB over it
# at Silero 0.19-0.28 (session 12's self barge-in, the -3 dB room) and 25-33 dB at Silero
# 0 (session 11). 3 dB a frame takes a 31 dB step in 0.1 s; a room's tail decays slower
# (RT60 0.7 s: 0.9 dB a frame), so a real fall of the echo is followed as it happens.
FALL_DB_PER_FRAME = 3.0
FALL_PER_FRAME = 10 ** (-FALL_DB_PER_FRAME / 10)
# Once the reference falls silent its echo still arrives for the echo's delay and then dies
# away with the room's tail, and AEC3 passes it whole: live (−3 dB/250 ms, RT60 0.7 s, load
# 4.5-5.1, session 27) the last word's echo came through at −35 → −47 dBFS, residual = the
# microphone, 0.1-0.3 s after the reference fell silent, Silero 0.6-0.8, 14-20 dB over an
# estimate that still counted the reply's 40 dB ERLE: five self-made turns. So while the
# reference is silent the echo expected is each recent reference frame × the coupling, in full
# until its echo has arrived, then falling at the slowest tail we design for (RT60 0.8 s: 0.75
# dB a frame), with nothing counted off for cancelling.
TAIL_RT60_S = 0.8
TAIL_PER_FRAME = 10 ** (-60 / (TAIL_RT60_S * 100) / 10)
VOICE_PROBABILITY = 0.5  # a chunk the VAD scores this high may hold the user's voice
# A chunk over a reply is matched against the echo (echomatch.py) from this VAD probability
# on: the lowest any rule of turn_policy.decide counts.
MATCH_FROM = TurnPolicy.plain_threshold
# The linear filter beside AEC3 (mdf.py, for barge-in): its length must span the echo
# path's delay (the rooms: 20-250 ms, plus the device's buffer) and the loud part of the
# room's tail.
LINEAR_TAIL_SECONDS = 0.5
# Its evidence is offered only while it cancels at least this much (its ERLE estimate): a
# speaker whose clock drifts from the microphone's slides the echo under a linear filter,
# and SpeexDSP's does not keep up (offline, the −6 dB/150 ms room: 15-19 dB without drift,
# 11-14 at 5 ppm, 7-11 at 20-50 ppm, 3 at 100 ppm, where its residual echo stood up to 10 dB
# over the estimate and made self barge-ins); AEC3 follows the drift, so AEC3's rules do.
LINEAR_MIN_ERLE_DB = 12.0
# A reply held and played on (EchoCanceller.hold) comes through a speaker command opened anew;
# live (the room test, busy load ×2) its echo came more than the estimate's 0.5 s window after
# its reference, stood 22 dB over the expected residual at Silero 0.67-0.73 and stopped the
# reply. For its first 1.5 s of sound (CONVERGE_FRAMES) the turn policy gets no estimate.
RESUME_UNSURE_FRAMES = CONVERGE_FRAMES
DUMP_SECONDS = 600.0  # --aec-dump's bound: 10 min (38 MB)


Apm = LivekitApm | Aec3


def tune_linear(
    min_erle_db: float | None = None,
    aec3_blocks: int | None = None,
    aec3_config: dict[str, float | int | bool] | None = None,
) -> None:
    """The lab's knobs on the linear barge-in and our AEC3 (room.offline, room.converge): the
    ERLE gate (LINEAR_MIN_ERLE_DB), AEC3's linear filter length in 4 ms blocks
    (aec3.FILTER_BLOCKS) and its config's fields (aec3.CONFIG: the suppressor's)."""
    global LINEAR_MIN_ERLE_DB
    if min_erle_db is not None:
        LINEAR_MIN_ERLE_DB = min_erle_db
    from . import aec3

    if aec3_blocks is not None:
        aec3.FILTER_BLOCKS = aec3_blocks
    if aec3_config is not None:
        aec3.CONFIG = dict(aec3_config)


def load_apm(settings: EchoSettings, native: bool = False) -> Apm:
    """The APM: livekit's, or (`native`) our AEC3 (aec3.py), with its linear output when the
    linear barge-in asks for it."""
    if native:
        return Aec3(settings.high_pass_filter, linear_output=_wants_native_linear(settings))
    return LivekitApm(
        settings.echo_cancellation,
        settings.noise_suppression,
        settings.high_pass_filter,
        settings.auto_gain_control,
    )


def _wants_native_linear(settings: EchoSettings) -> bool:
    return settings.linear_barge_in and settings.linear_filter == "aec3"


def runs_our_aec3(settings: EchoSettings) -> bool:
    """Whether the canceller runs our AEC3 (aec3.py): asked for (EchoSettings.canceller "aec3",
    or the linear barge-in with linear_filter "aec3", for its linear output), and the extension
    installed — otherwise livekit's APM and AEC3's rules alone (one log line). Our binding runs
    no noise suppression or gain control: with those asked for, livekit's."""
    if not settings.echo_cancellation:
        return False
    if not (settings.canceller == "aec3" or _wants_native_linear(settings)):
        return False
    if settings.noise_suppression or settings.auto_gain_control:
        return False
    try:
        import pivoice_aec3  # noqa: F401
    except ImportError as err:
        _LOGGER.warning(
            "No AEC3 of ours (%s; native/aec3/build.sh builds it): livekit's AEC3, and no "
            "linear output for barge-in",
            err,
        )
        return False
    return True


@dataclass
class EchoStats:
    """Microphone energy while the reference played, before and after cancelling; and what
    the canceller adds to the capture path's latency: its output runs `lag_samples` behind
    its input (AEC3 takes whole 10 ms frames), and each chunk waits while it is processed."""

    seconds: float = 0.0
    energy_in: float = 0.0
    energy_out: float = 0.0
    chunks: int = 0
    process_s: float = 0.0  # the chunks' processing time on the audio thread
    process_max_s: float = 0.0
    # …of which this thread ran on a core: the rest it waited (for a core, or for the GIL
    # while another thread of the process held it).
    process_cpu_s: float = 0.0
    lag_samples: int = 0
    # Capture frames processed before their reference had come out of the resampler (fed,
    # but held back by it): AEC3 got silence where the reply played.
    ref_short_frames: int = 0

    @staticmethod
    def _dbfs(energy: float, samples: float) -> float | None:
        if samples <= 0:
            return None
        return round(10 * math.log10(max(energy / samples, 1e-12)), 1)

    @property
    def in_dbfs(self) -> float | None:
        return self._dbfs(self.energy_in, self.seconds * RATE)

    @property
    def out_dbfs(self) -> float | None:
        return self._dbfs(self.energy_out, self.seconds * RATE)

    def as_dict(self) -> dict[str, float | None]:
        return {
            "seconds": round(self.seconds, 2),
            "in_dbfs": self.in_dbfs,
            "out_dbfs": self.out_dbfs,
            "erle_db": self.erle_db,
            "added_ms": self.added_ms,
            "added_max_ms": self.added_max_ms,
            "process_ms": self._per_chunk_ms(self.process_s),
            "process_cpu_ms": self._per_chunk_ms(self.process_cpu_s),
            "ref_short_frames": self.ref_short_frames,
        }

    def _per_chunk_ms(self, seconds: float) -> float | None:
        return round(1000 * seconds / self.chunks, 2) if self.chunks else None

    @property
    def added_ms(self) -> float | None:
        """The capture path's added latency, on average over the chunks: the output's lag
        and the processing (what a chunk waits for before the VAD sees it)."""
        if not self.chunks:
            return None
        return round(1000 * (self.lag_samples / RATE + self.process_s / self.chunks), 2)

    @property
    def added_max_ms(self) -> float | None:
        if not self.chunks:
            return None
        return round(1000 * (self.lag_samples / RATE + self.process_max_s), 2)

    @property
    def erle_db(self) -> float | None:
        """Echo return loss enhancement: how far cancelling took the level down."""
        if self.seconds <= 0:
            return None
        return round(10 * math.log10(max(self.energy_in, 1e-12) / max(self.energy_out, 1e-12)), 1)


class EchoEstimate:
    """How loud the speaker comes back into the microphone and how much of it the
    canceller takes out, from the frames that play: the evidence turn_policy weighs.

    - coupling: echo energy (the microphone's, less the noise floor) over reference energy,
      per window of audible reference frames (the microphone counted over their tail too,
      where a delayed echo lands); the lowest of the last few (the user's voice only ever
      adds energy). Unknown: assumed 0 dB, the loudest echo a room gives.
    - ERLE: microphone over residual energy in the windows without the user's voice; the
      median of the last few. Unknown: 0.
    - noise floor: the microphone's energy while nothing plays, lowest of recent windows.
    """

    def __init__(
        self, converge_frames: int = CONVERGE_FRAMES, onset_frames: int = ONSET_FRAMES
    ) -> None:
        # How long a new filter (the canceller's start) and a reply's first moments count
        # no cancelling (see _expected_now): AEC3's; the linear filter beside it is never
        # restarted and needs neither.
        self.converge_frames = converge_frames
        self.onset_frames = onset_frames
        self._ref = self._mic = self._out = 0.0
        self._frames = 0  # audible reference frames in the window
        self._mic_frames = 0  # frames that may hold echo in the window (the tail too)
        self._couplings: deque[float] = deque(maxlen=WINDOWS_KEPT)
        self._erles: deque[float] = deque(maxlen=WINDOWS_KEPT)
        # The median of the last few: the lowest (a window still converging, or one with a
        # leak) held a voice at the echo's level under the margin (bench, −3/−6 dB: 0/2).
        # Kept here: every frame reads it, a window changes it.
        self.erle_db = 0.0
        self._floors: deque[float] = deque(maxlen=20)
        self._quiet = 0.0
        self._quiet_frames = 0
        self._recent: deque[float] = deque(maxlen=RECENT_FRAMES)  # reference frame energies
        self._silent_frames = ONSET_QUIET_FRAMES  # reference frames in a row without sound
        self._since_onset = 0  # audible frames since a reply's first sound
        # The echo's delay behind the reference (echomatch.py), in frames: a reply's first
        # moments are counted where its echo reaches the microphone.
        self.echo_delay_frames = 0
        self._audible = 0  # audible frames since the canceller started (or forget_erle)
        self._held = 0.0  # the expected residual, falling at FALL_DB_PER_FRAME at most
        self._tail = 0.0  # the loudest reference whose echo has arrived, falling with the tail
        self.erle_cap_db: float | None = None  # the most cancelling counted (TRIAL_ERLE_DB)

    @property
    def coupling_db(self) -> float | None:
        return min(self._couplings) if self._couplings else None

    @property
    def floor(self) -> float:
        """Mean-square energy of the noise floor (−70 dBFS until measured)."""
        return min(self._floors) if self._floors else 1e-7

    def frame(self, ref: float, mic: float, out: float, audible: bool, echo: bool) -> None:
        """One 10 ms frame's mean-square energies (reference, microphone, residual)."""
        self._frame(ref, mic, out, audible, echo)
        self._held = max(self._expected_now(), self._held * FALL_PER_FRAME)

    def _frame(self, ref: float, mic: float, out: float, audible: bool, echo: bool) -> None:
        self._recent.append(ref if audible else 0.0)
        delay = self._tail_delay
        arriving = self._recent[-1 - delay] if len(self._recent) > delay else 0.0
        self._tail = max(self._tail * TAIL_PER_FRAME, arriving)
        if audible:
            if self._silent_frames >= ONSET_QUIET_FRAMES:
                self._since_onset = 0
            self._since_onset += 1
            self._audible += 1
            self._silent_frames = 0
        else:
            self._silent_frames += 1
        if not echo:  # nothing plays, nor its tail: the room's own noise
            self._quiet += mic
            self._quiet_frames += 1
            if self._quiet_frames >= FLOOR_WINDOW_FRAMES:
                self._floors.append(self._quiet / self._quiet_frames)
                self._quiet, self._quiet_frames = 0.0, 0
            return
        self._quiet, self._quiet_frames = 0.0, 0
        # The echo of what plays arrives a delay later, in the reply's tail too: the
        # microphone is counted over every frame that may hold echo, the reference over the
        # audible ones. Counting the microphone only while the reference sounded missed the
        # echo of replies shorter than the delay (a 0.3 s "A:" at 250 ms, load 4): their
        # windows measured no coupling, the room passed for a headset, and the canceller's
        # output was dropped — its echo made turns (4 in 11 replies).
        self._mic += mic
        self._out += out
        self._mic_frames += 1
        if not audible:
            return
        self._ref += ref
        self._frames += 1
        if self._frames < WINDOW_FRAMES:
            return
        floor = self.floor * self._mic_frames
        echo_energy = max(self._mic - floor, 1e-12)
        coupling = _db(echo_energy / max(self._ref, 1e-12))
        known = self.coupling_db
        if known is None or coupling <= known + USER_IN_WINDOW_DB:
            erle = _db(echo_energy / max(self._out - floor, 1e-12))
            self._erles.append(min(max(erle, 0.0), MAX_ERLE_DB))
            self.erle_db = float(np.median(self._erles))
        self._couplings.append(max(coupling, -90.0))
        self._ref = self._mic = self._out = 0.0
        self._frames = self._mic_frames = 0

    def forget_erle(self) -> None:
        """Another filter is heard from here (the linear one replaced at a trial's end): what
        it achieves is not known again until measured. The coupling is the room's and stays."""
        self._erles.clear()
        self.erle_db = 0.0
        self._audible = 0
        self._held = max(self._held, self._expected_now())  # the echo is expected in full at once

    @property
    def settled(self) -> bool:
        """What the canceller achieves is counted on (see _expected_now): not in a reply's
        first moments, nor in the first CONVERGE_FRAMES of echo after a start (or forget_erle).
        Over a long echo delay they last until ECHO_ONSET_FRAMES after the echo arrives."""
        onset = max(self.onset_frames, self.echo_delay_frames + ECHO_ONSET_FRAMES)
        return self._since_onset >= onset and self._audible >= self.converge_frames

    @property
    def between_replies(self) -> bool:
        """The reference has been silent long enough that its next sound starts a reply."""
        return self._silent_frames >= ONSET_QUIET_FRAMES

    def restart_onset(self) -> None:
        """The next sound of the reference starts a reply (its first ONSET_FRAMES)."""
        self._silent_frames = ONSET_QUIET_FRAMES

    @property
    def no_echo(self) -> bool:
        """The microphone does not hear the speaker (a headset): nothing to take out."""
        coupling = self.coupling_db
        return coupling is not None and coupling <= NO_COUPLING_DB

    def expected_residual(self) -> float:
        """Mean-square energy the echo alone would leave in the frame heard now: it rises at
        once and falls no faster than FALL_DB_PER_FRAME (`frame` keeps it)."""
        return self._held

    def _expected_now(self) -> float:
        loudest = max(self._recent, default=0.0)
        coupling = self.coupling_db
        gain = 10 ** ((coupling if coupling is not None else 0.0) / 10)
        echo = loudest * gain
        # A reply's first moments: the filter heard may still be the one that adapted
        # through the user's voice over the last reply (a barge-in's trial judges the two
        # filters only as the reply plays), and leaks until it re-adapts (measured with a
        # restart: a self-made turn 0.3 s into the next reply). Count on no cancelling for
        # its first 0.5 s: only a voice louder than the echo itself interrupts then; so in
        # the first CONVERGE_FRAMES of echo after the canceller started.
        erle = self.erle_db if self.settled else 0.0
        if self.erle_cap_db is not None:
            erle = min(erle, self.erle_cap_db)
        expected = echo / 10 ** (erle / 10)
        if self._silent_frames:  # the reply's echo dying away, uncancelled (TAIL_RT60_S)
            coming = max(islice(reversed(self._recent), self._tail_delay), default=0.0)
            expected = max(expected, max(self._tail, coming) * gain)
        return expected + self.floor

    @property
    def _tail_delay(self) -> int:
        """Frames from a reference frame to its echo: echomatch's delay; not known yet, the
        longest the estimate allows for (RECENT_FRAMES)."""
        delay = self.echo_delay_frames or RECENT_FRAMES
        return min(delay, RECENT_FRAMES - 1)


def _db(ratio: float) -> float:
    return 10 * math.log10(max(ratio, 1e-12))


@dataclass
class _Reference:
    """The played audio on the timeline: `samples[0]` is timeline index `start`."""

    start: int = 0
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    converter: StreamingConverter | None = None
    fmt: AudioFormat | None = None
    fed_until: float = 0.0  # timeline index where the stream's input so far ends

    def feed(self, pcm: bytes, fmt: AudioFormat) -> np.ndarray:
        """The stream's next piece, resampled to the timeline's rate."""
        assert self.converter is not None
        self.fed_until += len(pcm) / frame_bytes(fmt) * RATE / fmt.rate
        return self.converter.convert(pcm)

    @property
    def end(self) -> int:
        return self.start + len(self.samples)


class _SpareApm:
    """A fresh APM made ahead, on a thread of its own, for the next barge-in. Made at the
    barge-in it took ≈ 20 ms under load on the audio thread, under the canceller's lock: the
    cut and the next chunk waited for it."""

    def __init__(self, make: Callable[[], Apm]) -> None:
        self._make = make
        self._ready: queue.Queue[Apm] = queue.Queue(maxsize=1)

    def take(self) -> Apm:
        try:
            apm = self._ready.get_nowait()
        except queue.Empty:  # the last one taken moments ago, the next not made yet
            apm = self._make()
        self.refill()
        return apm

    def refill(self) -> None:
        threading.Thread(target=self._fill, name="pivoice spare apm", daemon=True).start()

    def _fill(self) -> None:
        try:
            self._ready.put_nowait(self._make())
        except queue.Full:  # one made at the barge-in beat this one: one is enough
            pass
        except Exception as err:  # made at the next barge-in instead (and raised there)
            _LOGGER.debug("No spare APM: %s", err)


class CaptureClock:
    """Where each microphone chunk lies on the timeline.

    A chunk is read at or after its capture, later whenever the reader falls behind, so
    its capture is placed at the sample count plus the smallest read-minus-count offset
    seen: a backlog never makes audio look later than it was (the reference would then
    come after its echo). The offset follows a larger minimum of the last
    CAPTURE_WINDOW_SECONDS (a microphone slower than our clock, a mic that restarted after
    a gap) only gradually, SLEW_SAMPLES per chunk at most (≈ 2000 ppm), and a smaller one
    at once: the canceller's timeline never jumps later under a steady stream.
    """

    SLEW_SAMPLES = 1

    def __init__(self) -> None:
        self.count = 0
        self._offsets: deque[tuple[int, int]] = deque()  # (count, offset), offsets rising
        self._offset: int | None = None

    def first_sample(self, read_index: int, samples: int) -> int:
        """The timeline index of the first sample of a chunk read at `read_index`."""
        offset = read_index - samples - self.count
        while self._offsets and self._offsets[-1][1] >= offset:
            self._offsets.pop()
        self._offsets.append((self.count, offset))
        while self._offsets[0][0] < self.count - CAPTURE_WINDOW_SECONDS * RATE:
            self._offsets.popleft()
        target = self._offsets[0][1]
        if self._offset is None or target <= self._offset:
            self._offset = target
        elif target - self._offset > GAP_SECONDS * RATE:
            self._offset = target  # a gap in the stream (a restart): start anew
        else:
            self._offset += min(self.SLEW_SAMPLES, target - self._offset)
        first = self.count + self._offset
        self.count += samples
        return first


class EchoCanceller:
    """AEC3 between what the satellite plays and what its microphone hears.

    `reference` comes from the speaker's thread, `process` from the microphone's (the audio
    core, core.py), or both from the event loop; a lock keeps them apart. Each 10 ms frame
    costs AEC3 about 0.2 ms here (two filters: 0.4 ms).

    A barge-in does not throw the filter away: the echo path is the same room before and
    after it, and a continuous speaker keeps its delay. But the filter adapts through the
    user's voice while it is over the reply, and AEC3 cannot be told to hold still; measured
    offline (tests/test_echo.py, −6 dB/150 ms and −3 dB/250 ms rooms, the voice 0.25-0.9 s
    over the reply): the kept filter mostly cancels the next reply's first second well
    (28-38 dB; 15 dB after 0.9 s of voice in the −3 dB room) and can lose 10 dB later in it
    (whole reply 8-16 dB), a fresh one is at 24-35 dB in its first second and better later
    (14-19 dB). So a barge-in starts a fresh AEC3 *beside*
    the live one, both fed every frame; over the next reply the fresh one is heard after a
    window it clearly won (TRIAL_MARGIN; judged on windows without the user's voice), and
    after TRIAL_WINDOWS such windows the worse one is dropped. The next reply never starts on
    an unconverged filter, and a filter that adapted through the voice does not stay. While
    both run, the turn policy weighs the lower of their residuals, frame by frame: a voice
    is in both, a filter's own leak in one; and it counts at most TRIAL_ERLE_DB of cancelling,
    for where both leak.
    """

    def __init__(self, settings: EchoSettings) -> None:
        self.settings = settings
        # Our AEC3 (aec3.py; its suppressor tunable), which may give its own linear filter's
        # output beside its output.
        self._native = runs_our_aec3(settings)
        self._native_linear = self._native and _wants_native_linear(settings)
        self._apm = load_apm(settings, self._native)
        self._spare = _SpareApm(lambda: load_apm(settings, self._native))
        if settings.echo_cancellation:
            self._spare.refill()
        # After a barge-in: the fresh filter beside the live one, which of the two is heard,
        # and the trial's residual energies (window; all windows without the user's voice).
        self._second: Apm | None = None
        self._use_second = False
        self._trial = [0.0, 0.0, 0.0, 0.0]  # window live, window second, total live, second
        self._trial_frames = 0
        self._trial_windows = 0
        self._voice_in_window = False
        self.trials: list[str] = []  # how each trial ended: "kept" or "fresh"
        self._lock = threading.Lock()
        self._origin: float | None = None  # monotonic time of timeline index 0
        self._ref = _Reference()
        self._capture = CaptureClock()
        self._capture_index: int | None = None  # timeline index of the next capture frame
        self._pending = np.zeros(0, dtype=np.int16)  # capture samples short of a frame
        # Output lags input by what AEC3's whole frames leave pending at most, so every chunk
        # comes back whole: 512-sample chunks leave 32, 64, 96, 128, 0 → 128 samples (8 ms),
        # set on the first chunk (a chunk of another size later may add to it).
        self._out: np.ndarray | None = None
        self.delay_samples = 0  # the output is the input this many samples later
        self._last_echo_index = -(10**9)  # timeline index of the last audible reference frame
        self.estimate = EchoEstimate()
        self._chunk_residual = 0.0  # mean-square energy of the last chunk's output
        # …and, in a barge-in's trial, the live and fresh filters' own (None: no trial)
        self._chunk_trial: tuple[float, float] | None = None
        self._leak_frames = 0  # frames of the last chunk where the other filter was heard
        self._chunk_expected = 0.0  # …and what the echo alone would have left of it
        self._chunk_mic = 0.0  # …and the microphone's, before cancelling
        self._chunk_ref = 0.0  # …and the reference's placed at it (the echo comes later)
        # The linear filter beside AEC3 (mdf.py), for the barge-in decision alone: its output
        # keeps a voice AEC3's suppression takes off; None where off or not loadable.
        self._linear = None if self._native_linear else open_linear(settings)
        self.linear_estimate = EchoEstimate(converge_frames=0, onset_frames=0)
        self._linear_out: np.ndarray | None = None
        self.linear_chunk: bytes | None = None  # the last chunk's linear output (aligned)
        self._chunk_linear = 0.0
        self._chunk_linear_expected = 0.0
        self.stats = EchoStats()
        self._match = EchoMatch()  # is the output the echo itself (AEC3's lapses)?
        self._unsure: int | None = None  # audible frames left without an estimate (hold)
        # Held: the next sound from this timeline index on is the reply playing on.
        self._resume_index: int | None = None
        self._dump: BinaryIO | None = None  # --aec-dump
        self._dump_left = round(DUMP_SECONDS * RATE)  # frames it may still take
        if settings.dump:
            try:
                self._dump = open(settings.dump, "wb", buffering=0)  # noqa: SIM115 - kept open
            except OSError as err:
                _LOGGER.warning("No AEC dump: cannot write %s (%s)", settings.dump, err)

    # ---- the timeline -----------------------------------------------------------------

    def _index(self, when: float) -> int:
        if self._origin is None:
            self._origin = when
        return round((when - self._origin) * RATE)

    # ---- what plays ---------------------------------------------------------------------

    def reference(self, pcm: bytes, fmt: AudioFormat, due: float) -> None:
        """`pcm` (in `fmt`) is due to start playing at monotonic time `due`."""
        with self._lock:
            self._add_reference(pcm, fmt, due)

    def _add_reference(self, pcm: bytes, fmt: AudioFormat, due: float) -> None:
        index = self._index(due)
        ref = self._ref
        parts = [ref.samples]
        # The input's end, not the output's: the resampler's output lags it by what it holds.
        if ref.converter is None or ref.fmt != fmt or index > ref.fed_until + JOIN_SECONDS * RATE:
            # A new stream (the first, another format, or after a gap: the speaker ran dry,
            # was cut, or reopened). What the old resampler still holds is the end of the
            # old stream and goes there; the new one starts on a fresh resampler. Carried
            # over, those held samples (soxr holds up to ~60 ms at 22050 → 16 kHz) came out
            # in front of the new stream and put all of it that much late: AEC3 then
            # cancelled 1-7 dB of a second reply it had cancelled 30 dB of the first time
            # (offline, the −10 dB/60 ms room; 28-35 dB with this).
            if ref.converter is not None and ref.fmt == fmt:
                parts.append(ref.converter.flush())
            ref.converter, ref.fmt = StreamingConverter(fmt, RATE), fmt
            # Nothing plays in the past: a piece reported after the microphone moved on
            # starts no earlier than what the mic reads now.
            if self._capture_index is not None:
                index = max(index, self._capture_index)
            end = ref.start + sum(len(p) for p in parts)
            if index > end:  # silence on the timeline until it starts
                parts.append(np.zeros(index - end, dtype=np.float32))
            ref.fed_until = max(index, end)
        parts.append(ref.feed(pcm, fmt))
        ref.samples = np.concatenate(parts)

    def cut(self, at: float) -> None:
        """The reply stopped at monotonic `at` (a barge-in on a sink that stops its device):
        what was handed over for later never plays."""
        with self._lock:
            self._trim(at)
            self._barge_in()

    def hold(self, at: float) -> None:
        """The reply was held at monotonic `at` (a voice over it, maybe; its device stopped):
        what was handed over for later never plays. No barge-in yet: the filters and the
        ERLE stay (the voice, if it is one, stands over the echo's tail as it dies away); the
        reply that plays on comes through a device opened anew, so its first moments count
        as a reply's onset (EchoEstimate: no cancelling counted for 0.5 s)."""
        with self._lock:
            self._trim(at)
            self.estimate.restart_onset()
            self._resume_index = self._index(at)

    def _trim(self, at: float) -> None:
        ref, index = self._ref, self._index(at)
        if index < ref.end:
            ref.samples = ref.samples[: max(0, index - ref.start)]
        ref.converter = None  # what it holds never plays: the next piece starts anew

    def barge_in(self) -> None:
        """The user talked over the reply and it was stopped: a fresh AEC3 starts beside the
        live one (see the class)."""
        with self._lock:
            self._barge_in()

    def _barge_in(self) -> None:
        self._resume_index, self._unsure = None, None  # a held reply stopped for good
        # The ERLE measured before stays, counted up to TRIAL_ERLE_DB until the trial ends.
        # Forgetting it (1.5 s of reply expecting the full echo) missed the user over the
        # first reply after a barge-in (offline, load 2-3: 1/72 within 300 ms; bench
        # --room-cases chained, load 5-6, the echo rooms: 3/11, kept: 17/18); counting all of
        # it let both filters' leak at once through (session 28, load 9).
        if not self.settings.echo_cancellation:
            return
        self.estimate.erle_cap_db = TRIAL_ERLE_DB
        if self._second is not None and self._use_second:
            self._apm = self._second  # the fresh one was winning: it is the live one now
        self._second = self._spare.take()
        self._use_second = False
        self._trial = [0.0, 0.0, 0.0, 0.0]
        self._trial_frames = self._trial_windows = 0
        self._voice_in_window = False

    def _second_frame(
        self, render: bytes, near: np.ndarray, live_out: np.ndarray, live_energy: float,
        audible: bool,
    ) -> tuple[np.ndarray, float, float]:  # fmt: skip
        """The fresh filter on the same frame, given the live one's output and its energy;
        returns the output to hear (the one the trial favours, or in a frame where one leaks
        TRIAL_LEAK more, the other), its energy, and the fresh filter's energy. (Its linear
        output is not heard until it is the live one: the trial judges the outputs, not
        that.)"""
        second = self._second
        assert second is not None
        out, _ = second.frame(render, near)
        energy = _mean_square(out)
        if audible:
            trial = self._trial
            trial[0] += live_energy
            trial[1] += energy
            self._trial_frames += 1
            if self._trial_frames >= TRIAL_WINDOW_FRAMES:
                self._end_trial_window()
        heard_fresh = self._use_second
        if max(energy, live_energy) > TRIAL_LEAK * min(energy, live_energy):
            if heard_fresh != (energy < live_energy):
                self._leak_frames += 1
            heard_fresh = energy < live_energy
        if heard_fresh:
            return out, energy, energy
        return live_out, live_energy, energy

    def _end_trial_window(self) -> None:
        trial = self._trial
        if not self._voice_in_window:  # the user's voice would favour the one taking it off
            self._use_second = trial[1] * TRIAL_MARGIN < trial[0]
            trial[2] += trial[0]
            trial[3] += trial[1]
            self._trial_windows += 1
        trial[0] = trial[1] = 0.0
        self._trial_frames = 0
        self._voice_in_window = False
        if self._trial_windows < TRIAL_WINDOWS:
            return
        fresh = trial[3] * TRIAL_MARGIN < trial[2]
        if fresh:
            assert self._second is not None
            self._apm = self._second
            if self._native_linear:  # another linear filter from here: its ERLE is measured anew
                self.linear_estimate.forget_erle()
        self._second = None
        self._use_second = False
        self.estimate.erle_cap_db = None  # one filter, judged: its ERLE counts in full
        self.trials.append("fresh" if fresh else "kept")
        _LOGGER.debug("After the barge-in the %s filter stays", "fresh" if fresh else "kept")

    def _reference_frame(self, index: int) -> np.ndarray:
        ref = self._ref
        frame = np.zeros(FRAME, dtype=np.float32)
        lo, hi = max(index, ref.start), min(index + FRAME, ref.end)
        if lo < hi:
            frame[lo - index : hi - index] = ref.samples[lo - ref.start : hi - ref.start]
        # Forget what lies well behind the capture position.
        drop = index - KEEP_SECONDS * RATE - ref.start
        if drop > RATE:
            drop = int(min(drop, len(ref.samples)))
            ref.samples = ref.samples[drop:]
            ref.start += drop
        return frame

    # ---- what the microphone hears --------------------------------------------------------

    def process(self, chunk: bytes, captured: float) -> bytes:
        """One mic chunk (16 kHz mono s16le) read at monotonic `captured` → the same length,
        echo removed."""
        # Timed from before the lock: a chunk that waits for the speaker's thread waits too.
        began, cpu = time.perf_counter(), time.thread_time()
        with self._lock:
            out = self._process(chunk, captured)
            spent = time.perf_counter() - began
            stats = self.stats
            stats.chunks += 1
            stats.process_s += spent
            stats.process_cpu_s += time.thread_time() - cpu
            stats.process_max_s = max(stats.process_max_s, spent)
            return out

    def _process(self, chunk: bytes, captured: float) -> bytes:
        samples = np.frombuffer(chunk, dtype="<i2")
        first = self._capture.first_sample(self._index(captured), len(samples))
        self._capture_index = first - len(self._pending)  # the next frame starts there
        pending = np.concatenate([self._pending, samples])
        if self._out is None:
            self._out = np.zeros(FRAME - math.gcd(len(samples), FRAME), dtype=np.int16)
            self.delay_samples = len(self._out)
        outputs = [self._out]
        if self._linear_out is None:
            self._linear_out = np.zeros(len(self._out), dtype=np.int16)
        linear_outputs = [self._linear_out]
        used = 0
        residual = expected = linear = linear_expected = heard = played = 0.0
        live_trial = second_trial = 0.0
        frames = 0
        self._leak_frames = 0
        dumped: list[np.ndarray] = []
        while len(pending) - used >= FRAME:
            ref = self._reference_frame(self._capture_index)
            if self._ref.end < self._capture_index + FRAME <= self._ref.fed_until:
                self.stats.ref_short_frames += 1
            ref_energy = float(ref @ ref) / FRAME
            audible = ref_energy > SILENT_RMS * SILENT_RMS
            if audible:
                self._last_echo_index = self._capture_index
            render_pcm = _to_pcm16(ref)
            near = pending[used : used + FRAME]
            if self._dump is not None:
                dumped.append(np.column_stack([near, np.frombuffer(render_pcm, np.int16)]))
            out, lin = self._apm.frame(render_pcm, near)
            lower: float | None = None  # in a trial, the lower of the two filters' residuals
            if self._second is None:
                out_energy = _mean_square(out)
            else:
                live_energy = _mean_square(out)
                out, out_energy, second_energy = self._second_frame(
                    render_pcm, near, out, live_energy, audible
                )
                live_trial += live_energy
                second_trial += second_energy
                lower = min(live_energy, second_energy)
            mic_energy = _mean_square(near)
            if audible:
                self._count(mic_energy, out_energy)
            echo = self._echo_possible()
            self.estimate.frame(ref_energy, mic_energy, out_energy, audible, echo)
            resumed = self._resume_index
            if audible and resumed is not None and self._capture_index >= resumed:
                self._resume_index, self._unsure = None, RESUME_UNSURE_FRAMES  # it plays on
            if self._unsure is not None and audible:
                self._unsure -= 1
                if self._unsure <= 0:
                    self._unsure = None
            elif self._unsure is not None and self.estimate.between_replies:
                # The reply played on ended within its unsure window: the next reply's own
                # onset is counted as any reply's (live, the window ran on 8 s into it).
                self._unsure = None
            if self._linear is not None:
                lin = self._linear.process(near, np.frombuffer(render_pcm, dtype=np.int16)).copy()
            if lin is not None:
                linear_outputs.append(lin)
                lin_energy = _mean_square(lin)
                self.linear_estimate.frame(ref_energy, mic_energy, lin_energy, audible, echo)
                linear += lin_energy
                linear_expected += self.linear_estimate.expected_residual()
            # AEC3 always sees the stream (its state stays continuous); outside echo its
            # output is not used, so speech outside replies reaches the VAD as captured,
            # and with no echo path (a headset) nothing is taken off the user's voice.
            use_out = (echo and not self.estimate.no_echo) or self.settings.always_process
            chosen = out if use_out else near
            outputs.append(chosen)
            delay = self._match.frame(near, ref, chosen, audible)
            if delay is not None:
                self.estimate.echo_delay_frames = delay // FRAME
            # What the turn policy weighs. In a barge-in's trial a voice is in the microphone
            # and so in both filters' outputs; a leak is one filter's own: the unconverged
            # fresh one, heard after a window it won at the floor, passed a reply's last
            # 250 ms of echo whole (−21 dBFS, the kept one −62), 20-29 dB over the expected
            # residual: a self barge-in on the live run's frames replayed (the −3 dB room,
            # load 4.4-4.7; session 22). Session 21's three live ones all came in a trial too.
            if use_out and lower is not None:
                residual += lower
            else:
                residual += out_energy if use_out else mic_energy
            expected += self.estimate.expected_residual()
            heard += mic_energy
            played += ref_energy
            frames += 1
            used += FRAME
            self._capture_index += FRAME
        if frames:
            self._chunk_residual, self._chunk_expected = residual / frames, expected / frames
            trial = self._second is not None or second_trial > 0.0
            self._chunk_trial = (live_trial / frames, second_trial / frames) if trial else None
            self._chunk_mic = heard / frames
            self._chunk_ref = played / frames
            self._chunk_linear = linear / frames
            self._chunk_linear_expected = linear_expected / frames
        if self.linear_filter:
            lin_all = np.concatenate(linear_outputs)
            short = len(samples) - len(lin_all)
            if short > 0:
                lin_all = np.concatenate([np.zeros(short, np.int16), lin_all])
            self._linear_out = lin_all[len(samples) :].copy()
            self.linear_chunk = lin_all[: len(samples)].astype("<i2").tobytes()
        if dumped:
            self._write_dump(np.concatenate(dumped), first)
        self._pending = pending[used:].copy()
        out_all = np.concatenate(outputs)
        if len(out_all) < len(samples):  # a chunk of another size: the lag grows to fit
            self.delay_samples += len(samples) - len(out_all)
            out_all = np.concatenate([np.zeros(len(samples) - len(out_all), np.int16), out_all])
        self._out = out_all[len(samples) :].copy()
        self.stats.lag_samples = self.delay_samples
        return out_all[: len(samples)].astype("<i2").tobytes()

    def _write_dump(self, frames: np.ndarray, first: int) -> None:
        """--aec-dump: (microphone, reference) sample pairs as AEC3 got them, in order."""
        dump = self._dump
        assert dump is not None
        if self._dump_left == round(DUMP_SECONDS * RATE):
            assert self._origin is not None
            start = self._origin + (first - len(self._pending)) / RATE
            _LOGGER.info("AEC dump to %s from monotonic %.6f", dump.name, start)
        frames = frames[: self._dump_left]
        try:
            dump.write(frames.astype("<i2").tobytes())
        except OSError as err:
            _LOGGER.warning("The AEC dump stopped: %s", err)
            self._dump_left = 0
        else:
            self._dump_left -= len(frames)
        if self._dump_left <= 0:
            dump.close()
            self._dump = None

    def _count(self, mic_energy: float, out_energy: float) -> None:
        """One audible frame into the stats, from its mean-square energies (_mean_square)."""
        self.stats.seconds += FRAME / RATE
        self.stats.energy_in += mic_energy * FRAME
        self.stats.energy_out += out_energy * FRAME

    def take_stats(self) -> EchoStats:
        with self._lock:
            stats, self.stats = self.stats, EchoStats()
        return stats

    @property
    def captured_until(self) -> float | None:
        """Monotonic time the last chunk processed ended, as the capture clock places it."""
        if self._origin is None or self._capture_index is None:
            return None
        return self._origin + (self._capture_index + len(self._pending)) / RATE

    @property
    def chunk_ref_db(self) -> float:
        """The level of the reference placed at the last chunk: the audio core's frame lines
        carry it, so a leak read from a live log can be set against the reply's pauses and
        onsets (its echo comes the room's delay later)."""
        return round(_db(self._chunk_ref), 1)

    @property
    def echo_delay_ms(self) -> float | None:
        """The echo's delay behind the reference as echomatch.py found it (the frame lines
        carry it beside the match); None: not found yet."""
        delay = self._match.delay
        return None if delay is None else round(delay * 1000 / RATE, 1)

    @property
    def chunk_trial(self) -> str | None:
        """In a barge-in's trial, the last chunk's level out of each filter and which one was
        heard (the frame lines carry it: a leak read from a live log is set against the other
        filter); None outside a trial."""
        if self._chunk_trial is None:
            return None
        live, fresh = (round(_db(e), 1) for e in self._chunk_trial)
        heard = "fresh" if self._use_second else "kept"
        leaks = f" ({self._leak_frames} frames the other: a leak)" if self._leak_frames else ""
        return f"kept {live} dB, fresh {fresh} dB, heard {heard}{leaks}"

    def _echo_possible(self) -> bool:
        index = self._capture_index
        return index is not None and index - self._last_echo_index <= ECHO_TAIL_SECONDS * RATE

    @property
    def hearing(self) -> Hearing:
        """What the microphone may be hearing now besides the user."""
        return Hearing.ECHO if self._echo_possible() else Hearing.CLEAR

    @property
    def linear_filter(self) -> bool:
        """Whether a linear filter's output is at hand: our AEC3's own (aec3.py) or SpeexDSP's
        beside livekit's AEC3 (mdf.py loaded)."""
        return self._native_linear or self._linear is not None

    @property
    def linear(self) -> bool:
        """Whether the linear filter's output is worth weighing now: it runs beside AEC3
        (linear_chunk is its output) and cancels at least LINEAR_MIN_ERLE_DB."""
        return self.linear_filter and self.linear_estimate.erle_db >= LINEAR_MIN_ERLE_DB

    def evidence(self, probability: float, linear_probability: float | None = None) -> Evidence:
        """The last chunk processed, for turn_policy.decide, given its VAD probability (a
        barge-in's trial of two filters leaves out windows with the user's voice) and the
        VAD's on `linear_chunk` (None: not scored)."""
        if probability >= VOICE_PROBABILITY:
            self._voice_in_window = True
        estimate = self.estimate
        linear = linear_probability is not None and self.linear
        # A reply played on after a hold comes through a speaker command opened anew, whose
        # echo may come later than the estimate expects it: until it has played a while, no
        # estimate (turn_policy then holds the VAD alone to more, and holds nothing).
        unsure = self._unsure is not None
        return Evidence(
            probability,
            playing=self._echo_possible(),
            coupling_db=estimate.coupling_db,
            residual_db=round(_db(self._chunk_residual), 1),
            expected_residual_db=None if unsure else round(_db(self._chunk_expected), 1),
            settled=estimate.settled,
            mic_db=round(_db(self._chunk_mic), 1),
            linear_probability=linear_probability if linear else None,
            linear_residual_db=round(_db(self._chunk_linear), 1) if linear else None,
            linear_expected_db=round(_db(self._chunk_linear_expected), 1) if linear else None,
            echo_match=self._match.match()
            if probability >= MATCH_FROM and self._echo_possible()
            else None,
        )


def _mean_square(pcm16: np.ndarray) -> float:
    """A frame's mean-square energy, full scale 1."""
    x = pcm16.astype(np.float64)
    return float(x @ x) / max(len(x), 1) * _PCM16_SCALE


_PCM16_SCALE = 1.0 / (32768.0 * 32768.0)  # a power of two: the scaling is exact


def _to_pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16).tobytes()


def open_linear(settings: EchoSettings) -> Mdf | None:
    """SpeexDSP's linear filter beside livekit's AEC3 (EchoSettings.linear_filter "mdf"), or
    None: off, or libspeexdsp cannot load (one log line; barge-in then weighs AEC3's output
    alone, as before)."""
    if not (settings.echo_cancellation and settings.linear_barge_in):
        return None
    if settings.linear_filter != "mdf":
        return None
    try:
        return Mdf(FRAME, round(LINEAR_TAIL_SECONDS * RATE), RATE)
    except OSError as err:
        _LOGGER.warning(
            "No linear echo filter for barge-in (%s; Debian: apt install libspeexdsp1): a voice "
            "that starts under a loud reply is heard later",
            err,
        )
        return None


def open_canceller(settings: EchoSettings) -> EchoCanceller | None:
    """The canceller the settings ask for, or None (off, or livekit cannot load here)."""
    if not settings.active:
        return None
    try:
        return EchoCanceller(settings)
    except (ImportError, OSError, RuntimeError) as err:
        _LOGGER.error(
            "Echo cancellation is unavailable (%s): the microphone will hear the speaker", err
        )
        return None


class EchoCancelledSource:
    """An AudioSource whose chunks come out of the echo canceller."""

    def __init__(self, source: AudioSource, canceller: EchoCanceller) -> None:
        self.source = source
        self.canceller = canceller
        self.chunk_time: float | None = None

    async def open(self) -> None:
        await self.source.open()

    async def read(self) -> bytes | None:
        chunk = await self.source.read()
        if chunk is None:
            return None
        self.chunk_time = getattr(self.source, "chunk_time", None) or time.monotonic()
        return self.canceller.process(chunk, self.chunk_time)

    async def close(self) -> None:
        await self.source.close()
