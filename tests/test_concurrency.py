"""Many clients at once on the real models: every answer is right and is its own client's,
and a client that stalls, stops reading or vanishes blocks nobody.

Latencies are printed (run with -s), never asserted: speed claims come from the bench.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from wyoming.event import Event, async_write_event
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from wyoming_pivoice.audio.pcm import resample_pcm16

from .helpers import (
    RELEASE_S,
    TTS,
    TURN,
    describe_works,
    exchange,
    ha_reads,
    make_speech,
    non_reader,
    open_connections,
    open_raw,
    read_wav,
    server_process_of,
    synthesize,
    transcribe_events,
    turn,
    words,
)

VOICE_RATE = 22050
BOUND = 240.0  # seconds any one client may wait, queued behind all the others

# One sentence per transcribing client, with words only that client's transcript has.
SPOKEN = [
    ("Turn on the kitchen lights please.", {"kitchen", "lights"}),
    ("Open the garage door.", {"garage", "door"}),
    ("Set a timer for ten minutes.", {"timer", "minutes"}),
]
# Texts to speak: (text, streamed pieces or None for a plain synthesize, words to hear back).
SPEAK = [
    ("The front door is locked.", None, {"front", "door", "locked"}),
    (
        "Good evening. The living room is warm, and the alarm is set for the night.",
        None,
        {"evening", "living", "alarm", "night"},
    ),
    (
        "Good morning. The heating is on.",
        ["Good mor", "ning. The heat", "ing is on."],
        {"morning", "heating"},
    ),
    (
        "Dinner is ready. Please come to the table.",
        ["Dinner is rea", "dy. Please come", " to the table."],
        {"dinner", "ready", "table"},
    ),
]
QUESTIONS = ["What is the capital of France?"]


@dataclass
class Answer:
    kind: str
    seconds: float
    detail: str


async def transcribe(port: int, pcm: bytes, rate: int) -> str:
    events = transcribe_events(pcm, rate, chunk=2048)
    replies = await exchange(port, events, "transcript-stop", BOUND)
    assert [e.type for e in replies if e.type == "error"] == [], replies
    return next(e for e in replies if e.type == "transcript").data["text"]


def speech_pcm(replies: list[Event]) -> bytes:
    starts = [e for e in replies if e.type == "audio-start"]
    assert starts and all(
        (e.data["rate"], e.data["width"], e.data["channels"]) == (VOICE_RATE, 2, 1) for e in starts
    )
    return b"".join(e.payload or b"" for e in replies if e.type == "audio-chunk")


# ---- the well-behaved clients -------------------------------------------------------------


async def transcribing_client(port: int, wav: Path, expected: set[str]) -> Answer:
    pcm, rate, _, _ = read_wav(wav)
    start = time.monotonic()
    text = await transcribe(port, pcm, rate)
    assert expected <= words(text), f"{text!r} lacks {expected}"
    return Answer("transcribe", time.monotonic() - start, text)


async def speaking_client(
    port: int, text: str, pieces: list[str] | None, expected: set[str]
) -> tuple[Answer, bytes]:
    start = time.monotonic()
    if pieces is None:
        replies = await exchange(port, [Synthesize(text=text).event()], "audio-stop", BOUND)
    else:
        events = [
            SynthesizeStart().event(),
            *[SynthesizeChunk(text=p).event() for p in pieces],
            Synthesize(text=text).event(),
            SynthesizeStop().event(),
        ]
        replies = await exchange(port, events, "synthesize-stopped", BOUND)
    seconds = time.monotonic() - start
    pcm = speech_pcm(replies)
    duration = len(pcm) / (2 * VOICE_RATE)
    # The audio's length fits this client's text (about 0.06 s a character for this voice).
    assert 0.03 * len(text) < duration < 0.15 * len(text), (text, duration)
    kind = "synthesize" if pieces is None else "streaming synthesize"
    return Answer(kind, seconds, f"{duration:.1f} s of audio"), pcm


async def conversing_client(port: int, question: str, conversation_id: str) -> Answer:
    context = {"conversation_id": conversation_id}
    start = time.monotonic()
    turn = Event("transcript", {"text": question, "context": context})
    replies = await exchange(port, [turn], "handled-stop", BOUND)
    final = next(e for e in replies if e.type == "handled")
    chunks = "".join(e.data["text"] for e in replies if e.type == "handled-chunk")
    assert final.data["text"] and final.data["text"] == chunks.strip()
    assert final.data["context"] == context  # this client's turn, not another's
    return Answer("conversation", time.monotonic() - start, final.data["text"])


# ---- the ones that misbehave --------------------------------------------------------------


async def stalled_request(port: int):
    """Starts a transcription, sends one chunk, then nothing more (keeps the connection)."""
    reader, writer = await open_raw(port)
    for event in transcribe_events(b"\0\0" * 4000, 16000, chunk=2048)[:3]:
        await async_write_event(event, writer)
    return reader, writer


async def vanisher(port: int) -> None:
    """Asks for a conversation turn and resets the connection before any reply."""
    _reader, writer = await open_raw(port)
    await async_write_event(Event("transcript", {"text": "Tell me a long story."}), writer)
    linger = struct.pack("ii", 1, 0)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    writer.close()


# ---- the tests ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spoken(speech_dir: Path) -> list[tuple[Path, set[str]]]:
    return [
        (make_speech(text, speech_dir / f"concurrent-{i}.wav"), expected)
        for i, (text, expected) in enumerate(SPOKEN)
    ]


async def test_eight_clients_at_once_while_others_stall_or_vanish(
    server_port: int, spoken: list[tuple[Path, set[str]]]
) -> None:
    proc = server_process_of(server_port)
    await describe_works(server_port)

    stalled = await stalled_request(server_port)
    blocked = await non_reader(server_port, bound=BOUND)
    await vanisher(server_port)
    # Idle connections from a neighbour, as many as an address has slots: they hold none
    # (a connection gets one with its first request, slots.py), so all 8 are served.
    idle = [
        await asyncio.open_connection("127.0.0.1", server_port, local_addr=("127.0.0.5", 0))
        for _ in range(12)
    ]
    jobs = [transcribing_client(server_port, wav, expected) for wav, expected in spoken]
    jobs += [speaking_client(server_port, *speak) for speak in SPEAK]
    jobs += [conversing_client(server_port, q, f"concurrent-{i}") for i, q in enumerate(QUESTIONS)]
    assert len(jobs) == 8
    # Refusals read as Home Assistant reads them, released at once beside all that work.
    refusals = [
        ha_reads(server_port, frames, until)
        for frames, until in (([synthesize(" \n\t ")], TTS), ([turn("x" * 4001)], TURN))
    ]
    start = time.monotonic()
    results = await asyncio.gather(*jobs, *refusals)
    wall = time.monotonic() - start
    results, released = results[:8], results[8:]
    for seconds, _replies, how in released:
        assert how != "eof" and seconds < RELEASE_S, (how, seconds)
    for _reader, writer in idle:
        writer.close()

    # Each synthesized reply, transcribed back, says that client's words.
    for (answer, pcm), (_, _, expected) in zip(results[3:7], SPEAK, strict=True):
        heard = await transcribe(server_port, resample_pcm16(pcm, VOICE_RATE, 16000), 16000)
        assert len(expected & words(heard)) >= len(expected) - 1, (heard, expected)
        answer.detail += f", heard back as {heard!r}"

    answers = [r[0] if isinstance(r, tuple) else r for r in results]
    print(f"\n8 clients at once (plus 3 misbehaving) finished in {wall:.1f} s:")
    for answer in sorted(answers, key=lambda a: a.seconds):
        print(f"  {answer.seconds:6.2f} s  {answer.kind:22s} {answer.detail}")

    # The stalled ones were never answered, and still hold only their own connections.
    for reader, writer in (stalled, blocked):
        assert not reader.at_eof()
        writer.close()
    await describe_works(server_port)
    # (polled in a thread: the loop must run on to close our own side of each connection)
    assert await asyncio.to_thread(open_connections, proc) == []  # each one was let go
