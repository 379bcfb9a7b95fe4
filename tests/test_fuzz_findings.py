"""What the fuzzer found, pinned down as plain regression tests (test_fuzz.py finds such
cases only by chance in its short run)."""

from __future__ import annotations

import asyncio
import json

import pytest
from wyoming.event import Event, async_read_event

from wyoming_pivoice.wire.errors import ErrorCode

from .helpers import encode


async def session(port: int, data: bytes, half_close: bool = True) -> list[Event | None]:
    """Write raw bytes (then end our side); every event until the server closes (None)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        await writer.drain()
        replies: list[Event | None] = []
        async with asyncio.timeout(60):
            while True:
                event = await async_read_event(reader)
                replies.append(event)
                if event is None:
                    return replies
    finally:
        writer.close()


def codes(replies: list[Event | None]) -> list[str]:
    return [e.data["code"] for e in replies if e is not None and e.type == "error"]


@pytest.mark.parametrize(
    "event",
    [
        Event("ping", {"text": "\ud800"}),
        Event("describe", {"x": "a\udfffb"}),
        Event("transcript", {"text": "hi", "context": {"conversation_id": "\ud83d"}}),
        Event("synthesize", {"text": "Hello \ud800 there."}),
        Event("synthesize", {"text": "Hello\0there."}),
        Event("transcript", {"text": "\0 hello"}),
        Event("transcript", {"text": "hi", "context": {"junk": "x" * 5000}}),
    ],
    ids=[
        "ping-surrogate",
        "describe-surrogate",
        "context-surrogate",
        "synth-surrogate",
        "synth-nul",
        "turn-nul",
        "context-too-big",
    ],
)
async def test_text_no_model_or_client_can_take_is_refused(server_port: int, event: Event) -> None:
    """Lone surrogates (valid JSON escapes, not UTF-8) used to kill the connection without a
    word when echoed back, or fail inside the voice; NULs failed inside the voice."""
    data = encode(event.type, event.data, None) + encode("describe", {}, None)
    replies = await session(server_port, data)
    assert codes(replies) == [
        ErrorCode.TEXT_TOO_LONG if "junk" in str(event.data) else ErrorCode.BAD_REQUEST
    ]
    # The end Home Assistant waits for, then the connection went on serving, in order.
    ending = {"transcript": ["not-handled"], "synthesize": ["audio-start", "audio-stop"]}
    assert [e.type for e in replies[1:-1]] == [*ending.get(event.type, []), "info"]
    assert replies[-1] is None


@pytest.mark.parametrize(
    "frame",
    [
        b"[" * 30000 + b"]" * 30000 + b"\n",
        json.dumps({"type": "ping", "data_length": 150001}).encode()
        + b"\n"
        + b'{"a":' * 30000
        + b"1"
        + b"}" * 30000,
    ],
    ids=["header", "data-block"],
)
async def test_json_nested_too_deep_is_malformed(server_port: int, frame: bytes) -> None:
    """Used to end the connection with an unhandled RecursionError and no error event."""
    replies = await session(server_port, frame)
    assert codes(replies) == [ErrorCode.MALFORMED] and replies[-1] is None


async def test_bad_line_just_before_the_end_is_still_answered(server_port: int) -> None:
    """A complete line that is not an event, then the client's end of input: the error used
    to be skipped because the reader had already seen the end."""
    replies = await session(server_port, b"\n")
    assert codes(replies) == [ErrorCode.MALFORMED]


async def test_error_survives_bytes_sent_after_a_bad_frame(server_port: int) -> None:
    """Closing with those bytes unread would reset the connection and could destroy the
    error event before the client read it; the server drains them first."""
    trailing = encode("describe", {}, None) * 200 + b"\xff" * 5000
    for _ in range(10):
        replies = await session(server_port, b"not json\n" + trailing)
        assert codes(replies) == [ErrorCode.MALFORMED] and replies[-1] is None


async def test_streamed_text_over_the_limit_is_refused_once_and_the_stream_still_ends(
    server_port: int,
) -> None:
    events = [Event("synthesize-start", {})]
    events += [Event("synthesize-chunk", {"text": "x" * 1000})] * 6  # 6000 > 4000 characters
    events += [Event("synthesize-stop", {})]
    data = b"".join(encode(e.type, e.data, None) for e in events)
    replies = await session(server_port, data)
    assert codes(replies) == [ErrorCode.TEXT_TOO_LONG]
    assert [e.type for e in replies if e is not None][-1] == "synthesize-stopped"


async def test_queued_audio_is_capped_per_connection(server_port: int) -> None:
    """Pipelined transcriptions: the third would make more than two minutes of audio held."""
    fmt = {"rate": 16000, "width": 2, "channels": 1}
    audio = b"\0\0" * 16000 * 41  # three of these are over the 2 × 60 s held per connection
    request = b"".join(
        encode(kind, data, payload)
        for kind, data, payload in [
            ("transcribe", {}, None),
            ("audio-start", fmt, None),
            ("audio-chunk", fmt, audio),
            ("audio-stop", {}, None),
        ]
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", server_port)
    try:
        writer.write(request * 3)
        await writer.drain()
        async with asyncio.timeout(60):
            while (event := await async_read_event(reader)).type != "error":
                pass
        assert event.data["code"] == ErrorCode.OVERLOADED
    finally:
        writer.close()


async def test_data_block_has_a_smaller_cap_than_audio(server_port: int) -> None:
    """16 clients each sending a 4 MiB block of `{}`s once took the server from 0.3 to 1.26 GB
    (parsed JSON is ~25 times its size); JSON data now stops at 256 KiB, audio does not."""
    block = b'{"text": [' + b"{}," * 100_000 + b"{}]}"  # 300 KB
    header = json.dumps({"type": "ping", "data_length": len(block)}).encode() + b"\n"
    replies = await session(server_port, header + block)
    assert codes(replies) == [ErrorCode.FRAME_TOO_LARGE] and "data" in replies[0].data["text"]
    fmt = {"rate": 16000, "width": 2, "channels": 1}
    audio = encode("audio-start", fmt, None) + encode("audio-chunk", fmt, b"\0\1" * 150_000)
    replies = await session(server_port, audio + encode("describe", {}, None))
    # a 300 KB audio payload is fine (the request, left without audio-stop, is answered
    # when the client ends its side: an empty transcript would be owed only at audio-stop)
    assert [e.type for e in replies[:-1]] == ["info"]
