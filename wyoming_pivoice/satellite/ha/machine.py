"""The Home Assistant satellite as an explicit state machine, with no I/O in it.

Everything that happens (HA's events, our VAD/wake word, the speaker finishing, the
clock) is an input method; each returns the actions the I/O layer must carry out.
Time is passed in, never read, so tests can walk through every transition without
sleeping. Every state that waits for somebody else has a deadline checked by
`tick`, so a lost event (a `transcript` that never comes, a speaker that never
reports the end) returns the satellite to listening instead of leaving it stuck.

Two things run side by side:
- the *phase* of the conversation turn: DISCONNECTED → PAUSED → LISTENING →
  STREAMING (mic audio goes to HA) → WAITING (HA thinks) → RESPONDING (reply plays)
  → LISTENING; a barge-in goes from RESPONDING (or from an announcement or a ringing
  timer) straight to STREAMING, or to HOLDING while HA's previous run may still be open;
- the *playback*: IDLE, RECEIVING (audio-start seen, chunks arriving) or DRAINING
  (audio-stop seen, the speaker is finishing). Announcements and timer sounds play
  in any phase; each playback has a generation number so a late "done" from an
  interrupted playback is recognised and ignored.

Barge-in is the standalone pipeline's rule, fed by the same endpointer events: speech that
starts over a reply, an announcement or a ringing timer (or the wake word, when one is
configured) stops it at once, `played` goes to HA for a reply cut short, and the next run
starts with that speech. A transcript that is only a stop word ("stop", "cancel", …) makes
the satellite drop that run's reply: the stop itself is the answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from wyoming.audio import AudioFormat

from ...audio.pcm import bytes_per_second
from ..listener import NO_SPEECH_S

_LOGGER = logging.getLogger(__name__)

# HA streams a reply faster than it plays and has no back-pressure: a peer that never
# ends one could fill our memory. Past this much audio the rest of the reply is dropped.
MAX_REPLY_BYTES = 64 * 1024 * 1024


# A transcript that is one of these (after dropping politeness) asks for silence.
STOP_PHRASES = frozenset(
    {
        "stop", "stop it", "stop that", "stop talking", "cancel", "never mind", "nevermind",
        "be quiet", "quiet", "shut up", "enough", "that's enough", "thats enough", "silence",
    }
)  # fmt: skip
_POLITE = ("please", "okay", "ok", "hey", "oh")


def words(text: str) -> str:
    """A text's words, lower case, as two copies of one reply are compared."""
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def is_stop(text: str | None) -> bool:
    """The transcript asks the satellite to stop talking (and nothing else)."""
    words = "".join(c if c.isalnum() or c in " '" else " " for c in (text or "").lower()).split()
    while words and words[0] in _POLITE:
        words.pop(0)
    while words and words[-1] in _POLITE:
        words.pop()
    return " ".join(words) in STOP_PHRASES


class Phase(str, Enum):
    DISCONNECTED = "disconnected"  # no Home Assistant connection
    PAUSED = "paused"  # connected; waiting for run-satellite (or paused by HA)
    LISTENING = "listening"  # waiting for a wake word / speech to start a run
    # A barge-in while HA's previous run may still be open (a streaming agent, before its
    # `synthesize`): HA cancels an open run when a new one starts, and that run's end marks
    # the satellite idle, so HA would drop the new run's audio. The mic is kept meanwhile.
    HOLDING = "holding"
    STREAMING = "streaming"  # run-pipeline sent; mic audio goes up
    WAITING = "waiting"  # speech ended; waiting for HA's transcript / reply
    RESPONDING = "responding"  # HA's reply audio is playing


class Playback(str, Enum):
    IDLE = "idle"
    RECEIVING = "receiving"  # audio-start seen, chunks are arriving
    DRAINING = "draining"  # audio-stop seen (or a sound queued); waiting for the speaker


class Kind(str, Enum):
    REPLY = "reply"  # audio from HA (a reply or an announcement): `played` when done
    SOUND = "sound"  # a local sound (awake/done/timer): no `played`


# ---- actions (what the I/O layer must do) -------------------------------------------------


@dataclass(frozen=True)
class SendRunPipeline:
    start_stage: str
    end_stage: str = "tts"
    wake_word_name: str | None = None
    announce_text: str | None = None


@dataclass(frozen=True)
class SendDetection:
    name: str


@dataclass(frozen=True)
class StartStream:
    """Send audio-start, then the pre-speech audio, then every mic chunk while `streaming`."""

    with_prespeech: bool = True


@dataclass(frozen=True)
class StopStream:
    send_audio_stop: bool


@dataclass(frozen=True)
class SendPlayed:
    pass


@dataclass(frozen=True)
class SendPing:
    """Our own keepalive: HA closes a satellite after 5 s with no event from it."""


