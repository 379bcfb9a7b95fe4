"""lab room.dumppolicy: a live room's AEC dump run again through the satellite's own canceller,
Silero and fast barge-in."""

from __future__ import annotations

import numpy as np

from pivoice_lab.room.acoustics import EchoPath, NoiseFloor, RoomAcoustics
from pivoice_lab.room.dumppolicy import _live_cut, replay
from tests.helpers import make_speech, read_wav

RATE = 16000


def _speech(tmp_path, text: str, voice: str) -> np.ndarray:
    path = make_speech(text, tmp_path / f"{voice}.wav", voice=voice, pad_before=0.0, pad_after=0.0)
    pcm, *_ = read_wav(path)
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768


def test_a_dump_is_decided_again_the_echo_alone_never_the_user_and_the_voice_over_it(tmp_path):
    """Two replies through a −6 dB/150 ms room with a 0.7 s tail, the user over the second at
    the echo's level + 6 dB: the echo (and its tail after each reply) is never taken for the
    user; the voice over the reply is, soon after its onset."""
    reply = _speech(tmp_path, "The capital city of France is Paris. It lies on the Seine.", "en-us")
    user = _speech(tmp_path, "Stop, turn off the kitchen lights.", "en-us+f3")
    room = RoomAcoustics(-6, 150, RoomAcoustics.tail_for_rt60(0.7), seed=1, highpass_hz=200)
    gap, first = RATE * 2, RATE // 2
    second = first + len(reply) + gap
    total = second + len(reply) + gap
    speaker = np.zeros(total, dtype=np.float32)
    speaker[first : first + len(reply)] = reply
    speaker[second : second + len(reply)] = reply
    echo = EchoPath(room).process(speaker)
    mic = echo + NoiseFloor(room.noise_dbfs, 1).block(total)
    onset = second + RATE
    heard = echo[second : second + len(reply)]
    echo_rms = np.sqrt(np.mean(heard[np.abs(heard) > 1e-3] ** 2))
    user_rms = np.sqrt(np.mean(user[np.abs(user) > 1e-3] ** 2))
    gain = 2 * echo_rms / user_rms  # the echo's active level + 6 dB
    mic[onset : onset + len(user)] += user * gain
    pairs = np.column_stack(
        [np.clip(mic * 32767, -32768, 32767), np.clip(speaker * 32767, -32768, 32767)]
    ).astype(np.int16)
    start = 1000.0
    span = (start + onset / RATE, start + (onset + len(user)) / RATE)
    result = replay(pairs, start, [], [span], [span[0]], "room")
    assert result.chunks == total // 512
    assert result.self_barge_ins == []
    (decided,) = result.decided_after_s
    assert decided is not None and decided <= 0.5


def test_a_decision_counts_only_up_to_where_the_live_satellite_cut_the_reply():
    assert _live_cut([5.0, 12.2], (12.0, 13.0)) == 12.2
    assert _live_cut([5.0], (12.0, 13.0)) == float("inf")
