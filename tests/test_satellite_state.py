"""The HA satellite's state machine, walked transition by transition (no I/O, no sleeping)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from wyoming.audio import AudioFormat

from wyoming_pivoice.satellite.ha import machine as state
from wyoming_pivoice.satellite.ha.machine import (
    CloseConnection,
    Exit,
    FinishPlayback,
    Phase,
    PlayAudio,
    Playback,
    PlaySound,
    ResetDetector,
    SatelliteMachine,
    SendDetection,
    SendPing,
    SendPlayed,
    SendRunPipeline,
    StartPlayback,
    StartStream,
    StopFollow,
    StopPlayback,
    StopStream,
    Timeouts,
    is_stop,
)

TTS = AudioFormat(22050, 2, 1)
T = Timeouts()


def running(**kwargs) -> SatelliteMachine:
    machine = SatelliteMachine(**kwargs)
    assert machine.connect(0.0) == []
    assert machine.phase is Phase.PAUSED
    machine.run_satellite(0.0)
    return machine


def types(actions) -> list[type]:
    return [type(action) for action in actions]


def test_a_whole_turn_with_vad_trigger() -> None:
    sat = SatelliteMachine()
    assert sat.phase is Phase.DISCONNECTED and not sat.accepts_trigger
    sat.connect(0.0)
    assert not sat.accepts_trigger  # connected, but HA has not said run-satellite yet
    assert sat.run_satellite(0.1) == [ResetDetector()]
    assert sat.phase is Phase.LISTENING and sat.accepts_trigger

    assert sat.trigger(1.0) == [SendRunPipeline("asr", "tts"), StartStream(with_prespeech=True)]
    assert sat.streaming and sat.stage == "asr" and not sat.accepts_trigger
    assert sat.trigger(1.1) == []  # a second speech start inside the run changes nothing
    assert sat.progress(1.2, "transcribe") == []
    assert sat.progress(1.3, "voice-started") == []

    assert sat.endpoint(2.0) == [StopStream(send_audio_stop=True), ResetDetector()]
    assert sat.phase is Phase.WAITING and not sat.streaming
    assert sat.endpoint(2.1) == []  # only once
    assert sat.transcript(2.5) == []
    assert sat.progress(2.6, "synthesize") == []

    assert sat.audio_start(3.0, TTS) == [StartPlayback(1, TTS)]
    assert sat.phase is Phase.RESPONDING and sat.playback is Playback.RECEIVING
    assert sat.audio_chunk(3.1, b"\0" * 2048, TTS) == [PlayAudio(1, b"\0" * 2048, TTS)]
    assert sat.audio_stop(3.2) == [FinishPlayback(1)]
    assert sat.playback is Playback.DRAINING and not sat.accepts_trigger
    assert sat.playback_done(3.3, 1) == [SendPlayed(), ResetDetector()]
    assert sat.phase is Phase.LISTENING and sat.playback is Playback.IDLE and sat.accepts_trigger


def test_local_wake_word_sends_detection_first_and_waits_for_the_command() -> None:
    sat = running()
    actions = sat.trigger(1.0, wake_word="okay_nabu")
    assert actions == [
        SendDetection("okay_nabu"),
        SendRunPipeline("asr", "tts", wake_word_name="okay_nabu"),
        StartStream(with_prespeech=False),
        ResetDetector(),
    ]
    # The wake word's own end of speech is not the command's endpoint.
    assert sat.endpoint(1.3) == [] and sat.streaming
    assert sat.speech_started(2.0) == []
    assert sat.endpoint(3.0) == [StopStream(send_audio_stop=True), ResetDetector()]


def test_wake_word_with_no_command_ends_the_run() -> None:
    sat = running()
    sat.trigger(1.0, wake_word="okay_nabu")
    assert sat.tick(1.0 + T.no_speech - 0.1) == []
    assert sat.tick(1.0 + T.no_speech) == [StopStream(send_audio_stop=True), ResetDetector()]
    assert sat.phase is Phase.WAITING  # HA answers (an error, most likely) or times out


def test_transcript_before_our_endpoint_stops_streaming_without_audio_stop() -> None:
    sat = running()
    sat.trigger(1.0)
    assert sat.transcript(2.0) == [StopStream(send_audio_stop=False), ResetDetector()]
    assert sat.phase is Phase.WAITING
    assert sat.endpoint(2.1) == []


def test_error_stops_streaming_and_listens_again() -> None:
    sat = running()
    sat.trigger(1.0)
    assert sat.error(1.5) == [StopStream(send_audio_stop=False), ResetDetector()]
    assert sat.phase is Phase.LISTENING and sat.accepts_trigger
    sat.trigger(2.0)
    sat.endpoint(3.0)
    assert sat.error(3.5) == [ResetDetector()]  # no stream to stop any more
    assert sat.phase is Phase.LISTENING


def test_no_trigger_while_paused_or_playing() -> None:
    sat = SatelliteMachine()
    assert sat.trigger(0.0) == []
    sat.connect(0.0)
    assert sat.trigger(0.1) == []  # paused until run-satellite
    sat.run_satellite(0.2)
    sat.audio_start(0.3, TTS)  # an announcement
    assert sat.phase is Phase.LISTENING and sat.trigger(0.4) == []  # would hear our speaker
    sat.audio_stop(0.5)
    assert sat.trigger(0.6) == []
    assert sat.playback_done(0.7, sat.generation) == [SendPlayed(), ResetDetector()]
    assert sat.phase is Phase.LISTENING and sat.trigger(0.8) != []


def test_pause_stops_streaming_and_runs() -> None:
    sat = running()
    sat.trigger(1.0)
    assert sat.pause_satellite(1.5) == [StopStream(send_audio_stop=False), ResetDetector()]
    assert sat.phase is Phase.PAUSED and not sat.streaming
    assert sat.trigger(2.0) == [] and sat.endpoint(2.1) == []
    assert sat.pause_satellite(2.2) == []  # twice is harmless
    sat.run_satellite(3.0)
    assert sat.phase is Phase.LISTENING and sat.trigger(3.1) != []


def test_pause_lets_a_reply_finish_and_still_reports_played() -> None:
    sat = running()
    sat.trigger(1.0)
    sat.endpoint(2.0)
    sat.audio_start(3.0, TTS)
    sat.pause_satellite(3.1)
    assert sat.phase is Phase.PAUSED and sat.playback is Playback.RECEIVING
    sat.audio_chunk(3.2, b"\0" * 100, TTS)
    sat.audio_stop(3.3)
    assert sat.playback_done(3.4, sat.generation) == [SendPlayed(), ResetDetector()]
    assert sat.phase is Phase.PAUSED


def test_run_satellite_twice_does_not_restart() -> None:
    sat = running()
    sat.trigger(1.0)
    assert sat.run_satellite(1.1) == []
    assert sat.streaming


def test_disconnect_mid_stream_goes_idle_and_a_new_connection_works() -> None:
    sat = running()
    sat.trigger(1.0)
    assert sat.disconnect(1.5) == [StopStream(send_audio_stop=False), ResetDetector()]
    assert sat.phase is Phase.DISCONNECTED and not sat.streaming
    assert sat.trigger(1.6) == [] and sat.endpoint(1.7) == [] and sat.transcript(1.8) == []
    sat.connect(2.0)
    sat.run_satellite(2.0)
    assert sat.trigger(2.5) == [SendRunPipeline("asr", "tts"), StartStream(True)]


def test_disconnect_mid_reply_stops_playback() -> None:
    sat = running()
    sat.trigger(1.0)
    sat.endpoint(2.0)
    sat.audio_start(3.0, TTS)
    sat.audio_chunk(3.1, b"\0" * 100, TTS)
    gen = sat.generation
    assert sat.disconnect(3.2) == [StopPlayback(gen), ResetDetector()]
    assert sat.playback is Playback.IDLE and sat.phase is Phase.DISCONNECTED
    assert sat.audio_chunk(3.3, b"\0" * 100, TTS) == []  # stragglers from the old socket
    assert sat.playback_done(3.4, gen) == []  # the speaker's late report: nothing to send


def test_second_audio_start_interrupts_the_reply() -> None:
    sat = running()
    sat.trigger(1.0)
    sat.endpoint(2.0)
    sat.audio_start(3.0, TTS)
    sat.audio_chunk(3.1, b"a" * 100, TTS)
    first = sat.generation
    other = AudioFormat(16000, 2, 1)
    assert sat.audio_start(3.2, other) == [StopPlayback(first), StartPlayback(first + 1, other)]
    assert sat.phase is Phase.RESPONDING
    assert sat.playback_done(3.3, first) == []  # the interrupted one never reports played
    sat.audio_chunk(3.4, b"b" * 100, other)
    assert sat.audio_stop(3.5) == [FinishPlayback(first + 1)]
    assert sat.playback_done(3.6, first + 1) == [SendPlayed(), ResetDetector()]


def test_interrupt_as_home_assistant_sends_it_stop_then_start() -> None:
    """HA's interrupt_playback() writes audio-stop, then a fresh audio-start."""
    sat = running()
    sat.trigger(1.0)
    sat.endpoint(2.0)
    sat.audio_start(3.0, TTS)
    sat.audio_chunk(3.1, b"a" * 100, TTS)
    assert sat.audio_stop(3.2) == [FinishPlayback(1)]
    assert sat.audio_start(3.3, TTS) == [StopPlayback(1), StartPlayback(2, TTS)]
    assert sat.playback_done(3.4, 1) == []
    sat.audio_chunk(3.5, b"b" * 100, TTS)
    sat.audio_stop(3.6)
    assert sat.playback_done(3.7, 2) == [SendPlayed(), ResetDetector()]
    assert sat.phase is Phase.LISTENING


