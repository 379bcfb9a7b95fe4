"""Every refusal releases a client that reads as Home Assistant does, within a second.

HA ignores `error`: its STT reads until `transcript`, its TTS until `audio-stop` (plain) or
`synthesize-stopped` (streaming), its conversation agent until `handled`/`not-handled`, or
EOF. `ha_reads` does exactly that (homeassistant/components/wyoming stt.py, tts.py,
conversation.py), so a refusal that leaves the connection open without the in-band answer
fails here by timing out.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from wyoming.event import Event, async_read_event

from wyoming_pivoice.wire.errors import ErrorCode

from .helpers import (
    AUDIO,
    PCM_SECOND,
    RELEASE_S,
    STREAM,
    STT,
    TTS,
    TURN,
    encode,
    ha_reads,
    server_process,
    synthesize,
    turn,
)


# What HA reads until, by request: the first of these event types, or EOF.
def surrogate(kind: str) -> bytes:
    """A frame whose text holds a lone surrogate (legal JSON, not UTF-8)."""
    block = b'{"text": "hi \\ud800"}'
    header = json.dumps({"type": kind, "data_length": len(block)}).encode()
    return header + b"\n" + block


def stream(*chunks: str) -> list[bytes]:
    frames = [encode("synthesize-start", {}, None)]
    frames += [encode("synthesize-chunk", {"text": c}, None) for c in chunks]
    frames += [synthesize("".join(chunks)), encode("synthesize-stop", {}, None)]
    return frames


def transcription(*chunks: bytes, fmt: dict | None = None) -> list[bytes]:
    fmt = fmt or AUDIO
    frames = [encode("transcribe", {"language": "en"}, None), encode("audio-start", fmt, None)]
    frames += [encode("audio-chunk", fmt, c) for c in chunks]
    return [*frames, encode("audio-stop", {}, None)]


TOO_LONG = "x" * 4001

# (request frames, what HA reads until, the error code the server gives)
REFUSALS = {
    "tts-empty": ([synthesize("")], TTS, ErrorCode.EMPTY_TEXT),
    "tts-blank": ([synthesize(" \n\t ")], TTS, ErrorCode.EMPTY_TEXT),
    "tts-too-long": ([synthesize("Hello. " * 600)], TTS, ErrorCode.TEXT_TOO_LONG),
    "tts-nul": ([synthesize("a\0b")], TTS, ErrorCode.BAD_REQUEST),
    "tts-not-text": ([synthesize(42)], TTS, ErrorCode.BAD_REQUEST),
    "tts-surrogate": ([surrogate("synthesize")], TTS, ErrorCode.BAD_REQUEST),
    "stream-too-long": (stream("Hello. " * 300, "Again. " * 300), STREAM, ErrorCode.TEXT_TOO_LONG),
    "stream-stop-alone": ([encode("synthesize-stop", {}, None)], STREAM, ErrorCode.BAD_REQUEST),
    "turn-empty": ([turn("")], TURN, ErrorCode.EMPTY_TEXT),
    "turn-blank": ([turn("   ")], TURN, ErrorCode.EMPTY_TEXT),
    "turn-too-long": ([turn(TOO_LONG)], TURN, ErrorCode.TEXT_TOO_LONG),
    "turn-nul": ([turn("hi\0")], TURN, ErrorCode.BAD_REQUEST),
    "turn-not-text": ([turn(["a list"])], TURN, ErrorCode.BAD_REQUEST),
    "turn-surrogate": ([surrogate("transcript")], TURN, ErrorCode.BAD_REQUEST),
    "turn-big-context": ([turn("hi", {"x": TOO_LONG})], TURN, ErrorCode.TEXT_TOO_LONG),
    "stt-empty-audio": (transcription(), STT, ErrorCode.EMPTY_AUDIO),
    "stt-too-long": (transcription(*[PCM_SECOND] * 61), STT, ErrorCode.AUDIO_TOO_LONG),
    "stt-bad-format": (
        transcription(PCM_SECOND, fmt={**AUDIO, "width": 3}),
        STT,
        ErrorCode.BAD_AUDIO_FORMAT,
    ),
    "stt-chunk-first": (
        [encode("audio-chunk", AUDIO, PCM_SECOND), encode("audio-stop", {}, None)],
        STT,
        ErrorCode.BAD_AUDIO_FORMAT,
    ),
    "stt-stop-alone": ([encode("audio-stop", {}, None)], STT, ErrorCode.EMPTY_AUDIO),
}


@pytest.fixture(scope="module")
def voice_loaded(server_port: int) -> int:
    """The release bound is for a server that is up: a refused stream finishes the sentence
    it is speaking, which waits for the voice while it loads."""
    asyncio.run(ha_reads(server_port, [synthesize("Ready.")], TTS, bound=120))
    return server_port


@pytest.mark.parametrize("name", list(REFUSALS))
async def test_refusal_releases_a_client_that_ignores_error(voice_loaded: int, name: str) -> None:
    server_port = voice_loaded
    frames, until, code = REFUSALS[name]
    seconds, replies, released_by = await ha_reads(server_port, frames, until)
    errors = [e.data.get("code") for e in replies if e.type == "error"]
    assert errors and errors[0] == code, replies  # for clients that do read `error`
    assert released_by in until, (released_by, replies)  # in band: the connection stays
    assert seconds < RELEASE_S, f"{name}: HA waited {seconds:.2f} s"
    if released_by == "not-handled":
        assert replies[-1].data["text"]  # a short text HA can say
        assert TOO_LONG not in replies[-1].data["text"]
    if until == TTS:  # an empty audio run in the voice's format: HA writes an empty WAV
        assert [e.type for e in replies if e.type.startswith("audio")][-2:] == [
            "audio-start",
            "audio-stop",
        ]


async def test_a_refused_request_leaves_the_connection_serving(server_port: int) -> None:
    """After its in-band answer, the next request on the connection is served in order."""
    frames = [turn(""), synthesize(""), synthesize("Still here.")]
    replies: list[Event] = []
    reader, writer = await asyncio.open_connection("127.0.0.1", server_port)
    try:
        writer.write(b"".join(frames))
        await writer.drain()
        async with asyncio.timeout(60):
            while len([e for e in replies if e.type == "audio-stop"]) < 2:
                replies.append(await async_read_event(reader))
    finally:
        writer.close()
    kinds = [e.type for e in replies if e.type != "audio-chunk"]
    assert kinds == [
        "error",
        "not-handled",
        "error",
        "audio-start",
        "audio-stop",
        "audio-start",
        "audio-stop",
    ], kinds
    assert sum(len(e.payload or b"") for e in replies) > 22050  # "Still here." was spoken


@pytest.fixture(scope="module")
def short_text_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A server whose text limit is 200 characters."""
    log: Path = tmp_path_factory.mktemp("short") / "server.log"
    with server_process("--max-text-chars", "200", "--llm-lazy", log=log) as port:
        yield port