@dataclass(frozen=True)
class StartPlayback:
    generation: int
    fmt: AudioFormat


@dataclass(frozen=True)
class PlayAudio:
    generation: int
    audio: bytes
    fmt: AudioFormat


@dataclass(frozen=True)
class FinishPlayback:
    """Play what is queued, wait until the speaker has really played it, then report
    `playback_done(generation)`."""

    generation: int


@dataclass(frozen=True)
class StopPlayback:
    """Drop the queued audio and silence the speaker now."""

    generation: int


@dataclass(frozen=True)
class PlaySound:
    """Play a local sound as playback `generation`, then report `playback_done`."""

    generation: int
    name: str  # "awake", "done", "timer"


@dataclass(frozen=True)
class StopFollow:
    """Stop speaking the followed reply (cancel its synthesis)."""


@dataclass(frozen=True)
class ResetDetector:
    """Forget VAD/wake state (after our own playback, after a run ends)."""


@dataclass(frozen=True)
class CloseConnection:
    reason: str


@dataclass(frozen=True)
class Exit:
    code: int = 0


Action = (
    SendRunPipeline
    | SendDetection
    | StartStream
    | StopStream
    | SendPlayed
    | SendPing
    | StartPlayback
    | PlayAudio
    | FinishPlayback
    | StopPlayback
    | PlaySound
    | StopFollow
    | ResetDetector
    | CloseConnection
    | Exit
)


@dataclass(frozen=True)
class Timeouts:
    """Seconds; each is the longest we wait for somebody else before giving up."""

    max_stream: float = 20.0  # one utterance streamed with no endpoint (local trigger)
    response: float = 30.0  # after speech ended, with no sign of life from HA's pipeline
    audio_gap: float = 30.0  # between reply chunks (HA has no back-pressure, but may stall)
    drain_extra: float = 10.0  # beyond the audio's own length for the speaker to finish
    error_retry: float = 2.0  # remote wake: before re-running a pipeline that failed
    ha_silence: float = 15.0  # HA pings every ~2 s; silence this long means it is gone
    sound: float = 15.0  # a local sound (awake/done/timer) is short
    no_speech: float = NO_SPEECH_S  # after a wake word (or a remote trigger) with no command spoken
    hold: float = 10.0  # a barge-in waits this long at most for HA's previous run to end
    # Our own ping this often, except while mic audio streams. HA drops a satellite after 5 s
    # of nothing; a 3.5 s stall at load 18.7 left 4.85 s at 0.5 s apart (the interval adds to
    # the stall): 0.25 s gives a quarter second more of margin for four tiny events a second.
    keepalive: float = 0.25
    ring_max: float = 300.0  # a finished timer rings until stopped, this long at most