def test_chunks_after_audio_stop_are_dropped_and_chunk_without_start_plays() -> None:
    sat = running()
    assert sat.audio_chunk(1.0, b"x" * 10, TTS) == [
        StartPlayback(1, TTS),
        PlayAudio(1, b"x" * 10, TTS),
    ]
    sat.audio_stop(1.1)
    assert sat.audio_chunk(1.2, b"y" * 10, TTS) == []
    assert sat.audio_stop(1.3) == []


def test_timeouts_never_leave_it_stuck() -> None:
    sat = running()
    sat.trigger(1.0)
    assert sat.tick(1.0 + T.no_speech + 1) == []  # VAD trigger: speech is already under way
    assert sat.tick(1.0 + T.max_stream - 0.1) == []
    assert sat.tick(1.0 + T.max_stream) == [StopStream(send_audio_stop=True), ResetDetector()]
    now = 1.0 + T.max_stream
    sat.progress(now + 10, "synthesize")  # HA alive: the deadline moves
    assert sat.tick(now + T.response + 1) == []
    assert sat.tick(now + 10 + T.response) == [ResetDetector()]
    assert sat.phase is Phase.LISTENING

    # Reply audio that stops arriving, then a speaker that never reports the end.
    sat.audio_start(100.0, TTS)
    sat.audio_chunk(100.0, b"\0" * 44100, TTS)  # one second
    assert sat.tick(100.0 + T.audio_gap) == [FinishPlayback(1)]
    drained = 100.0 + T.audio_gap + 1.0 + T.drain_extra
    assert sat.tick(drained - 0.1) == []
    assert sat.tick(drained) == [StopPlayback(1), SendPlayed(), ResetDetector()]
    assert sat.playback is Playback.IDLE and sat.accepts_trigger


