"""One engine, many clients (issue #22): llama-cpp-python's server with its default
`--interrupt_requests` (a new request ends the running stream), started here on loopback.

Our server schedules the turns itself: it sees the engine is llama-cpp-python's and sends
one turn at a time, its start-up probe takes its turn like any other, so neither the probe
nor a second client cuts a turn short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from wyoming.client import AsyncTcpClient

from wyoming_pivoice.engines.llm import LlmSettings
from wyoming_pivoice.engines.remote_llm import RemoteLlmSettings
from wyoming_pivoice.engines.remote_slot import RemoteLlmSlot
from wyoming_pivoice.server.services import Services
from wyoming_pivoice.settings import ServerSettings

from .helpers import in_process_server, read_until, turn_event
from .llama_server import LlamaServer

LONG = "Write a long story about a dragon who lives in a castle."


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(tmp_path_factory.mktemp("engine") / "llama_server.log", interrupt=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def services_for(engine: LlamaServer, max_tokens: int = 24) -> Services:
    settings = ServerSettings(
        remote_llm=RemoteLlmSettings(url=engine.url, timeout=60),
        llm=LlmSettings(max_tokens=max_tokens),
    )
    return Services.from_settings(settings)


async def turn(port: int, text: str) -> str:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(turn_event(text))
        replies = await read_until(client, "handled", "not-handled", "error", timeout=240)
        assert replies[-1].type == "handled", [(e.type, e.data) for e in replies[-2:]]
        return str(replies[-1].data["text"])


async def test_the_start_up_probe_never_cuts_a_turn(engine: LlamaServer) -> None:
    """A turn sent the moment the server starts (the issue: 16 of 40 starts lost it)."""
    for _start in range(3):
        services = services_for(engine)
        slot = services.llm
        assert isinstance(slot, RemoteLlmSlot)
        async with in_process_server(services) as port:
            slot.start_loading()
            assert await turn(port, LONG)
            assert slot._probe is not None
            await asyncio.wait_for(slot._probe, 240)
        assert slot.remote.kind == "llama-cpp-python" and slot.gate.width == 1


async def test_two_clients_at_once_through_one_engine(engine: LlamaServer) -> None:
    services = services_for(engine)
    slot = services.llm
    assert isinstance(slot, RemoteLlmSlot)
    async with in_process_server(services) as port:
        slot.start_loading()
        replies = await asyncio.gather(
            turn(port, LONG), turn(port, "What is the capital of France?")
        )
        assert all(replies), replies
