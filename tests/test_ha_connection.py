"""The connection to Home Assistant keeps the order of what the satellite sends: an event goes
to the socket at once when nothing is waiting (a barge-in's run-pipeline does not wait for
the writer task), and into the outbox behind anything that is."""

from __future__ import annotations

import asyncio

from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.ping import Ping
from wyoming.pipeline import PipelineStage, RunPipeline
from wyoming.server import AsyncTcpServer

from wyoming_pivoice.satellite.ha.connection import Connections, HaConnection

from .helpers import free_port

CHUNK = bytes(64 * 1024)  # big enough that a few fill the socket's buffers: the outbox is used


async def test_events_reach_home_assistant_in_the_order_sent() -> None:
    claimed = asyncio.Event()

    async def handle(conn: HaConnection, event: Event) -> bool:
        await connections.claim(conn)
        claimed.set()
        return True

    connections = Connections(handle, on_connect=lambda: None, on_disconnect=lambda: None)
    port = free_port()
    server = AsyncTcpServer("127.0.0.1", port)
    await server.start(connections.factory)
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    try:
        await client.write_event(Ping().event())
        await asyncio.wait_for(claimed.wait(), 10)
        conn = connections.active
        assert conn is not None
        sent: list[str] = []
        for n in range(200):  # HA reads nothing meanwhile
            if n % 50 == 10:
                connections.send(RunPipeline(PipelineStage.ASR, PipelineStage.TTS).event())
                sent.append("run-pipeline")
            connections.send(
                AudioChunk(rate=16000, width=2, channels=1, audio=CHUNK, timestamp=n).event()
            )
            sent.append(f"chunk {n}")
            if n == 0:
                assert conn._outbox.empty()  # nothing was waiting: it went to the socket
        connections.send(Ping(text="last").event())
        sent.append("ping")
        assert conn._outbox.qsize() > 0  # the rest waits for HA to read

        got: list[str] = []
        while len(got) < len(sent):
            event = await asyncio.wait_for(client.read_event(), 10)
            assert event is not None, got[-3:]
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                assert chunk.audio == CHUNK
                got.append(f"chunk {chunk.timestamp}")
            else:
                got.append(event.type)
        assert got == sent
    finally:
        await client.disconnect()
        connections.abort_all()
        await server.stop()