def test_silent_home_assistant_is_dropped_only_after_it_pinged() -> None:
    sat = running()
    assert sat.tick(T.ha_silence + 5) == []  # never pinged: silence proves nothing
    sat.heard(100.0, ping=True)
    sat.trigger(100.5)
    assert sat.tick(100.0 + T.ha_silence - 1) == []
    actions = sat.tick(100.0 + T.ha_silence + 1)
    assert isinstance(actions[0], CloseConnection)
    assert StopStream(send_audio_stop=False) in actions
    assert sat.phase is Phase.DISCONNECTED


def test_remote_wake_streams_continuously_and_reruns() -> None:
    sat = SatelliteMachine(remote_wake=True)
    sat.connect(0.0)
    assert sat.run_satellite(0.0) == [
        ResetDetector(),
        SendRunPipeline("wake", "tts"),
        StartStream(with_prespeech=False),
    ]
    assert sat.streaming and sat.stage == "wake" and not sat.accepts_trigger
    assert sat.trigger(1.0) == [] and sat.endpoint(1.0) == []  # HA's wake word and VAD decide
    assert sat.tick(1000.0) == []  # waiting for a wake word has no deadline
    sat.progress(1000.0, "detection")
    assert sat.transcript(1001.0) == [StopStream(send_audio_stop=False), ResetDetector()]
    sat.audio_start(1002.0, TTS)
    sat.audio_stop(1003.0)
    assert sat.playback_done(1004.0, 1) == [
        SendPlayed(),
        ResetDetector(),
        SendRunPipeline("wake", "tts"),
        StartStream(with_prespeech=False),
    ]
    # An error waits a little before re-running, so a broken pipeline does not spin.
    assert sat.error(1005.0) == [StopStream(send_audio_stop=False), ResetDetector()]
    assert not sat.streaming
    assert sat.tick(1005.0 + T.error_retry - 0.1) == []
    assert sat.tick(1005.0 + T.error_retry)[1:] == [
        SendRunPipeline("wake", "tts"),
        StartStream(with_prespeech=False),
    ]


def test_remote_trigger_runs_a_pipeline() -> None:
    sat = running()
    assert sat.remote_run_pipeline(1.0, "asr", "tts") == [
        SendRunPipeline("asr", "tts"),
        StartStream(with_prespeech=False),
    ]
    assert sat.streaming and sat.stage == "asr"
    assert sat.remote_run_pipeline(1.1, "asr", "tts") == []  # busy
    sat.endpoint(2.0)
    sat.transcript(2.1)
    sat.error(2.2)
    assert sat.remote_run_pipeline(3.0, "tts", "tts", announce_text="Hello") == [
        SendRunPipeline("tts", "tts", announce_text="Hello")
    ]
    assert sat.phase is Phase.WAITING
    sat.audio_start(3.5, TTS)
    sat.audio_stop(3.6)
    assert SendPlayed() in sat.playback_done(3.7, sat.generation)


def test_mic_end_finishes_the_turn_then_exits() -> None:
    sat = running()
    sat.trigger(1.0)
    assert sat.mic_ended(1.5) == [StopStream(send_audio_stop=True), ResetDetector()]
    assert sat.phase is Phase.WAITING and not sat.exited
    sat.transcript(2.0)
    sat.audio_start(3.0, TTS)
    sat.audio_stop(3.1)
    assert sat.playback_done(3.2, 1) == [SendPlayed(), ResetDetector(), Exit(0)]
    assert sat.tick(10.0) == []  # exits once


