"""The Wyoming server end to end on the real embedded models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from wyoming.event import Event
from wyoming.handle import Handled
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from .helpers import exchange, make_speech, read_wav, transcribe_events, words

VOICE_RATE = 22050  # en_US-joe-medium


def audio_runs(events: list[Event]) -> list[tuple[int, int, int, bytes]]:
    """Group audio-start…audio-stop runs: (rate, width, channels, pcm)."""
    runs: list[tuple[int, int, int, bytes]] = []
    current: list[bytes] | None = None
    fmt = (0, 0, 0)
    for event in events:
        if event.type == "audio-start":
            fmt, current = (event.data["rate"], event.data["width"], event.data["channels"]), []
        elif event.type == "audio-chunk":
            assert current is not None, "audio-chunk outside audio-start/stop"
            assert (event.data["rate"], event.data["width"], event.data["channels"]) == fmt
            current.append(event.payload or b"")
        elif event.type == "audio-stop":
            assert current is not None
            runs.append((*fmt, b"".join(current)))
            current = None
    return runs


async def test_describe_lists_asr_tts_handle_and_no_satellite(server_port: int) -> None:
    [event] = await exchange(server_port, [Describe().event()], until="info")
    info = Info.from_event(event)
    assert info.satellite is None  # HA would drop the STT/TTS/conversation entities
    assert info.asr[0].installed and info.asr[0].models[0].name == "tiny.en"
    assert info.asr[0].models[0].languages == ["en"]
    assert info.tts[0].supports_synthesize_streaming
    assert info.tts[0].voices[0].name == "en_US-joe-medium"
    assert info.handle[0].supports_handled_streaming
    assert info.handle[0].models[0].name.startswith("SmolLM2")


async def test_transcribes_spoken_words(server_port: int, kitchen_wav: Path) -> None:
    pcm, rate, width, channels = read_wav(kitchen_wav)
    replies = await exchange(
        server_port, transcribe_events(pcm, rate, width, channels), until="transcript-stop"
    )
    types = [e.type for e in replies]
    assert types[0] == "transcript-start" and types[-2:] == ["transcript", "transcript-stop"]
    transcript = next(e for e in replies if e.type == "transcript").data["text"]
    chunks = " ".join(e.data["text"] for e in replies if e.type == "transcript-chunk")
    assert {"kitchen", "lights"} <= words(transcript)
    assert chunks == transcript


@pytest.mark.parametrize(("rate", "channels"), [(8000, 1), (22050, 1), (44100, 2)])
async def test_transcribes_other_rates_and_stereo(
    server_port: int, speech_dir: Path, rate: int, channels: int
) -> None:
    wav = make_speech(
        "Open the garage door.",
        speech_dir / f"garage-{rate}-{channels}.wav",
        rate=rate,
        channels=channels,
    )
    pcm, wav_rate, width, wav_channels = read_wav(wav)
    assert (wav_rate, wav_channels) == (rate, channels)
    # Odd chunk size: frames split across chunks must survive.
    replies = await exchange(
        server_port, transcribe_events(pcm, rate, width, channels, 3001), until="transcript-stop"
    )
    transcript = next(e for e in replies if e.type == "transcript").data["text"]
    assert {"garage", "door"} <= words(transcript)


async def test_synthesize_has_voice_rate_and_plausible_duration(server_port: int) -> None:
    text = "The front door is locked."
    replies = await exchange(server_port, [Synthesize(text=text).event()], until="audio-stop")
    [(rate, width, channels, pcm)] = audio_runs(replies)
    assert (rate, width, channels) == (VOICE_RATE, 2, 1)
    seconds = len(pcm) / (rate * width)
    assert 0.8 < seconds < 4.0  # five words
    samples = np.frombuffer(pcm, dtype="<i2")
    assert np.abs(samples).max() > 3000  # speech, not silence


async def test_streaming_synthesis_speaks_each_sentence_once(server_port: int) -> None:
    text = "Good morning. The heating is on, and the lights are off. Have a nice day!"
    pieces = [
        "Good mor",
        "ning. The heat",
        "ing is on, and the lights",
        " are off. Have a nice day!",
    ]
    events = [
        SynthesizeStart().event(),
        *[SynthesizeChunk(text=p).event() for p in pieces],
        Synthesize(text=text).event(),  # the compatibility copy: must not be spoken again
        SynthesizeStop().event(),
    ]
    replies = await exchange(server_port, events, until="synthesize-stopped")
    assert replies[-1].type == "synthesize-stopped"
    runs = audio_runs(replies)
    assert len(runs) == 3  # one audio run per sentence, the compatibility text ignored
    assert {(r, w, c) for r, w, c, _ in runs} == {(VOICE_RATE, 2, 1)}  # one format for HA's WAV
    streamed = sum(len(pcm) for *_, pcm in runs) / (VOICE_RATE * 2)

    [(_, _, _, whole)] = audio_runs(
        await exchange(server_port, [Synthesize(text=text).event()], until="audio-stop")
    )
    whole_seconds = len(whole) / (VOICE_RATE * 2)
    assert abs(streamed - whole_seconds) < 0.25 * whole_seconds


async def test_conversation_streams_chunks_that_make_the_final_text(server_port: int) -> None:
    context = {"conversation_id": "test-conversation"}
    turn = Event("transcript", {"text": "What is the capital of France?", "context": context})
    replies = await exchange(server_port, [turn], until="handled-stop")
    types = [e.type for e in replies]
    assert types[0] == "handled-start" and types[-2:] == ["handled", "handled-stop"]
    chunks = "".join(e.data["text"] for e in replies if e.type == "handled-chunk")
    final = Handled.from_event(replies[-2])
    assert final.text and final.text == chunks.strip()
    assert final.context == context
    assert types.count("handled-chunk") >= 1  # streamed, not only the final text
