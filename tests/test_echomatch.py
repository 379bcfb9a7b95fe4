"""Whether the canceller's output is the reply's own echo (audio/echomatch.py): the echo's
delay found from the microphone, and the output matched against the reference there."""

from __future__ import annotations

import wave

import numpy as np
import pytest

from pivoice_lab.room.acoustics import EchoPath, NoiseFloor, RoomAcoustics
from tests.helpers import make_speech
from wyoming_pivoice.audio.echomatch import FRAME, EchoMatch

RATE = 16000
ROOM = RoomAcoustics(-6, 150, RoomAcoustics.tail_for_rt60(0.7), seed=1, highpass_hz=200,
                     clip_db=6, drift_ppm=100)  # fmt: skip


def _speech(text: str, path, voice: str = "en-us") -> np.ndarray:
    made = make_speech(text, path, voice=voice, pad_before=0.0, pad_after=0.0)
    with wave.open(str(made)) as w:
        pcm = w.readframes(w.getnframes())
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """A reply through the room (the echo), and a user's voice at the echo's level."""
    folder = tmp_path_factory.mktemp("match")
    reply = _speech(
        "Here is a joke about cats. Why did the cat sit on the computer? To keep an eye on "
        "the mouse. And then it went to sleep on the keyboard.", folder / "reply.wav",
    )  # fmt: skip
    voice = _speech("Turn off the kitchen lights please.", folder / "u.wav", voice="en-us+f3")
    echo = EchoPath(ROOM).process(reply.astype(np.float32)).astype(np.float64)[: len(reply)]
    echo += NoiseFloor(ROOM.noise_dbfs, 1).block(len(echo))
    user = np.zeros(len(reply))
    user[RATE * 3 : RATE * 3 + len(voice)] = voice[: len(reply) - RATE * 3]
    active = np.abs(echo) > 1e-3
    user *= np.sqrt(np.mean(echo[active] ** 2) / np.mean(voice**2))  # at the echo's level
    return reply, echo, user


def _matches(ref: np.ndarray, mic: np.ndarray, out: np.ndarray) -> tuple[EchoMatch, list]:
    """Frame by frame as the canceller feeds it; the match every 32 ms with its time."""
    match, seen = EchoMatch(), []
    for i in range(0, len(ref) - FRAME + 1, FRAME):
        s = slice(i, i + FRAME)
        match.frame(mic[s], ref[s], out[s], bool(np.any(np.abs(ref[s]) > 1e-3)))
        if (i // FRAME) % 3 == 2:
            seen.append(((i + FRAME) / RATE, match.match()))
    return match, seen


def test_the_echos_delay_is_found_under_its_tail_and_drift(scene) -> None:
    reply, echo, _ = scene
    match, _ = _matches(reply, echo, echo)
    assert match.delay is not None
    assert abs(match.delay / RATE * 1000 - ROOM.delay_ms) <= 3


def test_the_echo_let_through_matches_and_a_voice_does_not(scene) -> None:
    reply, echo, user = scene
    _, lapse = _matches(reply, echo, echo)  # the canceller took nothing off
    found = [m for _, m in lapse if m is not None]
    assert len(found) > 0.5 * len(lapse)
    assert np.median(found) >= 0.6
    # The canceller took the echo off and the user's voice passed: it matches nothing.
    _, voice = _matches(reply, echo + user, user + 1e-4 * echo)
    in_voice = [m for t, m in voice if 3.3 <= t <= 3.0 + 1.5 and m is not None]
    assert in_voice and max(in_voice) < 0.3


def test_a_microphone_that_hears_no_echo_has_no_delay_and_no_match(scene) -> None:
    reply, _, user = scene
    match, seen = _matches(reply, user, user)  # a headset: the mic hears the user alone
    assert match.delay is None
    assert all(m is None for _, m in seen)