@pytest.fixture(scope="module")
def tiny_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A server with two slots, for the connection-level refusals."""
    log: Path = tmp_path_factory.mktemp("tiny") / "server.log"
    with server_process("--max-clients", "2", "--llm-lazy", log=log) as port:
        yield port


@pytest.mark.parametrize(
    "frames",
    [
        [b"not json\n"],
        [json.dumps({"type": "audio-chunk", "payload_length": 10**9}).encode() + b"\n"],
    ],
    ids=["malformed", "frame-too-large"],
)
async def test_connection_refusals_release_with_eof(tiny_port: int, frames: list[bytes]) -> None:
    seconds, replies, released_by = await ha_reads(tiny_port, frames, STT)
    assert released_by == "eof" and seconds < RELEASE_S
    assert replies[0].type == "error"


async def hold_busy(port: int) -> asyncio.StreamWriter:
    """A connection with a request in flight: an open transcription (its pong proves the
    server has read it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(transcription()[:2]) + encode("ping", {}, None))
    await writer.drain()
    async with asyncio.timeout(10):
        assert (await async_read_event(reader)).type == "pong"
    return writer


async def test_busy_releases_in_band(tiny_port: int) -> None:
    """Both slots hold a request in flight: the newcomer is told `busy`, with the end Home
    Assistant waits for (an empty audio run), at once; then closed."""
    held = [await hold_busy(tiny_port) for _ in range(2)]
    try:
        seconds, replies, released_by = await ha_reads(tiny_port, [synthesize("")], TTS)
        assert released_by == "audio-stop" and seconds < RELEASE_S
        assert [e.type for e in replies] == ["error", "audio-start", "audio-stop"]
        assert replies[0].data["code"] == ErrorCode.BUSY
    finally:
        for writer in held:
            writer.close()


async def read_to(reader: asyncio.StreamReader, until: str) -> list[Event]:
    replies: list[Event] = []
    async with asyncio.timeout(60):
        while not replies or replies[-1].type != until:
            event = await async_read_event(reader)
            assert event is not None, [e.type for e in replies]
            replies.append(event)
    return replies


async def test_a_stream_restart_does_not_reset_its_limit(short_text_port: int) -> None:
    """570 characters under a 200 limit, sent as three chunks around a second start."""
    sentence = "Sentence number nine. "  # 22 characters
    chunk = sentence * 8  # 176: within the limit alone, not twice
    frames = [encode("synthesize-start", {}, None)]
    frames += [encode("synthesize-chunk", {"text": chunk}, None)]
    frames += [encode("synthesize-start", {}, None)]  # refused: the same request goes on
    frames += [encode("synthesize-chunk", {"text": chunk}, None)] * 2
    frames += [encode("synthesize-stop", {}, None)]
    reader, writer = await asyncio.open_connection("127.0.0.1", short_text_port)
    try:
        writer.write(b"".join(frames))
        replies = await read_to(reader, "synthesize-stopped")
    finally:
        writer.close()
    codes = [e.data["code"] for e in replies if e.type == "error"]
    assert codes == [ErrorCode.BAD_REQUEST, ErrorCode.TEXT_TOO_LONG], codes
    assert [e.type for e in replies].count("audio-stop") <= 8  # the first chunk's sentences


async def test_a_plain_synthesize_after_an_abandoned_stream_is_answered(
    short_text_port: int,
) -> None:
    frames = [
        encode("synthesize-start", {}, None),
        encode("synthesize-chunk", {"text": "Hello there"}, None),
        synthesize("Goodbye now."),  # not the stream's text: a request of its own
    ]
    reader, writer = await asyncio.open_connection("127.0.0.1", short_text_port)
    try:
        writer.write(b"".join(frames))
        replies = await read_to(reader, "synthesize-stopped")  # the abandoned stream's end
        replies += await read_to(reader, "audio-stop")  # then the plain request's audio
    finally:
        writer.close()
    types = [e.type for e in replies if e.type != "audio-chunk"]
    assert "error" not in types and types[-2:] == ["audio-start", "audio-stop"], types
    assert sum(len(e.payload or b"") for e in replies) > 0.5 * 2 * 22050
