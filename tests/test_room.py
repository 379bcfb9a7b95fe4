"""The simulated room: its acoustics as numbers, and its speaker/mic commands for real."""

from __future__ import annotations

import asyncio
import time
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


async def _listen_and_speak(room: Room, seconds: float, rate: int):
    """The room's microphone read for `seconds` (a task) and a speaker command at `rate`
    whose stdin the test writes."""
    mic = asyncio.create_task(_read_mic(room.mic_command, seconds))
    assert await room.wait_for(lambda: room.mic_opened is not None, 10)
    speaker = await asyncio.create_subprocess_shell(
        room.speaker_command.format(rate=rate, width=2, channels=1),
        stdin=asyncio.subprocess.PIPE,
    )
    assert speaker.stdin is not None
    return mic, speaker


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


def _lag(ref: np.ndarray, mic: np.ndarray, most: int) -> int:
    """The lag (samples, 0..most) at which `mic` best matches `ref`."""
    n = len(ref)
    spectrum = np.fft.rfft(mic, 2 * n) * np.conj(np.fft.rfft(ref, 2 * n))
    correlation = np.fft.irfft(spectrum, 2 * n)[: most + 1]
    return int(np.argmax(np.abs(correlation)))


async def test_the_room_records_what_its_speaker_played_where_it_played(tmp_path):
    """`source`: what the speaker command handed over, placed by hand at the samples it
    played, so the echo lies the room's delay after it — before and after the device ran dry
    in the middle of a reply — and AEC3 fed it offline takes the echo out (the bench's
    offline ERLE, the live figure's yardstick)."""
    from pivoice_lab.bench.room import offline_erle

    wav = make_speech(
        "Here is a joke about cats. Why did the cat sit on the computer? To keep an eye on "
        "the mouse.", tmp_path / "reply.wav", rate=22050, pad_before=0.0, pad_after=0.0,
    )  # fmt: skip
    with wave.open(str(wav)) as w:
        pcm = w.readframes(w.getnframes())
    half = len(pcm) // 4 * 2
    acoustics = RoomAcoustics(
        echo_db=-6, delay_ms=150, tail_ms=RoomAcoustics.tail_for_rt60(0.7), noise_dbfs=-60,
        highpass_hz=200, clip_db=6, drift_ppm=100,
    )  # fmt: skip
    async with Room(acoustics, record=True) as room:
        mic, speaker = await _listen_and_speak(room, 12.0, 22050)
        assert speaker.stdin is not None
        speaker.stdin.write(pcm[:half])
        await speaker.stdin.drain()
        # The command comes late with the rest: its device runs dry, silence in mid-reply.
        assert await room.wait_for(lambda: len(room.underruns) >= 4, 10)
        speaker.stdin.write(pcm[half:])
        speaker.stdin.close()
        await speaker.wait()
        await mic
    [reply] = room.replies
    assert reply.first_sound is not None and reply.ended is not None
    dry = sum(n for _, n in room.underruns)
    assert dry >= 4 * 512 // 2  # ≥ 64 ms of silence the command did not send
    source, echo = room.recording("source"), room.recording("echo")
    start, end = room.mic_index(reply.first_sound) - 512, room.mic_index(reply.ended)
    # The speaker's own delay: its high-pass is a 255-tap linear-phase FIR (127 samples), its
    # clock's resampler a few samples more or less.
    expected = round(0.150 * RATE) + 127
    gap = room.mic_index(room.underruns[0][0])
    lags = [
        _lag(source[a:b], echo[a:b], 2 * expected)
        for a, b in ((start, gap - 512), (gap + dry + 512, end))
    ]
    # The same after the gap, up to the speaker's drift (+100 ppm: the echo comes ~5 samples
    # earlier 3 s on); the gap's silence not placed would move it by all of `dry`.
    assert abs(lags[0] - expected) <= 8 and abs(lags[1] - lags[0]) <= 8, lags
    [erle] = offline_erle(room, [reply])
    assert erle is not None and erle > 15


async def test_the_speaker_plays_nothing_before_its_command_hands_it_over(tmp_path):
    """A device plays a sample no sooner than it is written. The room took each tick's whole
    block from what had come by the tick's end, so audio played up to 32 ms before it was
    handed over: a stream started ahead of the satellite's due times, its lead covered less
    lateness, and every shortfall was silence the reference did not have."""
    tone = (0.3 * np.sin(np.arange(RATE // 2) * 2 * np.pi * 440 / RATE) * 32767).astype("<i2")
    async with Room(RoomAcoustics(noise_dbfs=-90), record=True) as room:
        mic, speaker = await _listen_and_speak(room, 2.0, 16000)
        assert speaker.stdin is not None
        assert await room.wait_for(lambda: bool(room._speakers), 10)  # connected, reading
        tick = room.now
        assert await room.wait_for(lambda: room.now > tick, 1)  # just after a tick
        handed = time.monotonic()
        speaker.stdin.write(tone.tobytes())
        speaker.stdin.close()
        await speaker.wait()
        await mic
    source = room.recording("source")
    first = int(np.flatnonzero(np.abs(source) > 1e-3)[0])
    # Room times are ticks, each its block's end: the recordings' sample at time t lies one
    # block after mic_index(t).
    assert first >= room.mic_index(handed) + 512
    assert room.replies[0].seconds == pytest.approx(0.5, abs=0.04)


def test_the_speaker_holds_back_nothing_of_what_it_is_handed():
    """A speaker's clock and its conversion to the room's rate add no buffer: each 20 ms
    block the satellite writes comes out at once (soxr's high-quality resampler held back up
    to 89 ms, in bursts: the room's device ran dry at every stream's start)."""
    from wyoming.audio import AudioFormat

    from pivoice_lab.room.acoustics import SpeakerPath

    path = SpeakerPath(
        AudioFormat(22050, 2, 1), RoomAcoustics(highpass_hz=200, clip_db=6, drift_ppm=100)
    )
    rng = np.random.default_rng(0)
    handed = played = sourced = 0.0
    for _ in range(100):
        pcm = (rng.normal(0, 0.1, 441) * 32767).astype("<i2").tobytes()
        source, out = path.convert_with_source(pcm)
        handed, played, sourced = (
            handed + 441 / 22050,
            played + len(out) / RATE,
            sourced + len(source) / RATE,
        )
        assert handed - played < 0.002 and handed - sourced < 0.002
