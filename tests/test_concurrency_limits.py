"""The connection limits, each enforced with a clear error (slots: test_server_slots.py):
requests queued on one connection (`overloaded`), silence (`idle`) and a client that reads
nothing (dropped after the write timeout, without the server buffering its replies)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from wyoming.event import Event, async_read_event
from wyoming.info import Describe
from wyoming.tts import Synthesize

from wyoming_pivoice.wire.errors import ErrorCode

from .helpers import (
    describe_works,
    encode,
    exchange,
    non_reader,
    open_connections,
    open_raw,
    server_process,
    server_process_of,
    wait_until_dropped,
)

MAX_CLIENTS = 3
IDLE = 4.0
WRITE_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def limited_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A server with small limits (its LLM loads only if asked, and nothing asks)."""
    log: Path = tmp_path_factory.mktemp("limited") / "server.log"
    with server_process(
        "--max-clients",
        str(MAX_CLIENTS),
        "--idle-timeout",
        str(IDLE),
        "--write-timeout",
        str(WRITE_TIMEOUT),
        "--llm-lazy",
        log=log,
    ) as port:
        yield port


async def read_all(reader: asyncio.StreamReader, timeout: float = 30.0) -> list[Event | None]:
    """Events until the server closes (None at the end)."""
    events: list[Event | None] = []
    async with asyncio.timeout(timeout):
        while True:
            event = await async_read_event(reader)
            events.append(event)
            if event is None:
                return events


async def test_silent_client_is_closed_with_idle_error(limited_port: int) -> None:
    reader, writer = await open_raw(limited_port)
    try:
        replies = await read_all(reader, timeout=IDLE + 30)
    finally:
        writer.close()
    assert [e.data["code"] for e in replies[:-1]] == [ErrorCode.IDLE] and replies[-1] is None


async def test_client_that_reads_nothing_is_dropped_and_blocks_nobody(limited_port: int) -> None:
    """Its replies (megabytes of them) stop at the socket buffers; after the write timeout
    the server drops it, and meanwhile others are served, speech included."""
    proc = server_process_of(limited_port)
    reader, writer = await non_reader(limited_port, describes=4000)
    try:
        replies = await exchange(
            limited_port, [Synthesize(text="Still here.").event()], "audio-stop"
        )
        assert replies[-1].type == "audio-stop"
        # The server drops us once a write has waited WRITE_TIMEOUT on our full buffers.
        ours = writer.get_extra_info("sockname")[1]
        await asyncio.to_thread(wait_until_dropped, proc, ours, WRITE_TIMEOUT + 30)
        # Now read what the server had managed to send: it ends (the server dropped us; we
        # did not close) well short of everything owed.
        received = 0
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(30):
                while data := await reader.read(1 << 16):
                    received += len(data)
    finally:
        writer.close()
    info = len(encode("info", (await info_data(limited_port)), None))
    assert received < 4000 * info / 2, (received, 4000 * info)
    assert await asyncio.to_thread(open_connections, proc) == []


async def info_data(port: int) -> dict:
    [event] = await exchange(port, [Describe().event()], "info")
    return event.data


async def test_too_many_queued_requests_are_refused_as_overloaded(server_port: int) -> None:
    """A client that pipelines more than 64 requests on one connection."""
    reader, writer = await open_raw(server_port)
    try:
        writer.write(encode("synthesize", {"text": "Hi."}, None) * 70)
        await writer.drain()
        codes = []
        async with asyncio.timeout(60):
            while len(codes) < 70 - 64 - 1:  # one may already be under way, not queued
                event = await async_read_event(reader)
                if event.type == "error":
                    codes.append(event.data["code"])
        assert set(codes) == {ErrorCode.OVERLOADED}
    finally:
        writer.close()
    await describe_works(server_port)
