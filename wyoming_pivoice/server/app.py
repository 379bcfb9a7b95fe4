"""Starting the server: listen first, then load models, so `describe` is answered at once."""

from __future__ import annotations

import asyncio
import logging
import sys
from functools import partial

from wyoming.server import AsyncServer, AsyncStdioServer

from ..settings import ServerSettings
from ..startup import advertise, stop_on_signals, withdraw
from .handler import PivoiceEventHandler
from .knowledge import TurnNotes, open_knowledge
from .services import Services

_LOGGER = logging.getLogger(__name__)


async def serve(settings: ServerSettings, ready: asyncio.Event | None = None) -> None:
    sys.setswitchinterval(0.0005)  # the loop gets the GIL back soon from loader threads
    services = Services.from_settings(settings)
    knowledge = open_knowledge(settings.knowledge) if settings.knowledge else None
    if knowledge is not None:  # the notes in each turn's prompt; indexed on a thread of its own
        services.conversations.notes = TurnNotes(knowledge)
    server = AsyncServer.from_uri(settings.uri)
    factory = partial(PivoiceEventHandler, services)
    stdio_task: asyncio.Task[None] | None = None
    if isinstance(server, AsyncStdioServer):
        stdio_task = asyncio.create_task(server.run(factory))  # one client: our stdin/stdout
    else:
        await server.start(factory)
    _LOGGER.info("Listening on %s", settings.uri)
    services.start_loading()
    if knowledge is not None:
        knowledge.start()

    advertiser = await advertise(settings.zeroconf, server, settings.uri, "server", 10800)

    stop = asyncio.Event()
    stop_on_signals(stop.set)
    if ready is not None:
        ready.set()
    if stdio_task is not None:
        stdio_task.add_done_callback(lambda _task: stop.set())
    try:
        await stop.wait()
    finally:
        _LOGGER.info("Stopping")
        await withdraw(advertiser)
        await server.stop()
        if knowledge is not None:
            knowledge.close()
