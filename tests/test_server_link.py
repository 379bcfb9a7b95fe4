"""The satellite's link to the server: a cancelled read ends, whatever arrives with the cancel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from wyoming.audio import AudioChunk
from wyoming.event import async_read_event, async_write_event
from wyoming.tts import SynthesizeStart

from wyoming_pivoice.satellite.stages import ServerLink


@pytest.fixture
async def chunk_server() -> AsyncIterator[int]:
    """A loopback server that answers every event with one audio chunk."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunk = AudioChunk(rate=16000, width=2, channels=1, audio=bytes(640)).event()
        try:
            while await async_read_event(reader) is not None:
                await async_write_event(chunk, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def test_a_cancel_that_meets_an_arriving_event_ends_the_read(
    chunk_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A barge-in cancels the turn's run while its TTS audio streams in. The cancel is made
    # here in the very callback that hands the chunk to the reader: the race at its
    # narrowest. Python 3.11's wait_for (the client's own read timeout) returned the chunk
    # then, and the abandoned run played on to the end of its reply.
    link = ServerLink(f"tcp://127.0.0.1:{chunk_server}", read_timeout=60.0)
    reading: asyncio.Task[object] | None = None
    feed = asyncio.StreamReader.feed_data

    def feed_then_cancel(self: asyncio.StreamReader, data: bytes) -> None:
        feed(self, data)
        if reading is not None and b"audio-chunk" in data:  # the chunk the client reads
            reading.cancel()

    async with link.connect("synthesis") as conn:
        await conn.send(SynthesizeStart().event())
        assert AudioChunk.is_type((await conn.receive()).type)  # the link itself works
    monkeypatch.setattr(asyncio.StreamReader, "feed_data", feed_then_cancel)
    for _ in range(5):  # a connection each: a cancelled read leaves its chunk unread
        async with link.connect("synthesis") as conn:
            reading = asyncio.create_task(conn.receive())
            await conn.send(SynthesizeStart().event())
            await asyncio.wait({reading})
            assert reading.cancelled(), f"the read returned {reading.result().type} when cancelled"
            reading = None