def test_mic_end_when_idle_or_disconnected_exits_at_once() -> None:
    assert SatelliteMachine().mic_ended(0.0) == [Exit(0)]
    assert running().mic_ended(0.0) == [Exit(0)]
    sat = running()
    sat.trigger(1.0)
    sat.mic_ended(1.1)
    assert sat.disconnect(1.2)[-1] == Exit(0)  # HA left mid-turn: nothing left to finish
    remote = running(remote_wake=True)
    assert remote.mic_ended(1.0) == [StopStream(send_audio_stop=True), Exit(0)]


def test_sounds_play_only_when_configured_and_replies_cut_them() -> None:
    assert running().transcript(0.0) == []
    sat = running(sounds=frozenset({"done", "timer"}))
    sat.trigger(1.0)
    assert sat.transcript(2.0) == [StopStream(False), ResetDetector(), PlaySound(1, "done")]
    assert not sat.accepts_trigger
    assert sat.audio_start(2.5, TTS) == [StopPlayback(1), StartPlayback(2, TTS)]
    assert sat.playback_done(2.6, 1) == []
    sat.audio_stop(2.7)
    assert sat.playback_done(2.8, 2) == [SendPlayed(), ResetDetector()]
    assert sat.sound(3.0, "timer") == [PlaySound(3, "timer")]
    assert sat.sound(3.1, "timer") == []  # one at a time
    assert sat.playback_done(3.2, 3) == [ResetDetector()]  # a local sound is not `played`
    assert sat.sound(3.3, "awake") == []  # not configured


# ---- property: whatever arrives (or gets lost), the machine comes back --------------------

EVENTS = st.sampled_from(
    [
        "connect", "disconnect", "run", "pause", "trigger", "wake", "endpoint", "transcript",
        "error", "progress", "audio_start", "audio_chunk", "audio_stop", "done", "done_old",
        "sound", "remote_asr", "remote_tts", "ping", "speech", "barge", "barge_wake",
        "timer", "stop_word", "synthesize", "follow_join", "follow_audio", "follow_text",
        "follow_done",
    ]
)  # fmt: skip


def _apply(sat: SatelliteMachine, event: str, now: float) -> list:
    if event == "connect":
        return sat.connect(now)
    if event == "disconnect":
        return sat.disconnect(now)
    if event == "run":
        return sat.run_satellite(now)
    if event == "pause":
        return sat.pause_satellite(now)
    if event == "trigger":
        return sat.trigger(now)
    if event == "wake":
        return sat.trigger(now, "okay_nabu")
    if event == "endpoint":
        return sat.endpoint(now)
    if event == "transcript":
        return sat.transcript(now)
    if event == "error":
        return sat.error(now)
    if event == "progress":
        return sat.progress(now, "voice-started")
    if event == "audio_start":
        return sat.audio_start(now, TTS)
    if event == "audio_chunk":
        return sat.audio_chunk(now, b"\0" * 2048, TTS)
    if event == "audio_stop":
        return sat.audio_stop(now)
    if event == "done":
        return sat.playback_done(now, sat.generation)
    if event == "done_old":
        return sat.playback_done(now, sat.generation - 1)
    if event == "sound":
        return sat.sound(now, "timer")
    if event == "remote_asr":
        return sat.remote_run_pipeline(now, "asr", "tts")
    if event == "speech":
        return sat.speech_started(now)
    if event == "remote_tts":
        return sat.remote_run_pipeline(now, "tts", "tts", "hi")
    if event == "barge":
        return sat.barge_in(now)
    if event == "barge_wake":
        return sat.barge_in(now, "okay_nabu")
    if event == "timer":
        return sat.timer_finished(now)
    if event == "stop_word":
        return sat.transcript(now, "Stop.")
    if event == "synthesize":
        return sat.progress(now, "synthesize", "hello")
    if event == "follow_join":
        return sat.follow_joined(now)
    if event == "follow_audio":
        return sat.follow_audio(now, b"\0" * 100, TTS)
    if event == "follow_text":
        return sat.follow_text(now, "hello")
    if event == "follow_done":
        return sat.follow_done(now)
    sat.heard(now, ping=True)
    return []


class _Io:
    """What the I/O layer would be doing, checked against the machine's own view."""

    def __init__(self) -> None:
        self.streaming = False
        self.playing: set[int] = set()
        self.finishing: set[int] = set()  # told to play out (a sound, a finished reply)

    def run(self, sat: SatelliteMachine, actions: list) -> None:
        for action in actions:
            if isinstance(action, StartStream):
                assert not self.streaming
                self.streaming = True
            elif isinstance(action, StopStream):
                assert self.streaming
                self.streaming = False
            elif isinstance(action, StartPlayback | PlaySound):
                assert not self.playing, "a new playback must stop the old one first"
                self.playing.add(action.generation)
                if isinstance(action, PlaySound):
                    self.finishing.add(action.generation)
            elif isinstance(action, StopPlayback):
                self.playing.discard(action.generation)
            elif isinstance(action, PlayAudio | FinishPlayback):
                assert action.generation in self.playing
                if isinstance(action, FinishPlayback):
                    self.finishing.add(action.generation)
            elif isinstance(action, SendPlayed):
                assert sat.connected
        assert self.streaming == sat.streaming
        if sat.playback is Playback.IDLE:
            self.playing.clear()  # the speaker finished (or was told to stop)


