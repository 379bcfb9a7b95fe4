"""`wyoming-pivoice satellite --uri …` driven by a client that plays Home Assistant's part.

The client does what homeassistant/components/wyoming/assist_satellite.py does: it
connects, sends run-satellite, pings, answers the satellite's run-pipeline with the
pipeline events HA forwards (transcribe, voice-started/stopped, transcript,
synthesize), and streams the reply as audio-start / 2048-byte audio-chunks /
audio-stop at 22050 Hz, then waits for `played`. Speech-to-text and the reply's
audio come from the real pivoice server (session fixture), as HA's pipeline would
get them from its STT and TTS.
"""

from __future__ import annotations

import asyncio
import json
import wave
from pathlib import Path

import pytest
from wyoming.audio import AudioStart
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping
from wyoming.pipeline import RunPipeline
from wyoming.satellite import PauseSatellite, RunSatellite
from wyoming.server import AsyncServer
from wyoming.timer import TimerFinished, TimerStarted
from wyoming.tts import Synthesize, SynthesizeVoice
from wyoming.wake import Detection

from wyoming_pivoice.audio.mic import WavSource
from wyoming_pivoice.audio.speaker import WavSink
from wyoming_pivoice.satellite.endpoint import Endpointer
from wyoming_pivoice.satellite.ha.adapter import HaSatellite
from wyoming_pivoice.satellite.ha.machine import Timeouts
from wyoming_pivoice.satellite.settings import MicSettings, SatelliteSettings, VadSettings

from .helpers import (
    HA_TIMEOUT,
    FakeHomeAssistant,
    assert_covers_speech,
    free_port,
    ha_mode_satellite,
    make_speech,
    read_wav,
    stt,
    tts,
    voiced_span,
    wait_for_port,
    words,
)


def wav_frames(path: Path) -> tuple[bytes, int]:
    pcm, rate, width, channels = read_wav(path)
    assert (width, channels) == (2, 1)
    return pcm, rate


def concat_wavs(parts: list[Path], out: Path, gap: float) -> Path:
    """Utterances one after another with `gap` seconds of silence between them."""
    pcm = b"".join(read_wav(p)[0] + bytes(int(gap * 16000) * 2) for p in parts)
    with wave.open(str(out), "wb") as wav:
        wav.setframerate(16000)
        wav.setsampwidth(2)
        wav.setnchannels(1)
        wav.writeframes(pcm)
    return out


@pytest.fixture(scope="module")
def reply_audio(server_port: int) -> tuple[bytes, int]:
    return asyncio.run(tts(server_port, "The kitchen lights are now on."))


# ---- tests -----------------------------------------------------------------------------------


async def test_a_whole_pipeline_as_home_assistant_runs_it(
    server_port: int, kitchen_wav: Path, reply_audio: tuple[bytes, int], tmp_path: Path
) -> None:
    out_wav = tmp_path / "reply.wav"
    timing = tmp_path / "timing.jsonl"
    with ha_mode_satellite(
        tmp_path, "--name", "Kitchen satellite", "--area", "Kitchen",
        "--mic-wav", str(kitchen_wav), "--snd-wav", str(out_wav), "--timing-log", str(timing),
    ) as sat:  # fmt: skip
        async with FakeHomeAssistant(sat.port) as ha:
            info = await ha.describe()
            assert info.satellite is not None and info.satellite.installed
            assert info.satellite.name == "Kitchen satellite"
            assert info.satellite.area == "Kitchen"
            assert info.satellite.has_vad is True
            assert info.satellite.supports_trigger is True
            assert info.satellite.active_wake_words == []  # no local wake word: VAD starts runs
            assert not info.asr and not info.tts and not info.handle  # a satellite only
            [mic] = info.mic
            assert (mic.mic_format.rate, mic.mic_format.width, mic.mic_format.channels) == (
                16000, 2, 1,
            )  # fmt: skip
            [snd] = info.snd
            assert (snd.snd_format.rate, snd.snd_format.width, snd.snd_format.channels) == (
                22050, 2, 1,
            )  # fmt: skip

            await ha.send(RunSatellite().event(), Ping(text="hello").event())
            pong, _ = await ha.read_until("pong")
            assert pong.data.get("text") == "hello"
            ha.keep_pinging()

            stream = await ha.receive_stream()
            assert (stream.run.start_stage.value, stream.run.end_stage.value) == ("asr", "tts")
            assert stream.run.restart_on_end is False
            assert (stream.start.rate, stream.start.width, stream.start.channels) == (16000, 2, 1)
            mic_pcm, _ = wav_frames(kitchen_wav)
            assert_covers_speech(stream.pcm, mic_pcm)

            # HA's pipeline: STT on what was streamed, then the reply's audio.
            text = await stt(server_port, stream.pcm)
            assert {"kitchen", "lights"} <= words(text)
            await ha.pipeline_events(text)
            await ha.send(
                Synthesize(
                    text="The kitchen lights are now on.",
                    voice=SynthesizeVoice(name="en_US-joe-medium", language="en"),
                ).event(),
                Describe().event(),  # HA refreshes the info before each pipeline loop
            )
            pcm, rate = reply_audio
            await ha.send_reply(pcm, rate)
            _, before = await ha.read_until("played")
            assert all(e.type in ("info", "pong") for e in before), before

            # The speaker got exactly that audio, at the rate audio-start announced.
            out_pcm, out_rate = wav_frames(out_wav)
            assert out_rate == 22050
            assert out_pcm == pcm
            assert len(out_pcm) / (2 * 22050) > 1.0

            # The microphone file ends: the satellite finishes and exits cleanly.
            pongs = [e for e in stream.others + before if e.type == "pong"]
            while (event := await ha.read()) is not None:
                assert event.type == "pong"
                pongs.append(event)
            assert pongs, "HA's keepalive pings got no pong"
        assert sat.wait() == 0

    [turn] = [json.loads(line) for line in timing.read_text().splitlines()]
    assert turn["mode"] == "ha"
    assert turn["transcript"] == text
    assert turn["error"] is None
    for stamp in ("speech_start", "last_voiced", "endpoint", "transcript", "tts_first_audio",
                  "first_played", "playback_done"):  # fmt: skip
        assert turn["stamps"][stamp] is not None, stamp


