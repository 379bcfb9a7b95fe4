"""The simulated room: its acoustics as numbers, and its speaker/mic commands for real."""

from __future__ import annotations

import asyncio
import wave

import numpy as np
import pytest

from pivoice_lab.room.acoustics import RATE, EchoPath, NoiseFloor, RoomAcoustics
from pivoice_lab.room.simulator import Room, Say
from tests.helpers import make_speech


def _dbfs(x: np.ndarray) -> float:
    return 10 * np.log10(np.mean(np.asarray(x, dtype=np.float64) ** 2) + 1e-20)


def test_impulse_response_has_the_delay_level_and_a_seeded_tail():
    room = RoomAcoustics(echo_db=-10, delay_ms=40, tail_ms=50, seed=3)
    ir = room.impulse_response()
    delay = 40 * RATE // 1000
    assert int(np.flatnonzero(ir)[0]) == delay
    assert ir[delay] == pytest.approx(10 ** (-10 / 20), rel=1e-6)
    tail = ir[delay + 1 :]
    # The tail holds reverb_db (−3 dB) of the direct sound's energy.
    assert 10 * np.log10(np.sum(tail.astype(np.float64) ** 2) / ir[delay] ** 2) == pytest.approx(
        -3, abs=0.01
    )
    # The tail decays: its last tenth holds far less energy than its first.
    tenth = len(tail) // 10
    assert _dbfs(tail[-tenth:]) < _dbfs(tail[:tenth]) - 30
    assert np.array_equal(
        ir, RoomAcoustics(echo_db=-10, delay_ms=40, tail_ms=50, seed=3).impulse_response()
    )
    assert not np.array_equal(
        ir, RoomAcoustics(echo_db=-10, delay_ms=40, tail_ms=50, seed=4).impulse_response()
    )
    assert len(RoomAcoustics(delay_ms=20, tail_ms=0).impulse_response()) == 20 * RATE // 1000 + 1


def test_echo_path_in_blocks_equals_one_convolution():
    room = RoomAcoustics(echo_db=-6, delay_ms=120, tail_ms=80)
    signal = np.random.default_rng(0).normal(0, 0.1, 5 * 512).astype(np.float32)
    path = EchoPath(room)
    blocks = np.concatenate([path.process(signal[i : i + 512]) for i in range(0, len(signal), 512)])
    whole = np.convolve(signal, room.impulse_response())[: len(signal)]
    np.testing.assert_allclose(blocks, whole, atol=1e-5)


def test_noise_floor_level_and_seed():
    noise = NoiseFloor(-60, seed=1).block(RATE)
    assert _dbfs(noise) == pytest.approx(-60, abs=0.5)
    assert np.array_equal(noise, NoiseFloor(-60, seed=1).block(RATE))


async def _read_mic(command: str, seconds: float) -> bytes:
    proc = await asyncio.create_subprocess_shell(command, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        return await proc.stdout.readexactly(round(seconds * RATE) * 2)
    finally:
        proc.kill()
        await proc.wait()


async def test_the_speaker_is_heard_at_the_mic_with_the_echo_level_and_delay(tmp_path):
    wav = make_speech("Here is a joke about cats.", tmp_path / "reply.wav", rate=22050,
                      pad_before=0.0, pad_after=0.2)  # fmt: skip
    with wave.open(str(wav)) as w:
        pcm = w.readframes(w.getnframes())
    acoustics = RoomAcoustics(echo_db=-10, delay_ms=40, tail_ms=0, noise_dbfs=-90)
    async with Room(acoustics, record=True) as room:
        mic = asyncio.create_task(_read_mic(room.mic_command, 3.0))
        assert await room.wait_for(lambda: room.mic_opened is not None, 10)
        speaker = await asyncio.create_subprocess_shell(
            room.speaker_command.format(rate=22050, width=2, channels=1),
            stdin=asyncio.subprocess.PIPE,
        )
        await speaker.communicate(pcm)
        # The speaker command returns once the room has played all of it.
        assert room.replies[0].ended is not None
        assert room.replies[0].seconds == pytest.approx(len(pcm) / 2 / 22050, abs=0.05)
        heard = np.frombuffer(await mic, dtype="<i2").astype(np.float32) / 32768
    echo = room.recording("echo")
    assert _dbfs(echo[echo != 0]) < -20  # something was played back into the room
    # What the mic command delivered is the room's mic signal, sample for sample.
    np.testing.assert_allclose(heard, room.recording("mic")[: len(heard)], atol=2 / 32768)
    # The echo reaches the mic 10 dB down.
    reply_start = room.mic_index(room.replies[0].first_sound)
    seconds = room.replies[0].seconds
    window = heard[reply_start : reply_start + round(seconds * RATE)]
    played = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    assert _dbfs(window) == pytest.approx(_dbfs(played) - 10, abs=2.0)


async def test_scripted_speech_starts_after_the_reply_first_makes_a_sound(tmp_path):
    wav = make_speech("Stop.", tmp_path / "stop.wav", pad_before=0.0, pad_after=0.0)
    with wave.open(str(wav)) as w:
        voice = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
    tone = (0.3 * np.sin(np.arange(RATE) * 2 * np.pi * 440 / RATE) * 32767).astype("<i2")
    say = Say("stop", voice, reply=1, after_ms=300)
    async with Room(RoomAcoustics(noise_dbfs=-90), [say]) as room:
        mic = asyncio.create_task(_read_mic(room.mic_command, 2.0))
        assert await room.wait_for(lambda: room.mic_opened is not None, 10)
        speaker = await asyncio.create_subprocess_shell(
            room.speaker_command.format(rate=16000, width=2, channels=1),
            stdin=asyncio.subprocess.PIPE,
        )
        await speaker.communicate(tone.tobytes())
        await mic
        assert await room.wait_for(room.user_done, 10)
    first_sound = room.replies[0].first_sound
    assert say.onset is not None and first_sound is not None
    assert say.onset - first_sound == pytest.approx(0.3, abs=0.04)  # within one 32 ms tick