@settings(max_examples=400, deadline=None)
@given(events=st.lists(EVENTS, max_size=40), remote_wake=st.booleans())
@example(events=["connect", "audio_start", "audio_stop", "timer", "done"], remote_wake=False)
@example(events=["connect", "audio_start", "done"], remote_wake=False)
def test_any_event_sequence_returns_to_rest(events: list[str], remote_wake: bool) -> None:
    sat = SatelliteMachine(remote_wake=remote_wake, sounds=frozenset({"done", "timer", "awake"}))
    io = _Io()
    now = 0.0
    for event in events:
        now += 0.1
        if event == "done" and sat.generation in io.finishing:
            io.playing.discard(sat.generation)  # the I/O layer's speaker is free when it says so
        io.run(sat, _apply(sat, event, now) + sat.tick(now))
    # Then nothing more arrives: the deadlines bring it back to rest.
    for step in range(1, 6):
        io.run(sat, sat.tick(now + step * 100.0))
    for step in range(1, 3):  # a ringing timer is bounded too, and ends idle
        io.run(sat, sat.tick(now + step * T.ring_max + 600.0))
        io.run(sat, sat.tick(now + step * T.ring_max + 700.0))
    assert not sat.ringing and not sat.following
    assert sat.playback is Playback.IDLE
    resting = {Phase.DISCONNECTED, Phase.PAUSED, Phase.LISTENING}
    if remote_wake:
        assert sat.phase in resting or (sat.phase is Phase.STREAMING and sat.stage == "wake")
    else:
        assert sat.phase in resting


def test_in_turn_follows_the_conversation_not_the_connection() -> None:
    sat = running()
    assert not sat.in_turn
    sat.trigger(1.0)
    assert sat.in_turn
    sat.endpoint(2.0)
    assert sat.in_turn  # waiting for HA
    sat.audio_start(3.0, TTS)
    sat.audio_stop(3.1)
    assert sat.in_turn  # the reply is playing
    sat.playback_done(3.2, sat.generation)
    assert not sat.in_turn
    remote = running(remote_wake=True)
    assert remote.streaming and not remote.in_turn  # streaming for a wake word is not a turn
    remote.progress(1.0, "detection")
    assert remote.in_turn


def test_remote_trigger_during_remote_wake_ends_the_idle_wake_run_first() -> None:
    sat = running(remote_wake=True)
    assert sat.remote_run_pipeline(1.0, "asr", "tts") == [
        StopStream(send_audio_stop=True),
        SendRunPipeline("asr", "tts"),
        StartStream(with_prespeech=False),
    ]
    assert sat.stage == "asr"
    # But not while HA is already hearing a command.
    sat.transcript(2.0)
    sat.error(2.1)
    sat.tick(2.1 + T.error_retry)
    sat.progress(3.0, "detection")
    assert sat.remote_run_pipeline(3.1, "asr", "tts") == []


def test_reply_chunks_in_another_format_are_dropped() -> None:
    sat = running()
    sat.audio_start(1.0, TTS)
    other = AudioFormat(16000, 2, 1)
    assert sat.audio_chunk(1.1, b"\0" * 100, other) == []  # not played at the wrong rate
    assert sat.audio_chunk(1.2, b"\0" * 100, None) == [PlayAudio(1, b"\0" * 100, TTS)]


def test_a_reply_is_capped_in_bytes(monkeypatch) -> None:
    """HA has no back-pressure: a peer that never ends a reply cannot fill our memory."""
    monkeypatch.setattr(state, "MAX_REPLY_BYTES", 1000)
    sat = running()
    sat.audio_start(1.0, TTS)
    assert sat.audio_chunk(1.1, b"\0" * 600, TTS) == [PlayAudio(1, b"\0" * 600, TTS)]
    assert sat.audio_chunk(1.2, b"\0" * 600, TTS) == []
    assert sat.audio_chunk(1.3, b"\0" * 10, TTS) == []
    assert sat.audio_stop(1.4) == [FinishPlayback(1)]  # the reply still ends normally
    assert sat.playback_done(1.5, 1) == [SendPlayed(), ResetDetector()]


# ---- barge-in, the stop word, the ringing timer, the keepalive ----------------------------


def replying(**kwargs) -> SatelliteMachine:
    """A run whose reply is playing; HA's pipeline already sent `synthesize` (it is over)."""
    sat = running(**kwargs)
    sat.trigger(1.0)
    sat.endpoint(2.0)
    sat.transcript(2.5, "tell me a story")
    sat.progress(2.6, "synthesize")
    sat.audio_start(3.0, TTS)
    sat.audio_chunk(3.1, b"\0" * 2048, TTS)
    return sat