async def test_pings_pause_and_unknown_events(kitchen_wav: Path, tmp_path: Path) -> None:
    with ha_mode_satellite(tmp_path, "--mic-wav", str(kitchen_wav), "--snd-device", "null") as sat:
        async with FakeHomeAssistant(sat.port) as ha:
            await ha.send(RunSatellite().event())
            event, _ = await ha.read_until("run-pipeline")
            await ha.read_until("audio-start")
            # Pings are answered while streaming; odd events never hurt.
            await ha.send(
                Event(type="no-such-event", data={"x": 1}),
                AudioStart(rate="fast", width=2, channels=1).event(),  # type: ignore[arg-type]
                Event(type="audio-chunk", data={}, payload=b"\0\0"),
                Ping(text="1").event(),
            )
            pong, before = await ha.read_until("pong")
            assert pong.data["text"] == "1"
            assert {e.type for e in before} <= {"audio-chunk"}

            await ha.send(PauseSatellite().event(), Ping(text="2").event())
            pong, before = await ha.read_until("pong")
            assert {e.type for e in before} <= {"audio-chunk"}  # only what was in flight
            # Paused: nothing more is streamed until the microphone file ends.
            after: list[Event] = []
            while (event := await ha.read()) is not None:
                after.append(event)
            assert after == [], [e.type for e in after]
        assert sat.wait() == 0


