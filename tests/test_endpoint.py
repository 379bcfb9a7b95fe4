"""Endpointing: the state machine on recorded Silero probabilities, and Silero on real speech."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from wyoming_pivoice.audio.format import CHUNK_BYTES
from wyoming_pivoice.audio.mic import read_wav_16k
from wyoming_pivoice.satellite.endpoint import Endpointer, EndpointKind, EndpointLogic, Hearing
from wyoming_pivoice.satellite.settings import VadSettings
from wyoming_pivoice.satellite.turn_policy import Evidence

from .helpers import make_speech

FRAME = 0.032

# Silero's probabilities for "Turn on the kitchen lights please." (espeak-ng, 0.3 s before,
# 1 s after), one per 32 ms frame, as recorded from engines.vad.SileroVad.
# fmt: off
KITCHEN = [
    0.01, 0.02, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.4, 0.95, 1.0, 1.0, 1.0,
    1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.16, 0.87, 0.89, 1.0, 1.0, 1.0, 1.0, 0.18,
    0.32, 0.11, 0.99, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.21, 0.75, 0.86, 0.52,
    0.73, 0.69, 0.71, 0.92, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
    1.0, 0.84, 0.63, 0.16, 0.04, 0.02, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01,
    0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02,
    0.02, 0.02, 0.02, 0.02, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01,
]
# fmt: on


def frame(index: int) -> bytes:
    """A distinct fake frame, so tests can tell which frames an event's audio holds."""
    return index.to_bytes(4, "little") * (CHUNK_BYTES // 4)


def frames_in(audio: bytes) -> list[int]:
    return [int.from_bytes(audio[i : i + 4], "little") for i in range(0, len(audio), CHUNK_BYTES)]


def run(logic: EndpointLogic, probabilities: list[float]):
    events = []
    for index, prob in enumerate(probabilities):
        events += [(index, e) for e in logic.process(prob, frame(index), index * FRAME)]
    return events


def test_recorded_utterance_gives_start_speculation_and_endpoint() -> None:
    settings = VadSettings(
        silence_ms=300, prespeech_ms=300, min_speech_ms=150, speculate_ms=150, pad_ms=100
    )
    events = run(EndpointLogic(settings), KITCHEN)
    kinds = [e.kind for _, e in events]
    assert kinds == [EndpointKind.SPEECH_STARTED, EndpointKind.SPECULATE, EndpointKind.ENDPOINT]

    (i_start, started), (i_spec, spec), (i_end, end) = events
    first_voiced = KITCHEN.index(0.95)  # 0.4 is below the 0.5 threshold
    assert started.speech_start == pytest.approx(first_voiced * FRAME)
    # min_speech 150 ms → the 5th voiced frame confirms the start
    assert i_start == first_voiced + 4
    # the last frame at or above the 0.35 hysteresis level is the last voiced one
    last_voiced = max(i for i, p in enumerate(KITCHEN) if p >= 0.35)
    assert end.last_voiced == pytest.approx(last_voiced * FRAME)
    # endpoint exactly when 300 ms of silence have passed: ceil(300 / 32) = 10 frames
    assert i_end == last_voiced + 10
    assert end.time - end.last_voiced == pytest.approx(10 * FRAME)
    assert 0 <= (end.time - end.last_voiced) - 0.300 < FRAME
    assert i_spec == last_voiced + 5  # ceil(150 / 32)

    # pre-speech (300 ms → 10 frames) + speech + 100 ms pad (4 frames); speculation sends the same
    expected = list(range(first_voiced - 10, last_voiced + 1 + 4))
    assert frames_in(end.audio) == expected
    assert spec.audio == end.audio
    assert frames_in(started.audio) == list(range(first_voiced - 10, i_start + 1))


def test_speech_resumed_cancels_speculation_and_keeps_all_audio() -> None:
    settings = VadSettings(
        silence_ms=300, speculate_ms=100, prespeech_ms=0, pad_ms=64, min_speech_ms=64
    )
    probs = [0.0] * 3 + [0.9] * 10 + [0.0] * 6 + [0.9] * 10 + [0.0] * 12
    events = run(EndpointLogic(settings), probs)
    kinds = [e.kind for _, e in events]
    assert kinds == [
        EndpointKind.SPEECH_STARTED,
        EndpointKind.SPECULATE,
        EndpointKind.SPEECH_RESUMED,
        EndpointKind.SPECULATE,
        EndpointKind.ENDPOINT,
    ]
    end = events[-1][1]
    # one utterance: both halves and the pause between them, nothing twice
    assert frames_in(end.audio) == list(range(3, 29 + 2))
    assert events[2][0] == 19  # resumed on the first voiced frame after the pause


def test_blips_shorter_than_min_speech_are_ignored() -> None:
    settings = VadSettings(min_speech_ms=200, silence_ms=300)  # 7 frames
    probs = ([0.0] * 5 + [0.9] * 3 + [0.0] * 15) * 3
    assert run(EndpointLogic(settings), probs) == []
    # …but a long enough one starts speech, and the blip before it is pre-speech
    probs += [0.9] * 8 + [0.0] * 12
    events = run(EndpointLogic(settings), probs)
    assert [e.kind for _, e in events][:1] == [EndpointKind.SPEECH_STARTED]


def test_hysteresis_keeps_speech_going_between_thresholds() -> None:
    settings = VadSettings(threshold=0.5, silence_ms=128, speculate_ms=0, min_speech_ms=32)
    # 0.4 is below the threshold but above threshold - 0.15: speech goes on
    probs = [0.9] * 3 + [0.4] * 20 + [0.0] * 5
    events = run(EndpointLogic(settings), probs)
    assert [e.kind for _, e in events] == [EndpointKind.SPEECH_STARTED, EndpointKind.ENDPOINT]
    assert events[-1][1].last_voiced == pytest.approx(22 * FRAME)


def test_max_speech_forces_an_endpoint_and_flush_ends_the_stream() -> None:
    settings = VadSettings(max_speech_s=1.0, min_speech_ms=32, speculate_ms=0)
    logic = EndpointLogic(settings)
    events = run(logic, [0.9] * 40)
    # cut after 1 s; the speech that goes on is a new utterance
    assert [e.kind for _, e in events] == [
        EndpointKind.SPEECH_STARTED,
        EndpointKind.ENDPOINT,
        EndpointKind.SPEECH_STARTED,
    ]
    assert events[1][1].forced
    assert len(frames_in(events[1][1].audio)) == math.ceil(1000 / 32)

    logic = EndpointLogic(settings)
    run(logic, [0.9] * 5)
    assert logic.in_speech
    (end,) = logic.flush(10.0)
    assert end.kind is EndpointKind.ENDPOINT and end.forced
    assert not logic.in_speech
    assert logic.flush(11.0) == []


def test_speculation_off_or_not_before_the_window() -> None:
    probs = [0.9] * 10 + [0.0] * 12
    for speculate_ms in (0, 300, 500):
        settings = VadSettings(silence_ms=300, speculate_ms=speculate_ms, min_speech_ms=32)
        kinds = [e.kind for _, e in run(EndpointLogic(settings), probs)]
        assert kinds == [EndpointKind.SPEECH_STARTED, EndpointKind.ENDPOINT]


def test_silero_endpointer_on_real_speech(speech_dir: Path) -> None:
    wav = make_speech("Please open the garage door.", speech_dir / "garage.wav", pad_after=1.0)
    pcm = read_wav_16k(wav)
    endpointer = Endpointer(VadSettings(silence_ms=300, speculate_ms=150))
    events = []
    for index in range(len(pcm) // CHUNK_BYTES):
        chunk = pcm[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
        events += endpointer.feed_sync(chunk, index * FRAME)
    endpointer.close()
    kinds = [e.kind for e in events]
    assert kinds == [EndpointKind.SPEECH_STARTED, EndpointKind.SPECULATE, EndpointKind.ENDPOINT]
    end = events[-1]
    assert 0.3 <= end.time - end.last_voiced < 0.3 + FRAME
    # the utterance audio is the speech, not the whole file
    assert 1.0 < end.seconds < len(pcm) / 32000 - 0.5


# Silero on what AEC3 left of a reply's echo at its start (the room bench, −6 dB, 40 ms):
# the first frames leak while AEC3 finds the new reply's delay, and Silero stays high after.
REPLY_START_RESIDUAL = [0.02, 0.94, 0.97, 0.96, 0.99, 0.98, 0.98, 0.99, 0.92, 0.54, 0.1, 0.05]
# …and later in a reply, the residual peaks (Silero 0.53-0.68) under the echo threshold.
RESIDUAL = [0.1, 0.55, 0.66, 0.62, 0.65, 0.68, 0.62, 0.42, 0.22, 0.09, 0.04, 0.02]


def test_what_is_left_of_the_echo_starts_no_speech() -> None:
    logic = EndpointLogic(VadSettings())
    # The leak at a reply's start, measured when each reply opened its own stream: with
    # the canceller's evidence that it is no louder than the echo would leave, no start.
    logic.evidence = Evidence(0.0, True, -6.0, residual_db=-40.0, expected_residual_db=-42.0)
    assert run(logic, REPLY_START_RESIDUAL) == []
    logic.evidence = None
    logic.hearing = Hearing.ECHO
    assert run(logic, RESIDUAL) == []
    # A leak of ~200 ms (AEC3 re-finding the delay after an underrun) is too short to start.
    assert run(logic, [0.1, 0.95, 0.97, 0.99, 0.98, 0.96, 0.93, 0.4, 0.1, 0.05, 0.02]) == []
    # The same residual with nothing playing would be speech: the guard is what stops it.
    logic.hearing = Hearing.CLEAR
    assert [e.kind for _, e in run(logic, RESIDUAL)][:1] == [EndpointKind.SPEECH_STARTED]


def test_the_user_over_a_reply_still_starts_speech() -> None:
    logic = EndpointLogic(VadSettings())
    logic.hearing = Hearing.ECHO
    events = run(logic, KITCHEN)
    assert events[0][1].kind is EndpointKind.SPEECH_STARTED
    assert events[-1][1].kind is EndpointKind.ENDPOINT


def test_an_utterance_under_way_goes_on_when_a_reply_starts() -> None:
    logic = EndpointLogic(VadSettings(speculate_ms=0))
    events = run(logic, KITCHEN[:30])
    assert [e.kind for _, e in events] == [EndpointKind.SPEECH_STARTED]
    logic.hearing = Hearing.ECHO
    for index, prob in enumerate(KITCHEN[30:], start=30):
        events += [(index, e) for e in logic.process(prob, frame(index), index * FRAME)]
    assert events[-1][1].kind is EndpointKind.ENDPOINT


def test_a_dip_over_the_reply_does_not_end_the_utterance() -> None:
    """AEC3's double-talk suppression takes syllables off a voice over a reply: Silero dips
    for 300-500 ms mid-command. Over the echo that dip is no endpoint (echo_silence_ms);
    the same dip with nothing playing is one (silence_ms)."""
    dip = KITCHEN[:36] + [0.05] * 13 + KITCHEN[36:]  # 416 ms under the threshold
    settings = VadSettings(speculate_ms=0)
    over = EndpointLogic(settings)
    over.hearing = Hearing.ECHO
    events = run(over, dip)
    assert [e.kind for _, e in events] == [EndpointKind.SPEECH_STARTED, EndpointKind.ENDPOINT]
    assert len(frames_in(events[-1][1].audio)) > 60  # the whole command, in one utterance
    clear = EndpointLogic(settings)
    kinds = [e.kind for _, e in run(clear, dip)]
    assert kinds[:2] == [EndpointKind.SPEECH_STARTED, EndpointKind.ENDPOINT]
    assert kinds.count(EndpointKind.SPEECH_STARTED) == 2  # the rest: an utterance of its own
    # Over the echo the endpoint waits echo_silence_ms after the last voiced frame.
    last = max(i for i, p in enumerate(dip) if p >= 0.35)
    assert events[-1][0] - last == math.ceil(settings.echo_silence_ms / 32)


def test_a_late_start_over_a_reply_reaches_back_to_where_the_voice_began() -> None:
    """Over a reply the turn policy may count a voice only once it has enough of it (CI's
    under-load room: 640 ms after Silero stood at 0.84 on it); the utterance still holds the
    voice from its first voiced frame, and the pre-roll before that, not 300 ms before the
    decision. With nothing playing a start is where Silero rose, and the pre-roll as before."""
    probabilities = [0.02] * 30 + KITCHEN[11:]  # the voice from frame 30
    # Barely over what the echo alone would leave: the policy leaves it for the echo's…
    unsure = Evidence(0.0, True, -6.0, residual_db=-40.0, expected_residual_db=-42.0)
    # …and 20 frames (640 ms) later it stands well over it.
    voice = Evidence(0.0, True, -6.0, residual_db=-20.0, expected_residual_db=-42.0)
    logic = EndpointLogic(VadSettings(speculate_ms=0))
    events = []
    for index, prob in enumerate(probabilities):
        logic.evidence = unsure if index < 50 else voice
        events += [(index, e) for e in logic.process(prob, frame(index), index * FRAME)]
    (at, started), *_ = events
    assert started.kind is EndpointKind.SPEECH_STARTED and at >= 50
    prespeech = math.ceil(300 / 32)
    assert frames_in(started.audio)[0] == 30 - prespeech
    assert frames_in(events[-1][1].audio)[: prespeech + 1] == list(range(30 - prespeech, 31))
    # Nothing playing: the same voice starts within min_speech of where Silero passed the
    # threshold (frame 31), with the 300 ms pre-roll before that frame.
    clear = run(EndpointLogic(VadSettings(speculate_ms=0)), probabilities)
    assert clear[0][0] <= 36 and frames_in(clear[0][1].audio)[0] == 31 - prespeech
