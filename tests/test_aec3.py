"""AEC3 with its own linear filter's output (native/aec3's pivoice_aec3, audio/aec3.py): the
linear output takes a fixed echo out and keeps a voice over it at its own level; the canceller
takes it as its linear source, and goes on with livekit's AEC3 alone where it is not built.
Skipped where the extension is not installed (native/aec3/build.sh builds it)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from wyoming.audio import AudioFormat

from pivoice_lab.room.acoustics import EchoPath, RoomAcoustics
from tests.helpers import make_speech, read_wav
from wyoming_pivoice.audio import CHUNK_SAMPLES, CHUNK_SECONDS, EchoCanceller, StreamingConverter
from wyoming_pivoice.audio.format import RATE
from wyoming_pivoice.satellite import EchoSettings

FRAME = RATE // 100
ROOM = RoomAcoustics(-6, 20, 60)  # one clock, a short tail: a linear filter's case


def _db(x: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(x.astype(np.float64) ** 2) + 1e-9))


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    folder = tmp_path_factory.mktemp("aec3")
    reply = make_speech(
        "Here is a joke about cats. Why did the cat sit on the computer? To keep an eye on the "
        "mouse. And then it fell asleep on the keyboard, and the mouse ran away.",
        folder / "reply.wav", rate=22050, pad_before=0.0, pad_after=0.0,
    )  # fmt: skip
    user = make_speech("Stop, turn off the kitchen lights.", folder / "user.wav",
                       voice="en-us+f3", pad_before=0.0, pad_after=0.0)  # fmt: skip
    pcm, rate = read_wav(reply)[:2]
    user_pcm, user_rate = read_wav(user)[:2]
    far = StreamingConverter(AudioFormat(rate, 2, 1), RATE).convert(pcm)
    voice = StreamingConverter(AudioFormat(user_rate, 2, 1), RATE).convert(user_pcm)
    return far, voice


def test_the_linear_output_takes_the_echo_out_and_keeps_a_voice_over_it(speech):
    pytest.importorskip("pivoice_aec3")
    from wyoming_pivoice.audio.aec3 import Aec3

    far, voice = speech
    far = far[: len(far) // FRAME * FRAME]
    echo = EchoPath(ROOM).process(far)
    onset = len(far) - len(voice) - RATE // 2
    near = echo.copy()
    near[onset : onset + len(voice)] += voice * 10 ** (-6 / 20)  # 6 dB under the reply
    to16 = lambda x: (np.clip(x, -1, 1) * 32767).astype(np.int16)  # noqa: E731
    aec = Aec3(high_pass_filter=False)
    outs, linears = [], []
    for i in range(0, len(far), FRAME):
        out, linear = aec.frame(to16(far[i : i + FRAME]).tobytes(), to16(near[i : i + FRAME]))
        assert linear is not None and len(out) == len(linear) == FRAME
        outs.append(out)
        linears.append(linear)
    out_all, linear_all, mic = np.concatenate(outs), np.concatenate(linears), to16(near)
    settled = slice(onset - RATE, onset)  # echo alone, after the reply's first seconds
    # It cancels (10.7 dB: the tail beyond its 52 ms of filter bounds it, ~12 dB at most here)
    assert _db(mic[settled]) - _db(linear_all[settled]) >= 8
    # Over the voice's first 300 ms the linear output holds it at its level (it adds to
    # what is left of the echo); the statistics are AEC3's own.
    first = slice(onset, onset + RATE * 3 // 10)
    assert _db(linear_all[first]) >= _db(to16(voice[: RATE * 3 // 10] * 10 ** (-6 / 20))) - 1
    assert _db(out_all[settled]) < _db(mic[settled])
    assert aec.statistics()["delay_ms"] is not None


def test_the_canceller_takes_aec3s_linear_output_as_its_linear_filter(speech, monkeypatch):
    pytest.importorskip("pivoice_aec3")
    from wyoming_pivoice.audio import echo as echo_module

    far, _ = speech
    settings = EchoSettings(linear_barge_in=True, linear_filter="aec3")
    canceller = EchoCanceller(settings)
    assert canceller.linear_filter and not canceller.linear  # not measured yet: not offered
    echo = EchoPath(ROOM).process(far)
    fmt = AudioFormat(RATE, 2, 1)
    pcm = (np.clip(far, -1, 1) * 32767).astype("<i2").tobytes()
    canceller.reference(pcm, fmt, 0.0)
    for n in range(len(echo) // CHUNK_SAMPLES):
        chunk = echo[n * CHUNK_SAMPLES : (n + 1) * CHUNK_SAMPLES]
        canceller.process((np.clip(chunk, -1, 1) * 32767).astype("<i2").tobytes(),
                          (n + 1) * CHUNK_SECONDS)  # fmt: skip
        assert canceller.linear_chunk is not None
        assert len(canceller.linear_chunk) == CHUNK_SAMPLES * 2
    # Its ERLE estimate (10.3 dB here: AEC3's 52 ms of filter against this tail) gates it.
    assert canceller.linear_estimate.erle_db >= 6
    monkeypatch.setattr(echo_module, "LINEAR_MIN_ERLE_DB", 0.0)
    assert canceller.linear and canceller.evidence(0.1, 0.8).linear_probability == 0.8


def test_without_the_extension_the_canceller_runs_livekits_aec3_alone(monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_extension(name, *args, **kwargs):
        if name == "pivoice_aec3":
            raise ImportError("No module named 'pivoice_aec3'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_extension)
    caplog.set_level(logging.WARNING)
    canceller = EchoCanceller(EchoSettings(linear_barge_in=True, linear_filter="aec3"))
    assert not canceller.linear_filter and not canceller.linear
    assert "No AEC3 of ours" in caplog.text
    out = canceller.process(bytes(CHUNK_SAMPLES * 2), CHUNK_SECONDS)
    assert len(out) == CHUNK_SAMPLES * 2 and canceller.linear_chunk is None
    ours = EchoCanceller(EchoSettings(canceller="aec3"))  # livekit's in its place
    assert len(ours.process(bytes(CHUNK_SAMPLES * 2), CHUNK_SECONDS)) == CHUNK_SAMPLES * 2


def test_the_config_reaches_aec3s_suppressor(speech):
    """Our binding takes EchoCanceller3Config fields by name: a suppressor told to let
    everything through (its normal tuning's masks far over any echo-to-nearend ratio) leaves
    the residual echo in, where AEC3's defaults take it out; a wrong field is an error."""
    pivoice_aec3 = pytest.importorskip("pivoice_aec3")
    from wyoming_pivoice.audio.aec3 import Aec3

    assert "suppressor.dominant_nearend_detection.trigger_threshold" in pivoice_aec3.CONFIG_FIELDS
    with pytest.raises(ValueError, match="unknown AEC3 config field"):
        Aec3(high_pass_filter=False, config={"suppressor.no_such_field": 1.0})
    with pytest.raises(ValueError, match="valid ranges"):  # Validate would clamp it
        Aec3(high_pass_filter=False, config={"suppressor.normal_tuning.max_inc_factor": -1.0})
    far, _ = speech
    far = far[: len(far) // FRAME * FRAME]
    to16 = lambda x: (np.clip(x, -1, 1) * 32767).astype(np.int16)  # noqa: E731
    mic = to16(EchoPath(ROOM).process(far))
    transparent = {
        f"suppressor.normal_tuning.{band}.{field}": value
        for band in ("mask_lf", "mask_hf")
        for field, value in (("enr_transparent", 99.0), ("enr_suppress", 100.0),
                             ("emr_transparent", 99.0))
    }  # fmt: skip
    residual = {}
    for name, config in (("default", {}), ("transparent", transparent)):
        aec = Aec3(high_pass_filter=False, linear_output=False, config=config)
        outs = []
        for i in range(0, len(far), FRAME):
            out, linear = aec.frame(to16(far[i : i + FRAME]).tobytes(), mic[i : i + FRAME])
            assert linear is None  # no linear output asked for
            outs.append(out)
        settled = slice(len(far) - 2 * RATE, len(far))
        residual[name] = _db(mic[settled]) - _db(np.concatenate(outs)[settled])
    assert residual["default"] >= 20  # dB taken off the echo
    assert residual["transparent"] <= residual["default"] - 10


def test_the_canceller_can_run_our_aec3_in_place_of_livekits(speech):
    """EchoSettings.canceller "aec3": our AEC3's output, AEC3's rules, no linear filter."""
    pytest.importorskip("pivoice_aec3")
    far, _ = speech
    canceller = EchoCanceller(EchoSettings(canceller="aec3"))
    assert not canceller.linear_filter
    echo = EchoPath(ROOM).process(far)
    fmt = AudioFormat(RATE, 2, 1)
    canceller.reference((np.clip(far, -1, 1) * 32767).astype("<i2").tobytes(), fmt, 0.0)
    for n in range(len(echo) // CHUNK_SAMPLES):
        chunk = echo[n * CHUNK_SAMPLES : (n + 1) * CHUNK_SAMPLES]
        canceller.process((np.clip(chunk, -1, 1) * 32767).astype("<i2").tobytes(),
                          (n + 1) * CHUNK_SECONDS)  # fmt: skip
        assert canceller.linear_chunk is None
    assert canceller.estimate.erle_db >= 20
