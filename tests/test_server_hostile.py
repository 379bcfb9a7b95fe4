"""Bad input gets a clear error and loses nothing; the server keeps serving other clients."""

from __future__ import annotations

import asyncio
import json

import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe
from wyoming.tts import Synthesize

from wyoming_pivoice.wire.errors import ErrorCode

from .helpers import exchange


async def good_client(port: int) -> None:
    """A well-behaved client served while the hostile one misbehaves."""
    replies = await exchange(
        port,
        [Describe().event(), Synthesize(text="All good.").event()],
        until="audio-stop",
        timeout=60,
    )
    types = [e.type for e in replies]
    assert types[0] == "info" and types[-1] == "audio-stop" and "audio-chunk" in types


async def raw_session(port: int, frames: list[bytes], read: int = 1, then_describe: bool = False):
    """Write raw bytes; read up to `read` events (None = closed); optionally check the
    connection still works afterwards with a describe (then the replies end with its
    `info`, after the refused request's in-band answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for frame in frames:
            writer.write(frame)
        await writer.drain()
        replies = []
        async with asyncio.timeout(30):
            for _ in range(read):
                replies.append(await async_read_event(reader))
            if then_describe:
                await async_write_event(Describe().event(), writer)
                while not replies or replies[-1].type != "info":
                    replies.append(await async_read_event(reader))
        return replies
    finally:
        writer.close()


def frame(event: Event) -> bytes:
    header = {"type": event.type, "version": "1.10.2"}
    data = json.dumps(event.data).encode() if event.data else b""
    if data:
        header["data_length"] = len(data)
    if event.payload:
        header["payload_length"] = len(event.payload)
    return json.dumps(header).encode() + b"\n" + data + (event.payload or b"")


async def hostile_with_good(port: int, hostile) -> list:
    result, _ = await asyncio.gather(hostile, good_client(port))
    return result


@pytest.mark.parametrize(
    "line",
    [
        b"this is not json\n",
        b"[1, 2, 3]\n",
        b'{"data": {}}\n',
        b'{"type": "describe", "data_length": "x"}\n',
    ],
    ids=["not-json", "json-list", "no-type", "bad-length"],
)
async def test_malformed_frames_get_error_then_close(server_port: int, line: bytes) -> None:
    replies = await hostile_with_good(server_port, raw_session(server_port, [line], read=2))
    assert replies[0].type == "error" and replies[0].data["code"] in (
        ErrorCode.MALFORMED,
        ErrorCode.FRAME_TOO_LARGE,
    )
    assert replies[1] is None  # connection closed after a frame we cannot resync from


async def test_oversized_frame_is_refused_before_reading(server_port: int) -> None:
    header = json.dumps({"type": "audio-chunk", "payload_length": 10**9}).encode() + b"\n"
    replies = await hostile_with_good(server_port, raw_session(server_port, [header], read=2))
    assert replies[0].type == "error" and replies[0].data["code"] == ErrorCode.FRAME_TOO_LARGE
    assert replies[1] is None


async def test_overlong_header_line_is_refused(server_port: int) -> None:
    line = b'{"type": "describe", "pad": "' + b"x" * 200_000 + b'"}\n'
    replies = await hostile_with_good(server_port, raw_session(server_port, [line], read=2))
    assert replies[0].type == "error" and replies[0].data["code"] == ErrorCode.MALFORMED


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (AudioStart(rate=0, width=2, channels=1).event(), ErrorCode.BAD_AUDIO_FORMAT),
        (
            Event("audio-start", {"rate": "fast", "width": 2, "channels": 1}),
            ErrorCode.BAD_AUDIO_FORMAT,
        ),
        (AudioStart(rate=16000, width=3, channels=1).event(), ErrorCode.BAD_AUDIO_FORMAT),
        (AudioStart(rate=16000, width=2, channels=0).event(), ErrorCode.BAD_AUDIO_FORMAT),
        (
            AudioChunk(rate=16000, width=2, channels=1, audio=b"\0" * 64).event(),
            ErrorCode.BAD_AUDIO_FORMAT,
        ),
        (Event("synthesize", {"text": ""}), ErrorCode.EMPTY_TEXT),
        (Event("synthesize", {"text": 42}), ErrorCode.BAD_REQUEST),
        (Event("synthesize", {"text": "x" * 5000}), ErrorCode.TEXT_TOO_LONG),
        (Event("transcript", {"text": "   "}), ErrorCode.EMPTY_TEXT),
        (Event("transcript", {"text": ["a list"]}), ErrorCode.BAD_REQUEST),
        (Event("synthesize-chunk", {"text": "no stream"}), ErrorCode.BAD_REQUEST),
    ],
    ids=[
        "rate-0",
        "rate-str",
        "width-3",
        "channels-0",
        "chunk-first",
        "empty-synth",
        "synth-int",
        "synth-long",
        "blank-turn",
        "turn-list",
        "chunk-no-stream",
    ],
)
async def test_bad_requests_get_error_and_connection_keeps_working(
    server_port: int, event: Event, code: str
) -> None:
    replies = await hostile_with_good(
        server_port, raw_session(server_port, [frame(event)], read=1, then_describe=True)
    )
    assert replies[0].type == "error" and replies[0].data["code"] == code, replies[0]
    assert replies[0].data["text"]  # says what is wrong
    assert replies[-1].type == "info"  # the same connection still serves


async def test_empty_audio_gets_error(server_port: int) -> None:
    frames = [
        frame(Event("transcribe", {})),
        frame(AudioStart(rate=16000, width=2, channels=1).event()),
        frame(AudioStop().event()),
    ]
    replies = await hostile_with_good(
        server_port, raw_session(server_port, frames, then_describe=True)
    )
    assert replies[0].data["code"] == ErrorCode.EMPTY_AUDIO
    assert [e.type for e in replies[1:]] == ["transcript", "info"]  # what HA waits for


async def test_audio_over_limit_gets_error(server_port: int) -> None:
    second = b"\0\1" * 16000
    frames = [frame(AudioStart(rate=16000, width=2, channels=1).event())]
    frames += [frame(AudioChunk(rate=16000, width=2, channels=1, audio=second).event())] * 61
    frames.append(frame(AudioStop().event()))
    replies = await hostile_with_good(
        server_port, raw_session(server_port, frames, then_describe=True)
    )
    assert replies[0].data["code"] == ErrorCode.AUDIO_TOO_LONG
    # answered with an empty transcript; the rest of that request was dropped, not transcribed
    assert [e.type for e in replies[1:]] == ["transcript", "info"]
    assert replies[1].data["text"] == ""


async def test_unknown_events_are_ignored(server_port: int) -> None:
    frames = [frame(Event("from-the-future", {"x": 1})), frame(Event("detect", {}))]
    replies = await hostile_with_good(
        server_port, raw_session(server_port, frames, read=0, then_describe=True)
    )
    assert [r.type for r in replies] == ["info"]


async def test_client_vanishing_mid_frame_and_mid_request(server_port: int) -> None:
    half = (
        json.dumps({"type": "audio-chunk", "payload_length": 4096}).encode() + b"\n" + b"\0" * 100
    )
    _reader, writer = await asyncio.open_connection("127.0.0.1", server_port)
    writer.write(half)
    await writer.drain()
    writer.close()
    # A synthesis whose client leaves before the audio is read.
    _reader, writer = await asyncio.open_connection("127.0.0.1", server_port)
    writer.write(frame(Synthesize(text="This reply is never heard by anybody at all.").event()))
    await writer.drain()
    writer.close()
    await good_client(server_port)
    await good_client(server_port)