async def test_disconnect_mid_pipeline_then_a_new_connection_works(
    server_port: int, speech_dir: Path, reply_audio: tuple[bytes, int], tmp_path: Path
) -> None:
    first = make_speech("What is the weather today?", speech_dir / "weather.wav", pad_after=0.2)
    second = make_speech("Play some music.", speech_dir / "music.wav", pad_after=0.2)
    mic = concat_wavs([first, second], tmp_path / "two.wav", gap=3.0)
    with ha_mode_satellite(
        tmp_path, "--mic-wav", str(mic), "--snd-wav", str(tmp_path / "out-{n}.wav"),
        "--snd-realtime",
    ) as sat:  # fmt: skip
        pcm, rate = reply_audio
        async with FakeHomeAssistant(sat.port) as ha:
            await ha.send(RunSatellite().event())
            stream = await ha.receive_stream()
            await ha.pipeline_events("what is the weather today")
            await ha.send_reply(pcm[: len(pcm) // 2], rate, stop=False)
            # HA goes away mid-reply (restart, network): no audio-stop, no goodbye.

        async with FakeHomeAssistant(sat.port) as ha:
            await ha.send(Describe().event())
            await ha.read_until("info")
            await ha.send(RunSatellite().event())
            stream = await ha.receive_stream()

            # Meanwhile a second Home Assistant is refused, clearly; describe still works.
            # HA pings every 2 s: without a ping for 6 s (the stream above takes seconds under
            # load) the satellite rightly lets a newcomer take a silent connection's place.
            await ha.send(Ping().event())
            async with FakeHomeAssistant(sat.port) as intruder:
                assert (await intruder.describe()).satellite is not None
                await intruder.send(RunSatellite().event())
                error, _ = await intruder.read_until("error")
                assert error.data["code"] == "busy"
                assert await intruder.read() is None

            mic_pcm, _ = wav_frames(second)
            assert_covers_speech(stream.pcm, mic_pcm)
            text = await stt(server_port, stream.pcm)
            assert {"music"} <= words(text)
            await ha.pipeline_events(text)
            await ha.send_reply(pcm, rate)
            await ha.read_until("played")
            assert await ha.read() is None
        assert sat.wait() == 0

    outputs = sorted(tmp_path.glob("out-*.wav"))
    assert [p.name for p in outputs] == ["out-1.wav", "out-2.wav"]
    cut, _ = wav_frames(outputs[0])
    assert len(cut) <= len(pcm) // 2  # the first reply stopped when HA left
    full, out_rate = wav_frames(outputs[1])
    assert out_rate == rate and full == pcm


async def test_a_new_audio_start_interrupts_the_reply(
    server_port: int, kitchen_wav: Path, reply_audio: tuple[bytes, int], tmp_path: Path
) -> None:
    other, other_rate = await tts(server_port, "Sorry, I meant the living room.")
    with ha_mode_satellite(
        tmp_path, "--mic-wav", str(kitchen_wav), "--snd-wav", str(tmp_path / "out-{n}.wav"),
        "--snd-realtime",
    ) as sat:  # fmt: skip
        pcm, rate = reply_audio
        async with FakeHomeAssistant(sat.port) as ha:
            await ha.send(RunSatellite().event())
            await ha.receive_stream()
            await ha.pipeline_events("turn on the kitchen lights")
            # A reply, cut by a second audio-start (no audio-stop in between) …
            await ha.send_reply(pcm[: len(pcm) // 2], rate, stop=False)
            # … then cut again the way HA's interrupt_playback() does it: stop, then start.
            await ha.send_reply(pcm[: len(pcm) // 2], rate, stop=True)
            await ha.send_reply(other, other_rate)
            played = 0
            while (event := await ha.read()) is not None:
                played += event.type == "played"
            assert played == 1  # only the reply that was really played to its end
        assert sat.wait() == 0

    # One file per reply that reached the speaker: a reply interrupted before the speaker
    # took any of it is dropped whole, one interrupted later is cut.
    outputs = sorted(tmp_path.glob("out-*.wav"))
    assert 1 <= len(outputs) <= 3
    for cut in outputs[:-1]:
        assert len(wav_frames(cut)[0]) <= len(pcm) // 2
    final, final_rate = wav_frames(outputs[-1])
    assert final_rate == other_rate and final == other


async def test_local_wake_word_sends_detection_then_the_command(
    server_port: int, speech_dir: Path, reply_audio: tuple[bytes, int], tmp_path: Path
) -> None:
    wake = make_speech("Alexa.", speech_dir / "alexa.wav", pad_after=0.2)
    command = make_speech("Turn on the kitchen lights.", speech_dir / "command.wav", pad_before=0.5)
    mic = concat_wavs([wake, command], tmp_path / "wake-command.wav", gap=0.0)
    out_wav = tmp_path / "reply.wav"
    with ha_mode_satellite(
        tmp_path, "--wake-word", "alexa", "--mic-wav", str(mic), "--snd-wav", str(out_wav)
    ) as sat:
        async with FakeHomeAssistant(sat.port) as ha:
            info = await ha.describe()
            assert info.satellite is not None
            assert info.satellite.active_wake_words == ["alexa"]
            [program] = info.wake
            [model] = program.models
            assert model.name == "alexa" and model.installed and model.phrase

            await ha.send(RunSatellite().event())
            detection, _ = await ha.read_until("detection")
            assert detection.data["name"] == "alexa"  # HA resolves it to the model's phrase
            stream = await ha.receive_stream()
            assert stream.run.start_stage.value == "asr"
            assert stream.run.wake_word_name == "alexa"
            text = await stt(server_port, stream.pcm)
            assert {"kitchen", "lights"} <= words(text)

            await ha.pipeline_events(text)
            pcm, rate = reply_audio
            await ha.send_reply(pcm, rate)
            await ha.read_until("played")
        assert sat.wait() == 0
    assert wav_frames(out_wav) == (pcm, rate)


async def test_remote_wake_streams_until_home_assistant_has_the_transcript(
    kitchen_wav: Path, reply_audio: tuple[bytes, int], tmp_path: Path
) -> None:
    """--remote-wake: HA runs wake word and VAD; we stream from run-satellite on."""
    port = free_port()
    uri = f"tcp://127.0.0.1:{port}"
    settings = SatelliteSettings(uri=uri, mic=MicSettings(wav=str(kitchen_wav)))
    out_wav = tmp_path / "reply.wav"
    sat = HaSatellite(
        settings, WavSource(kitchen_wav), WavSink(out_wav), Endpointer(VadSettings()),
        timeouts=Timeouts(error_retry=0.5), remote_wake=True,
    )  # fmt: skip
    serving = asyncio.create_task(sat.serve(AsyncServer.from_uri(uri)))
    try:
        await asyncio.to_thread(wait_for_port, port)
        async with FakeHomeAssistant(port) as ha:
            info = await ha.describe()
            assert info.satellite is not None and info.satellite.has_vad is False

            await ha.send(RunSatellite().event())
            run, _ = await ha.read_until("run-pipeline")
            assert RunPipeline.from_event(run).start_stage.value == "wake"
            await ha.read_until("audio-start")
            # HA's wake word engine hears the speech, its VAD waits for the end of it.
            mic_pcm, _ = wav_frames(kitchen_wav)
            _first, last = voiced_span(mic_pcm)
            received = 0
            while received < last + 16000:  # the speech and half a second of silence
                chunk, _ = await ha.read_until("audio-chunk")
                received += len(chunk.payload or b"")
            await ha.send(Detection(name="alexa").event())
            await ha.pipeline_events("turn on the kitchen lights")
            # Streaming stops without audio-stop (HA ended STT itself); the reply plays.
            pcm, rate = reply_audio
            await ha.send_reply(pcm, rate)
            _, before = await ha.read_until("played")
            assert {e.type for e in before} <= {"audio-chunk"}
            # After `played` the satellite streams for the next wake word at once …
            run, before = await ha.read_until("run-pipeline")
            assert before == []
            assert RunPipeline.from_event(run).start_stage.value == "wake"
            await ha.read_until("audio-start")
            # … and after a pipeline error, again after a short pause.
            await ha.send(Error(text="wake word service down", code="wake-stream-failed").event())
            run, before = await ha.read_until("run-pipeline")
            assert RunPipeline.from_event(run).start_stage.value == "wake"
            assert await asyncio.wait_for(serving, HA_TIMEOUT) == 0  # the mic file ended
    finally:
        if not serving.done():
            sat.stop()
            await serving
    assert wav_frames(out_wav) == (pcm, rate)


async def test_announcement_and_timer_sound_play_while_idle(
    reply_audio: tuple[bytes, int], speech_dir: Path, tmp_path: Path
) -> None:
    """HA's async_announce streams audio with no pipeline; timers are forwarded events."""
    silence = tmp_path / "silence.wav"
    with wave.open(str(silence), "wb") as wav:
        wav.setframerate(16000)
        wav.setsampwidth(2)
        wav.setnchannels(1)
        wav.writeframes(bytes(4 * 32000))
    ding = make_speech("Ding.", speech_dir / "ding.wav", rate=22050, pad_before=0, pad_after=0)
    with ha_mode_satellite(
        tmp_path, "--mic-wav", str(silence), "--snd-wav", str(tmp_path / "out-{n}.wav"),
        "--done-wav", str(ding), "--timer-finished-wav", str(ding),
        "--timer-finished-wav-repeat", "2", "0.2",
    ) as sat:  # fmt: skip
        pcm, rate = reply_audio
        async with FakeHomeAssistant(sat.port) as ha:
            await ha.send(RunSatellite().event())
            await ha.send_reply(pcm, rate)
            _, before = await ha.read_until("played")
            assert before == []
            await ha.send(
                TimerStarted(id="t1", total_seconds=1, name="tea").event(),
                TimerFinished(id="t1").event(),
                Ping(text="after timer").event(),
            )
            events: list[str] = []
            while (event := await ha.read()) is not None:
                events.append(event.type)
            # A local sound is not a reply: no `played` (our keepalive pings aside).
            assert [e for e in events if e != "ping"] == ["pong"]
        assert sat.wait() == 0
    assert wav_frames(tmp_path / "out-1.wav") == (pcm, rate)
    # The timer rang twice, as --timer-finished-wav-repeat asked, then stopped.
    assert wav_frames(tmp_path / "out-2.wav") == (read_wav(ding)[0], 22050)
    assert wav_frames(tmp_path / "out-3.wav") == (read_wav(ding)[0], 22050)
    assert not (tmp_path / "out-4.wav").exists()