def test_speech_over_a_reply_stops_it_and_starts_the_next_run_with_that_speech() -> None:
    sat = replying()
    assert sat.accepts_barge_in and not sat.accepts_trigger
    assert sat.barge_in(4.0) == [
        StopPlayback(1),
        SendPlayed(),  # its playback is over: HA leaves "responding" before the new run
        SendRunPipeline("asr", "tts"),
        StartStream(with_prespeech=True),  # the endpointer's utterance goes on: no reset
    ]
    assert sat.streaming and sat.playback is Playback.IDLE and not sat.accepts_barge_in
    # The rest of the old reply (HA sends it unpaced) is dropped, never played.
    assert sat.audio_chunk(4.1, b"\1" * 2048, TTS) == []
    assert sat.audio_stop(4.2) == []
    assert sat.streaming
    assert sat.endpoint(5.0) == [StopStream(send_audio_stop=True), ResetDetector()]
    assert sat.audio_start(6.0, TTS) == [StartPlayback(2, TTS)]  # the new reply plays
    assert sat.audio_chunk(6.1, b"\2" * 10, TTS) == [PlayAudio(2, b"\2" * 10, TTS)]


def test_barge_in_after_the_reply_was_all_received_drops_nothing_later() -> None:
    sat = replying()
    sat.audio_stop(3.2)  # all of it is here; the speaker is draining
    assert sat.barge_in(4.0)[:2] == [StopPlayback(1), SendPlayed()]
    assert sat.playback_done(4.1, 1) == []  # the stopped drain reports late: nothing
    sat.endpoint(5.0)
    assert sat.audio_start(6.0, TTS) == [StartPlayback(2, TTS)]


def test_the_wake_word_barges_in_when_one_is_configured() -> None:
    sat = replying()
    assert sat.barge_in(4.0, "okay_nabu") == [
        StopPlayback(1),
        SendPlayed(),
        SendDetection("okay_nabu"),
        SendRunPipeline("asr", "tts", wake_word_name="okay_nabu"),
        StartStream(with_prespeech=False),
        ResetDetector(),
    ]


def test_no_barge_in_when_off_with_remote_wake_or_over_our_own_sounds() -> None:
    assert not replying(barge_in=False).accepts_barge_in
    assert replying(barge_in=False).barge_in(4.0) == []
    remote = running(remote_wake=True)
    remote.audio_start(1.0, TTS)
    assert not remote.accepts_barge_in
    sat = running(sounds=frozenset({"done"}))
    sat.trigger(1.0)
    sat.transcript(2.0)  # the done sound plays
    assert sat.playback is not Playback.IDLE and not sat.accepts_barge_in


def test_barge_in_over_an_announcement() -> None:
    sat = running()
    sat.audio_start(1.0, TTS)
    sat.audio_chunk(1.1, b"\0" * 2048, TTS)
    assert sat.accepts_barge_in
    assert sat.barge_in(2.0) == [
        StopPlayback(1),
        SendPlayed(),  # HA's announce() is waiting for it
        SendRunPipeline("asr", "tts"),
        StartStream(with_prespeech=True),
    ]


def test_barge_in_holds_the_run_while_home_assistant_may_still_be_running_the_last() -> None:
    """A streaming agent: audio before `synthesize`. A run-pipeline now would make HA cancel
    the open run, whose end marks the satellite idle, and HA would drop the new audio."""
    sat = running()
    sat.trigger(1.0)
    sat.endpoint(2.0)
    sat.audio_start(3.0, TTS)
    sat.audio_chunk(3.1, b"\0" * 2048, TTS)
    assert sat.barge_in(4.0) == [StopPlayback(1), SendPlayed()]
    assert sat.holding and not sat.streaming and sat.in_turn
    assert sat.audio_chunk(4.1, b"\0" * 2048, TTS) == []  # still the old reply
    assert sat.progress(4.5, "synthesize") == [
        SendRunPipeline("asr", "tts"),
        StartStream(with_prespeech=True),  # with what the mic heard meanwhile
    ]
    assert sat.streaming
    # An utterance that ended while held goes up whole, with its audio-stop.
    sat = running()
    sat.trigger(1.0)
    sat.endpoint(2.0)
    sat.audio_start(3.0, TTS)
    sat.barge_in(4.0)
    assert sat.endpoint(4.6) == []
    assert sat.tick(4.0 + T.hold - 0.1) == []
    assert sat.tick(4.0 + T.hold) == [
        SendRunPipeline("asr", "tts"),
        StartStream(with_prespeech=True),
        StopStream(send_audio_stop=True),
        ResetDetector(),
    ]
    assert sat.phase is Phase.WAITING


def test_a_stop_word_drops_the_reply_of_its_run() -> None:
    sat = replying()
    sat.barge_in(4.0)
    assert sat.transcript(4.5, "Stop.") == [StopStream(send_audio_stop=False), ResetDetector()]
    assert sat.audio_start(5.0, TTS) == [ResetDetector()]  # HA's "sorry…": not played
    assert sat.phase is Phase.LISTENING and sat.accepts_trigger
    assert sat.audio_chunk(5.1, b"\0" * 2048, TTS) == []
    assert sat.audio_stop(5.2) == [SendPlayed()]  # HA's turn ends now, not on its timer
    assert sat.audio_start(6.0, TTS) == [StartPlayback(2, TTS)]  # the next one plays