class SatelliteMachine:
    """The satellite's whole protocol state. Not thread-safe; call from one event loop."""

    def __init__(
        self,
        *,
        remote_wake: bool = False,
        sounds: frozenset[str] = frozenset(),
        timeouts: Timeouts | None = None,
        barge_in: bool = True,
        ring_repeat: int = 0,
        ring_delay: float = 1.0,
    ) -> None:
        self.remote_wake = remote_wake
        self.sounds = sounds  # local sounds that are configured ("awake", "done", "timer")
        self.timeouts = timeouts or Timeouts()
        self.barge_in_enabled = barge_in
        self.ring_repeat = ring_repeat  # times a finished timer rings; 0: until stopped
        self.ring_delay = ring_delay  # seconds between two rings
        self.phase = Phase.DISCONNECTED
        self.playback = Playback.IDLE
        self.kind = Kind.REPLY
        self.generation = 0
        self.stage: str | None = None  # start stage of the run being streamed
        self.ending = False  # the microphone ended: finish the turn in flight, then exit
        self.exited = False
        self._deadline: float | None = None  # for the phase
        self._playback_deadline: float | None = None
        self._retry_at: float | None = None  # remote wake: re-run after an error
        self._fmt: AudioFormat | None = None
        self._received_seconds = 0.0
        self._received_bytes = 0
        self._ha_progress = False  # HA reported progress for the run being streamed
        self._speech_seen = False  # our VAD heard the command start in this stream
        self._speech_deadline: float | None = None
        self._last_heard: float | None = None
        self._pinged = False  # HA pings us, so silence means it is gone
        self._last_keepalive = 0.0
        self._sound_name: str | None = None  # the local sound playing (Kind.SOUND)
        self._discard = False  # the rest of a reply that was stopped: dropped to its audio-stop
        self._mute_run = False  # the run's transcript was a stop word: its reply is dropped
        self._muted_reply = False  # the reply being dropped is that run's: `played` at its end
        self._ha_run_open = False  # HA's pipeline for our run may still run (no synthesize yet)
        self._hold_wake: str | None = None  # the wake word a held barge-in started with
        self._held_endpoint = False  # the held utterance already ended
        # Follow (--server): our server's streamed reply to this run plays as it is written;
        # HA's audio of the same reply is then a duplicate, dropped.
        self._follow: str | None = None  # None | joined | playing | done (played or cut)
        self._follow_text: str | None = None  # the followed reply's words, once complete
        self._follow_until: float | None = None  # HA's duplicate is expected until then
        self._follow_gen: int | None = None  # the playback that is the followed reply
        self._dup_taken = False  # HA's copy of the followed reply has started (and is dropped)
        self._ha_synth_text: str | None = None  # the words of HA's last `synthesize`
        self._ring_until: float | None = None  # a finished timer rings until then
        self._ring_next: float | None = None  # the next ring, once the speaker is free
        self._rings_left: int | None = None

    # ---- properties the I/O layer reads on every mic chunk --------------------------------

    @property
    def streaming(self) -> bool:
        return self.phase is Phase.STREAMING

    @property
    def accepts_trigger(self) -> bool:
        """Local wake/VAD may start a run: listening, and not hearing our own speaker."""
        return (
            self.phase is Phase.LISTENING
            and not self.remote_wake
            and self.playback is Playback.IDLE
            and not self.ending
        )

    @property
    def holding(self) -> bool:
        """A barge-in waits to start its run: the I/O layer keeps the mic audio meanwhile."""
        return self.phase is Phase.HOLDING

    @property
    def following(self) -> bool:
        """Our server's reply to this run is to be spoken (follow_joined was accepted)."""
        return self._follow in ("joined", "playing")

    @property
    def ringing(self) -> bool:
        return self._ring_until is not None

    @property
    def accepts_barge_in(self) -> bool:
        """Speech (or the wake word) now stops what plays and starts a run: a reply, an
        announcement or a ringing timer (not our own short awake/done sounds)."""
        if not self.barge_in_enabled or self.remote_wake or self.ending:
            return False
        reply = self.playback is not Playback.IDLE and self.kind is Kind.REPLY
        if reply and self.phase in (Phase.LISTENING, Phase.RESPONDING):
            return True
        return self.ringing and self.phase is Phase.LISTENING

    @property
    def in_turn(self) -> bool:
        """A conversation turn is under way (for the per-turn clock)."""
        if self.phase is Phase.STREAMING:
            return self.stage == "asr" or self._ha_progress
        return self.phase in (Phase.HOLDING, Phase.WAITING, Phase.RESPONDING)

    @property
    def connected(self) -> bool:
        return self.phase is not Phase.DISCONNECTED

    def describe(self) -> str:
        return f"{self.phase.value}/{self.playback.value}"

    # ---- connection -----------------------------------------------------------------------

    def connect(self, now: float) -> list[Action]:
        """A Home Assistant connection became the active one."""
        self._last_heard = now
        self._pinged = False
        if self.phase is Phase.DISCONNECTED:
            self._set_phase(Phase.PAUSED)
        return self._maybe_exit()

    def disconnect(self, now: float) -> list[Action]:
        """The active connection is gone: stop everything, back to idle."""
        actions: list[Action] = []
        if self.phase is Phase.STREAMING:
            actions.append(StopStream(send_audio_stop=False))
        if self.playback is not Playback.IDLE:
            actions.append(StopPlayback(self.generation))
            self._playback_idle()
        if self.phase is not Phase.DISCONNECTED:
            actions.append(ResetDetector())
        self._set_phase(Phase.DISCONNECTED)
        self._pinged = False
        self._discard = self._mute_run = self._muted_reply = self._ha_run_open = False
        self._stop_ring()
        actions += self._drop_follow()
        return actions + self._maybe_exit()

    def heard(self, now: float, ping: bool = False) -> None:
        """Any event from the active connection (a ping says HA will keep pinging)."""
        self._last_heard = now
        self._pinged = self._pinged or ping

    def run_satellite(self, now: float) -> list[Action]:
        if self.phase is Phase.PAUSED:
            return self._listen(now)
        return []  # already running (HA sends it once per connection): nothing to redo

    def pause_satellite(self, now: float) -> list[Action]:
        """Stop streaming and any run; a reply already playing may finish (and gets `played`)."""
        actions: list[Action] = []
        if self.phase is Phase.DISCONNECTED:
            return actions
        if self.phase is Phase.STREAMING:
            actions.append(StopStream(send_audio_stop=False))
        if self.phase is not Phase.PAUSED:
            actions.append(ResetDetector())
        self._set_phase(Phase.PAUSED)
        self._retry_at = None
        self._mute_run = False
        return actions + self._maybe_exit()

    # ---- starting and ending a run --------------------------------------------------------

    def trigger(self, now: float, wake_word: str | None = None) -> list[Action]:
        """Our wake word fired (wake_word=name) or VAD heard speech start (None).

        After VAD the command is already being spoken (its start goes up as pre-speech);
        after a wake word the command is still to come, so the endpoint only counts once
        VAD has heard it start, and a wake word followed by nothing ends the run.
        """
        if not self.accepts_trigger:
            return []
        return self._start_run(now, wake_word)

    def barge_in(self, now: float, wake_word: str | None = None) -> list[Action]:
        """Speech started (wake_word=None) or the wake word fired over a reply, an
        announcement or a ringing timer: stop it now and start a run with that speech."""
        if not self.accepts_barge_in:
            return []
        _LOGGER.info("Barge-in over %s", "the timer" if self.ringing else "the reply")
        hold = self.phase is Phase.RESPONDING and self._ha_run_open
        actions = self._silence(now)
        self._set_phase(Phase.LISTENING)
        if not hold:
            return actions + self._start_run(now, wake_word)
        _LOGGER.info("Home Assistant's last run may still be open: holding the new one")
        self._set_phase(Phase.HOLDING, now + self.timeouts.hold)
        self._hold_wake, self._held_endpoint = wake_word, False
        if wake_word is not None:
            actions.append(ResetDetector())  # VAD starts afresh on the command
        return actions

    def _start_run(self, now: float, wake_word: str | None) -> list[Action]:
        self._mute_run = False
        self._ha_run_open = True
        if wake_word is None:
            actions: list[Action] = [SendRunPipeline("asr", "tts")]
            actions += self._start_stream(now, "asr", with_prespeech=True)
            self._speech_seen, self._speech_deadline = True, None
            return actions
        actions = [
            SendDetection(wake_word),
            SendRunPipeline("asr", "tts", wake_word_name=wake_word),
        ]
        actions += self._start_stream(now, "asr", with_prespeech=False)
        actions.append(ResetDetector())  # VAD starts afresh on the command
        if "awake" in self.sounds and self.playback is Playback.IDLE:
            actions += self._start_sound(now, "awake")
        return actions

    def _release_hold(self, now: float) -> list[Action]:
        """HA's previous run is over (or the hold timed out): start the held run; what the
        mic heard meanwhile goes up first."""
        wake, ended = self._hold_wake, self._held_endpoint
        self._hold_wake, self._held_endpoint = None, False
        self._mute_run, self._ha_run_open = False, True
        actions: list[Action] = []
        if wake is not None:
            actions.append(SendDetection(wake))
        actions.append(SendRunPipeline("asr", "tts", wake_word_name=wake))
        actions += self._start_stream(now, "asr", with_prespeech=True)
        if wake is None:  # the speech that barged in is under way
            self._speech_seen, self._speech_deadline = True, None
        if ended:
            actions += self._end_stream(now, send_audio_stop=True)
        return actions

    def _silence(self, now: float) -> list[Action]:
        """Stop what plays (a reply gets `played`: its playback is over) and the ringing."""
        actions: list[Action] = []
        if self.playback is not Playback.IDLE:
            actions.append(StopPlayback(self.generation))
            if self.kind is Kind.REPLY:
                # The rest of it is still on its way from HA: dropped up to its audio-stop.
                self._discard = self.playback is Playback.RECEIVING and self._follow is None
                if self._follow == "playing":  # ours stops; HA's copy is still to drop
                    actions.append(StopFollow())
                    self._follow = "done"
                    self._follow_until = now + self.timeouts.response
                if self.connected:
                    actions.append(SendPlayed())
            self._playback_idle()
        self._stop_ring()
        return actions

    def speech_started(self, now: float) -> list[Action]:
        """VAD heard speech start while we stream (the command after a wake word)."""
        if self.phase is Phase.HOLDING:
            self._held_endpoint = False
        if self.phase is Phase.STREAMING and self.stage == "asr":
            self._speech_seen = True
            self._speech_deadline = None
        return []

    def remote_run_pipeline(
        self, now: float, start_stage: str, end_stage: str, announce_text: str | None = None
    ) -> list[Action]:
        """HA (or another server) asks us to run a pipeline (`supports_trigger`)."""
        actions: list[Action] = []
        idle_wake_stream = (
            self.phase is Phase.STREAMING and self.stage == "wake" and not self._ha_progress
        )
        if idle_wake_stream:  # remote wake, nobody speaking yet: end that run first
            actions.append(StopStream(send_audio_stop=True))
            self._set_phase(Phase.LISTENING)
        elif self.phase is not Phase.LISTENING or self.ending:
            _LOGGER.info("Ignoring a remote run-pipeline while %s", self.describe())
            return []
        actions.append(SendRunPipeline(start_stage, end_stage, announce_text=announce_text))
        self._mute_run, self._ha_run_open = False, True
        if start_stage in ("wake", "asr"):
            actions += self._start_stream(now, start_stage, with_prespeech=False)
        else:  # nothing to stream: HA goes straight to the reply
            self._set_phase(Phase.WAITING, now + self.timeouts.response)
            self.stage = start_stage
        return actions

    def endpoint(self, now: float) -> list[Action]:
        """Our VAD declared the end of the utterance (has_vad=True): stop the stream."""
        if self.phase is Phase.HOLDING:
            self._held_endpoint = True  # sent with the held audio once the run starts
            return []
        if self.phase is not Phase.STREAMING or self.stage != "asr" or not self._speech_seen:
            return []
        return self._end_stream(now, send_audio_stop=True)

    def mic_ended(self, now: float) -> list[Action]:
        """The microphone (file/command) ended: finish the turn in flight, then exit."""
        self.ending = True
        actions: list[Action] = []
        if self.phase is Phase.HOLDING:
            self._held_endpoint = True
            actions += self._release_hold(now)
        elif self.phase is Phase.STREAMING:
            if self.stage == "asr" or self._ha_progress:
                actions += self._end_stream(now, send_audio_stop=True)
            else:  # remote wake with no wake word heard yet: nothing in flight
                actions.append(StopStream(send_audio_stop=True))
                self._set_phase(Phase.LISTENING)
        self._retry_at = None
        return actions + self._maybe_exit()

    # ---- HA's pipeline events -------------------------------------------------------------

    def progress(self, now: float, what: str, text: str | None = None) -> list[Action]:
        """transcribe / voice-started / voice-stopped / detect / detection / synthesize:
        HA's pipeline is alive, so its deadline moves."""
        if self.phase is Phase.STREAMING and what in ("detection", "transcribe", "voice-started"):
            self._ha_progress = True
        if self.phase is Phase.WAITING:
            self._deadline = now + self.timeouts.response
        if what == "synthesize":
            self._ha_synth_text = words(text or "")
        if what == "synthesize" and self.phase is not Phase.STREAMING:
            # TTS_START: HA's run ends right after it (its audio streams on by itself).
            self._ha_run_open = False
            if self.phase is Phase.HOLDING:
                return self._release_hold(now)
        return []

    def transcript(self, now: float, text: str | None = None) -> list[Action]:
        """Speech-to-text is done: stop streaming (HA ended the audio itself). A stop word
        stops any sound and drops the reply HA will send for it."""
        actions: list[Action] = []
        if self.phase in (Phase.STREAMING, Phase.WAITING) and is_stop(text):
            _LOGGER.info("Heard %r: this run's reply is dropped", text)
            self._mute_run = True
            self._stop_ring()
        if self.phase is Phase.STREAMING:
            actions += self._end_stream(now, send_audio_stop=False)
        elif self.phase is Phase.WAITING:
            self._deadline = now + self.timeouts.response
        else:
            return []
        if "done" in self.sounds and self.playback is Playback.IDLE and not self._mute_run:
            actions += self._start_sound(now, "done")
        return actions

    def error(self, now: float) -> list[Action]:
        """HA's pipeline failed: stop streaming, back to listening."""
        if self.phase is Phase.HOLDING:  # the failed run is the old one: it is over now
            self._ha_run_open = False
            return self._release_hold(now)
        if self.phase not in (Phase.STREAMING, Phase.WAITING):
            return []
        self._ha_run_open = False
        actions: list[Action] = []
        if self.phase is Phase.STREAMING:
            actions.append(StopStream(send_audio_stop=False))
        if self.remote_wake and not self.ending:
            # Not at once: a pipeline that fails at start would loop tightly.
            self._set_phase(Phase.LISTENING)
            self._retry_at = now + self.timeouts.error_retry
            return [*actions, ResetDetector()]
        return actions + self._listen(now)

    # ---- reply audio from HA --------------------------------------------------------------

    def audio_start(self, now: float, fmt: AudioFormat) -> list[Action]:
        """A reply or announcement starts; during another one it means an interruption."""
        actions: list[Action] = []
        if self.phase is Phase.DISCONNECTED:
            return actions
        self._discard = False  # whatever was being dropped has ended
        if self._follow is not None and not self._dup_taken:
            if self._follow == "joined" or self._follow_mismatch():
                # Ours has not started (or is another reply): HA's audio plays, ours stops.
                actions += self._drop_follow()
            else:
                _LOGGER.info("Dropping Home Assistant's audio of the reply we followed")
                self._discard = self._dup_taken = True
                return actions
        if self.phase is Phase.HOLDING or (self._mute_run and self.phase is Phase.WAITING):
            # HA's audio of the run the user stopped (barge-in, stop word): not played.
            self._discard = True
            self._muted_reply = self.phase is Phase.WAITING
            if self._muted_reply:
                self._set_phase(Phase.LISTENING)
                actions.append(ResetDetector())
            return actions
        if self.playback is not Playback.IDLE:
            if self.kind is Kind.SOUND and self._sound_name == "timer":
                self._ring_next = now  # the reply goes first; the timer rings on after it
            actions.append(StopPlayback(self.generation))  # interrupted: the new one wins
        if self.phase is Phase.STREAMING:
            # Audio for us while we stream (an announcement during remote wake): end HA's
            # run cleanly, the speaker must not be fed back into it.
            actions.append(StopStream(send_audio_stop=True))
            self._set_phase(Phase.RESPONDING)
        elif self.phase is Phase.WAITING:
            self._set_phase(Phase.RESPONDING)
        self.generation += 1
        self.kind = Kind.REPLY
        self.playback = Playback.RECEIVING
        self._fmt = fmt
        self._received_seconds = 0.0
        self._received_bytes = 0
        self._playback_deadline = now + self.timeouts.audio_gap
        actions.append(StartPlayback(self.generation, fmt))
        return actions

    def audio_chunk(self, now: float, audio: bytes, fmt: AudioFormat | None) -> list[Action]:
        if self._discard:
            return []  # the rest of a reply that was stopped
        if self.playback is Playback.IDLE and fmt is not None and self.connected:
            # A chunk without audio-start (not what HA does): play it anyway, at its own rate.
            actions = self.audio_start(now, fmt)
        elif self.playback is Playback.RECEIVING and self.kind is Kind.REPLY:
            actions = []
        else:
            return []  # after audio-stop, or while a local sound plays with no reply
        if self._fmt is not None and fmt is not None and fmt != self._fmt:
            _LOGGER.warning("Dropping a reply chunk in another format than its audio-start")
            return actions
        fmt = self._fmt or fmt
        assert fmt is not None
        self._received_bytes += len(audio)
        if self._received_bytes > MAX_REPLY_BYTES:
            if self._received_bytes - len(audio) <= MAX_REPLY_BYTES:
                _LOGGER.warning("Reply longer than %d bytes: dropping the rest", MAX_REPLY_BYTES)
            return actions
        self._received_seconds += len(audio) / max(1, bytes_per_second(fmt))
        self._playback_deadline = now + self.timeouts.audio_gap
        actions.append(PlayAudio(self.generation, audio, fmt))
        return actions

    def audio_stop(self, now: float) -> list[Action]:
        if self._discard:
            self._discard = False
            if self._follow == "done" and self._dup_taken:
                self._clear_follow()  # ours has played and HA's copy is over
            if self._muted_reply:  # nothing of it was played, and nothing of it will be
                self._muted_reply = self._mute_run = False
                return [SendPlayed()] if self.connected else []
            return []
        if self.playback is not Playback.RECEIVING or self.kind is not Kind.REPLY:
            return []
        self.playback = Playback.DRAINING
        self._playback_deadline = now + self._received_seconds + self.timeouts.drain_extra
        return [FinishPlayback(self.generation)]

    def playback_done(self, now: float, generation: int) -> list[Action]:
        """The speaker really finished playback `generation` (drained, or failed)."""
        if generation != self.generation or self.playback is not Playback.DRAINING:
            return []  # an interrupted playback reporting late
        return self._finish_playback(now)

    # ---- our server's reply, followed (--server) ------------------------------------------

    def follow_joined(self, now: float) -> list[Action]:
        """Our server joined the turn HA sent it for this run: its reply will stream here."""
        if self.phase is not Phase.WAITING or self._mute_run or self._follow is not None:
            return []
        self._follow, self._follow_text = "joined", None
        self._follow_until = now + self.timeouts.response
        # HA's `synthesize` of this run comes after the join: the one before is an earlier
        # run's, and compared with this reply it dropped ours mid-sentence (bench --ha-follow:
        # the second turn of one connection, whose `handled` came before HA's `synthesize`).
        self._ha_synth_text = None
        return []

    def follow_audio(self, now: float, audio: bytes, fmt: AudioFormat) -> list[Action]:
        """A piece of the followed reply's audio (its phrases as our server speaks them)."""
        actions: list[Action] = []
        if self._follow == "joined" and self.phase in (Phase.WAITING, Phase.RESPONDING):
            if self.playback is not Playback.IDLE:
                actions.append(StopPlayback(self.generation))  # the done sound, say
                self._playback_idle()
            self._set_phase(Phase.RESPONDING)
            self._follow = "playing"
            self.generation += 1
            self._follow_gen = self.generation
            self.kind = Kind.REPLY
            self.playback = Playback.RECEIVING
            self._received_seconds = 0.0
            actions.append(StartPlayback(self.generation, fmt))
        elif self._follow != "playing" or self.playback is not Playback.RECEIVING:
            return []
        self._received_seconds += len(audio) / max(1, bytes_per_second(fmt))
        self._playback_deadline = now + self.timeouts.audio_gap
        actions.append(PlayAudio(self.generation, audio, fmt))
        return actions

    def follow_text(self, now: float, text: str) -> list[Action]:
        """The followed reply is complete as text (`handled`): HA will speak these words."""
        if self._follow is not None:
            self._follow_text = words(text)
            if self._follow_mismatch() and self.playback is Playback.RECEIVING:
                return self._drop_follow()  # HA speaks something else: its audio plays
        return []

    def follow_done(self, now: float) -> list[Action]:
        """All of the followed reply's audio was handed over."""
        if self._follow == "playing" and self.playback is Playback.RECEIVING:
            self._follow = "done"
            self.playback = Playback.DRAINING
            self._playback_deadline = now + self._received_seconds + self.timeouts.drain_extra
            self._follow_until = now + self._received_seconds + self.timeouts.response
            return [FinishPlayback(self.generation)]
        if self._follow == "joined":  # nothing came (TTS failed): HA's audio will play
            self._clear_follow()
        return []

    def _follow_mismatch(self) -> bool:
        ours, theirs = self._follow_text, self._ha_synth_text
        return ours is not None and theirs is not None and ours != theirs

    def _drop_follow(self) -> list[Action]:
        """Stop following: ours stops (if it plays), HA's audio is no duplicate any more."""
        actions: list[Action] = []
        if self._follow in ("joined", "playing"):
            actions.append(StopFollow())  # its synthesis may still run
        ours = self._follow_gen == self.generation and self.kind is Kind.REPLY
        if ours and self.playback is not Playback.IDLE:
            actions.append(StopPlayback(self.generation))
            self._playback_idle()
        self._clear_follow()
        return actions

    def _clear_follow(self) -> None:
        self._follow = self._follow_text = self._follow_until = self._follow_gen = None
        self._dup_taken = False

    def sound(self, now: float, name: str) -> list[Action]:
        """Play a local sound if nothing else is playing."""
        if name not in self.sounds or self.playback is not Playback.IDLE or not self.connected:
            return []
        return self._start_sound(now, name)

    def timer_finished(self, now: float) -> list[Action]:
        """Ring until stopped (speech, the wake word, a stop word), `ring_repeat` times if
        set, `ring_max` at most. A reply or announcement is not cut: the ring waits for it."""
        if "timer" not in self.sounds or not self.connected:
            return []
        self._ring_until = now + self.timeouts.ring_max
        self._rings_left = self.ring_repeat or None
        if self._ring_next is None and not (
            self.playback is not Playback.IDLE and self._sound_name == "timer"
        ):
            self._ring_next = now
        return self._maybe_ring(now)

    def _maybe_ring(self, now: float) -> list[Action]:
        if self._ring_until is None:
            return []
        if now >= self._ring_until or self._rings_left == 0:
            _LOGGER.info("The timer stops ringing")
            self._stop_ring()
            return []
        free = self.playback is Playback.IDLE and self.phase in (Phase.LISTENING, Phase.PAUSED)
        if self._ring_next is None or now < self._ring_next or not free:
            return []
        self._ring_next = None  # set again when this ring ends
        if self._rings_left is not None:
            self._rings_left -= 1
        return self._start_sound(now, "timer")

    def _stop_ring(self) -> None:
        self._ring_until = self._ring_next = self._rings_left = None

    # ---- the clock --------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        actions: list[Action] = []
        if (
            self._pinged
            and self.phase not in (Phase.DISCONNECTED, Phase.PAUSED, Phase.STREAMING)
            and now - self._last_keepalive >= self.timeouts.keepalive
        ):
            # HA reads any event as a sign of life: ours go out each second, so a pong
            # that a busy CPU delays does not make 5 s of silence (mic audio does it while
            # streaming).
            self._last_keepalive = now
            actions.append(SendPing())
        if (
            self._pinged
            and self.phase not in (Phase.DISCONNECTED, Phase.PAUSED)
            and self._last_heard is not None
            and now - self._last_heard > self.timeouts.ha_silence
        ):
            _LOGGER.warning("Home Assistant silent for %.0f s: dropping it", now - self._last_heard)
            actions.append(CloseConnection("Home Assistant stopped answering"))
            return actions + self.disconnect(now)
        if self._playback_deadline is not None and now >= self._playback_deadline:
            if self.playback is Playback.RECEIVING:
                _LOGGER.warning("No reply audio for %.0f s: ending it", self.timeouts.audio_gap)
                actions += self.audio_stop(now)
            elif self.playback is Playback.DRAINING:
                _LOGGER.warning("The speaker did not finish in time: stopping it")
                actions.append(StopPlayback(self.generation))
                actions += self._finish_playback(now)
        if (
            self._speech_deadline is not None
            and now >= self._speech_deadline
            and self.phase is Phase.STREAMING
        ):
            _LOGGER.info("No command spoken within %.0f s: ending the run", self.timeouts.no_speech)
            actions += self._end_stream(now, send_audio_stop=True)
        if self._deadline is not None and now >= self._deadline:
            if self.phase is Phase.STREAMING:
                _LOGGER.info("Utterance longer than %.0f s: ending it", self.timeouts.max_stream)
                actions += self._end_stream(now, send_audio_stop=True)
            elif self.phase is Phase.WAITING:
                _LOGGER.warning("No answer from Home Assistant's pipeline: back to listening")
                actions += self._listen(now)
            elif self.phase is Phase.HOLDING:
                _LOGGER.warning("Home Assistant's last run did not end: starting anyway")
                actions += self._release_hold(now)
        if self.phase is Phase.RESPONDING and self.playback is Playback.IDLE:
            actions += self._listen(now)  # cannot happen by design; never stay here if it does
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
            if self.phase is Phase.LISTENING:
                actions += self._listen(now)
        if (
            self._follow_until is not None
            and now >= self._follow_until
            and self._follow != "playing"
        ):
            # HA's copy never came (or ours never did): nothing more to drop or wait for.
            actions += self._drop_follow()
        actions += self._maybe_ring(now)
        return actions + self._maybe_exit()

    # ---- helpers ------------------------------------------------------------------------------

    def _set_phase(self, phase: Phase, deadline: float | None = None) -> None:
        if phase is not self.phase:
            _LOGGER.debug("Satellite %s → %s", self.phase.value, phase.value)
        self.phase = phase
        self._deadline = deadline
        if phase is not Phase.STREAMING:
            self._ha_progress = False
            self._speech_seen = False
            self._speech_deadline = None
        if phase in (Phase.DISCONNECTED, Phase.PAUSED, Phase.LISTENING):
            self.stage = None

    def _listen(self, now: float) -> list[Action]:
        """Back to waiting for the next run; with remote wake that means streaming to HA."""
        self._set_phase(Phase.LISTENING)
        self._retry_at = None
        self._mute_run = self._ha_run_open = False
        actions: list[Action] = [ResetDetector()]
        if self.remote_wake and not self.ending:
            actions += [SendRunPipeline("wake", "tts"), *self._start_stream(now, "wake", False)]
        return actions

    def _start_stream(self, now: float, stage: str, with_prespeech: bool) -> list[Action]:
        deadline = now + self.timeouts.max_stream if stage == "asr" else None
        self._set_phase(Phase.STREAMING, deadline)
        self.stage = stage
        self._speech_seen = False
        # Our VAD watches for the command (with remote wake HA's VAD does, and ends it).
        local_vad = stage == "asr" and not self.remote_wake
        self._speech_deadline = now + self.timeouts.no_speech if local_vad else None
        return [StartStream(with_prespeech=with_prespeech)]

    def _end_stream(self, now: float, send_audio_stop: bool) -> list[Action]:
        self._set_phase(Phase.WAITING, now + self.timeouts.response)
        return [StopStream(send_audio_stop=send_audio_stop), ResetDetector()]

    def _start_sound(self, now: float, name: str) -> list[Action]:
        self.generation += 1
        self.kind = Kind.SOUND
        self._sound_name = name
        self.playback = Playback.DRAINING  # queued whole; the speaker reports when it is done
        self._playback_deadline = now + self.timeouts.sound
        return [PlaySound(self.generation, name)]

    def _finish_playback(self, now: float) -> list[Action]:
        kind = self.kind
        if self._follow == "done" and self._dup_taken and not self._discard:
            self._clear_follow()  # HA's copy came and went while ours played
        if kind is Kind.SOUND and self._sound_name == "timer" and self.ringing:
            self._ring_next = now + self.ring_delay
        self._playback_idle()
        actions: list[Action] = []
        if kind is Kind.REPLY and self.connected:
            actions.append(SendPlayed())
        if kind is Kind.REPLY and self.phase is Phase.RESPONDING:
            actions += self._listen(now)
        else:
            actions.append(ResetDetector())  # the mic heard our speaker: start afresh
        return actions + self._maybe_exit()

    def _playback_idle(self) -> None:
        self.playback = Playback.IDLE
        self.kind = Kind.REPLY
        self._sound_name = None
        self._playback_deadline = None
        self._fmt = None
        self._received_seconds = 0.0
        self._received_bytes = 0

    def _maybe_exit(self) -> list[Action]:
        in_flight = self.phase in (Phase.HOLDING, Phase.STREAMING, Phase.WAITING, Phase.RESPONDING)
        if self.ending and not self.exited and not in_flight and self.playback is Playback.IDLE:
            self.exited = True
            return [Exit(0)]
        return []