def test_stop_words() -> None:
    for text in ("stop", "Stop.", "Okay, stop!", "stop please", "Never mind.", "That's enough"):
        assert is_stop(text), text
    for text in ("stop the music in the kitchen", "don't stop", "", None, "what time is it"):
        assert not is_stop(text), text


def test_a_finished_timer_rings_until_stopped_and_bounded() -> None:
    sat = running(sounds=frozenset({"timer"}))
    assert sat.timer_finished(1.0) == [PlaySound(1, "timer")]
    assert sat.ringing and sat.accepts_barge_in
    assert sat.playback_done(1.9, 1) == [ResetDetector()]
    assert sat.tick(2.8) == []  # the pause between two rings
    assert sat.tick(2.9) == [PlaySound(2, "timer")]
    sat.playback_done(3.8, 2)
    # Speech stops it (and starts a run: "stop" then drops that run's reply).
    assert sat.barge_in(4.0) == [SendRunPipeline("asr", "tts"), StartStream(True)]
    assert not sat.ringing
    assert sat.tick(100.0) == [StopStream(send_audio_stop=True), ResetDetector()]  # max stream
    sat.error(101.0)
    assert sat.tick(110.0) == []  # no more rings
    # Unstopped, it rings for ring_max at most.
    sat = running(sounds=frozenset({"timer"}))
    sat.timer_finished(0.0)
    now, rings = 0.0, 1
    while now < T.ring_max + 10:
        now += 0.5
        for action in sat.tick(now):
            rings += isinstance(action, PlaySound)
        if sat.playback is not Playback.IDLE:
            sat.playback_done(now, sat.generation)
    assert not sat.ringing and T.ring_max / 2 <= rings <= T.ring_max


def test_a_timer_rings_a_set_number_of_times() -> None:
    sat = running(sounds=frozenset({"timer"}), ring_repeat=2, ring_delay=0.5)
    sat.timer_finished(0.0)
    sat.playback_done(1.0, 1)
    assert sat.tick(1.5) == [PlaySound(2, "timer")]
    sat.playback_done(2.5, 2)
    assert sat.tick(3.0) == [] and not sat.ringing


def test_a_reply_is_not_cut_by_a_timer_and_an_announcement_does_not_end_the_ringing() -> None:
    sat = replying(sounds=frozenset({"timer"}))
    assert sat.timer_finished(3.5) == []  # the reply goes on
    sat.audio_stop(3.6)
    assert sat.playback_done(4.0, 1) == [SendPlayed(), ResetDetector()]
    assert sat.tick(4.1) == [PlaySound(2, "timer")]  # then it rings
    # An announcement interrupts this ring, plays, and the ringing goes on after it.
    assert sat.audio_start(4.5, TTS) == [StopPlayback(2), StartPlayback(3, TTS)]
    sat.audio_stop(4.6)
    sat.playback_done(5.0, 3)
    assert sat.ringing
    assert sat.tick(5.1) == [PlaySound(4, "timer")]


def test_our_own_pings_keep_home_assistant_from_timing_out() -> None:
    sat = running()
    assert sat.tick(5.0) == []  # a peer that never pinged is not HA: nothing to keep alive
    sat.heard(5.0, ping=True)
    assert sat.tick(5.1) == [SendPing()]
    assert sat.tick(5.1 + T.keepalive / 2) == []
    assert sat.tick(5.1 + T.keepalive) == [SendPing()]
    sat.trigger(6.2)
    assert sat.tick(7.5) == []  # mic audio streams: that is sign of life enough
    sat.endpoint(7.6)
    assert sat.tick(7.7) == [SendPing()]  # waiting, and during the reply
    sat.pause_satellite(8.0)
    assert sat.tick(10.0) == []  # muted: HA reads nothing from us then


# ---- follow (--server): our server's streamed reply, HA's copy dropped ---------------------

PIPER = AudioFormat(22050, 2, 1)


def waiting() -> SatelliteMachine:
    sat = running()
    sat.trigger(1.0)
    sat.endpoint(2.0)
    sat.transcript(2.1, "tell me a story")
    return sat


def test_a_followed_reply_plays_as_it_comes_and_home_assistants_copy_is_dropped() -> None:
    sat = waiting()
    assert sat.follow_joined(2.2) == [] and sat.following
    assert sat.follow_audio(2.5, b"a" * 100, PIPER) == [
        StartPlayback(1, PIPER),
        PlayAudio(1, b"a" * 100, PIPER),
    ]
    assert sat.phase is Phase.RESPONDING and sat.accepts_barge_in
    assert sat.follow_audio(2.6, b"b" * 100, PIPER) == [PlayAudio(1, b"b" * 100, PIPER)]
    assert sat.follow_text(3.0, "Once upon a time.") == []
    assert sat.progress(3.1, "synthesize", "Once upon a time.") == []  # HA: the same words
    # HA's audio of it arrives while ours still plays: dropped, ours goes on.
    assert sat.audio_start(3.5, TTS) == []
    assert sat.audio_chunk(3.6, b"\0" * 2048, TTS) == []
    assert sat.follow_done(3.7) == [FinishPlayback(1)]
    assert sat.audio_stop(3.8) == []
    assert sat.playback_done(4.0, 1) == [SendPlayed(), ResetDetector()]
    assert sat.phase is Phase.LISTENING and not sat.following
    assert sat.audio_start(5.0, TTS) == [StartPlayback(2, TTS)]  # an announcement plays


def test_home_assistants_copy_after_ours_ended_is_still_dropped() -> None:
    sat = waiting()
    sat.follow_joined(2.2)
    sat.follow_audio(2.5, b"a" * 100, PIPER)
    sat.follow_text(2.6, "Hi.")
    sat.follow_done(2.7)
    sat.playback_done(2.8, 1)
    sat.progress(3.0, "synthesize", "Hi.")
    assert sat.audio_start(3.5, TTS) == [] and sat.audio_chunk(3.6, b"\0" * 8, TTS) == []
    assert sat.audio_stop(3.7) == []
    assert sat.audio_start(4.0, TTS) == [StartPlayback(2, TTS)]  # the next one is HA's own


def test_home_assistant_speaking_other_words_wins_over_the_followed_reply() -> None:
    sat = waiting()
    sat.follow_joined(2.2)
    sat.follow_audio(2.5, b"a" * 100, PIPER)
    sat.follow_text(2.6, "Once upon a time.")
    sat.progress(2.7, "synthesize", "Turned on the kitchen lights.")
    assert sat.audio_start(3.0, TTS) == [
        StopFollow(),
        StopPlayback(1),
        StartPlayback(2, TTS),
    ]
    assert sat.audio_chunk(3.1, b"x" * 10, TTS) == [PlayAudio(2, b"x" * 10, TTS)]


def test_followed_audio_that_never_came_leaves_home_assistants_to_play() -> None:
    sat = waiting()
    sat.follow_joined(2.2)
    assert sat.audio_start(3.0, TTS) == [StopFollow(), StartPlayback(1, TTS)]  # HA first
    assert sat.follow_audio(3.1, b"a" * 10, PIPER) == []
    sat = waiting()
    sat.follow_joined(2.2)
    assert sat.follow_done(2.5) == []  # TTS failed: nothing of ours
    assert sat.audio_start(3.0, TTS) == [StartPlayback(1, TTS)]


def test_barge_in_over_a_followed_reply_stops_it_and_drops_home_assistants_copy() -> None:
    sat = waiting()
    sat.follow_joined(2.2)
    sat.follow_audio(2.5, b"a" * 100, PIPER)
    sat.follow_text(2.6, "Once upon a time.")
    sat.progress(2.7, "synthesize", "Once upon a time.")
    assert sat.barge_in(3.0) == [
        StopPlayback(1),
        StopFollow(),
        SendPlayed(),
        SendRunPipeline("asr", "tts"),
        StartStream(with_prespeech=True),
    ]
    assert sat.audio_start(3.2, TTS) == [] and sat.streaming  # HA's copy: not the new run's
    assert sat.audio_stop(3.3) == []
    sat.endpoint(4.0)
    assert sat.audio_start(5.0, TTS) == [StartPlayback(2, TTS)]


def test_no_follow_outside_a_run_or_after_a_stop_word() -> None:
    sat = running()
    assert sat.follow_joined(1.0) == [] and not sat.following  # no run
    sat = waiting()
    sat.transcript(2.15, "stop")
    sat = running()
    sat.trigger(1.0)
    sat.transcript(1.5, "Stop.")
    assert sat.follow_joined(1.6) == [] and not sat.following


def test_the_last_runs_synthesize_does_not_drop_this_runs_followed_reply() -> None:
    """Our `handled` comes before HA's `synthesize` of the same reply: the words HA spoke in
    the run before are no mismatch (session 9: the second turn of a connection was cut)."""
    sat = waiting()
    sat.follow_joined(2.2)
    sat.follow_audio(2.5, b"a" * 100, PIPER)
    sat.follow_text(2.6, "Hi.")
    sat.progress(2.7, "synthesize", "Hi.")
    sat.follow_done(2.8)
    sat.playback_done(3.0, 1)
    sat.audio_start(3.1, TTS), sat.audio_stop(3.2)  # HA's copy, dropped
    sat.trigger(5.0)
    sat.endpoint(6.0)
    sat.transcript(6.1, "tell me more")
    sat.follow_joined(6.2)
    sat.follow_audio(6.5, b"b" * 100, PIPER)
    assert sat.follow_text(6.6, "Once upon a time. The end.") == []  # nothing stops
    assert sat.playback is not Playback.IDLE and sat.following
    assert sat.progress(6.7, "synthesize", "Once upon a time. The end.") == []
    assert sat.audio_start(7.0, TTS) == []  # HA's copy of this one: dropped
