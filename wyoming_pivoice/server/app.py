"""Starting the server: listen first, then load models, so `describe` is answered at once."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from functools import partial
from urllib.parse import urlparse

from wyoming.server import AsyncServer, AsyncStdioServer, AsyncTcpServer

from ..settings import ServerSettings
from ..zeroconf import Advertiser, default_name
from .handler import PivoiceEventHandler
from .services import Services

_LOGGER = logging.getLogger(__name__)


async def serve(settings: ServerSettings, ready: asyncio.Event | None = None) -> None:
    sys.setswitchinterval(0.0005)  # the loop gets the GIL back soon from loader threads
    services = Services.from_settings(settings)
    server = AsyncServer.from_uri(settings.uri)
    factory = partial(PivoiceEventHandler, services)
    stdio_task: asyncio.Task[None] | None = None
    if isinstance(server, AsyncStdioServer):
        stdio_task = asyncio.create_task(server.run(factory))  # one client: our stdin/stdout
    else:
        await server.start(factory)
    _LOGGER.info("Listening on %s", settings.uri)
    services.start_loading()

    advertiser: Advertiser | None = None
    if settings.zeroconf.enabled and isinstance(server, AsyncTcpServer):
        port = urlparse(settings.uri).port or 10800
        advertiser = Advertiser(
            settings.zeroconf.name or default_name("server"),
            port,
            settings.zeroconf.host or server.host,
        )
        await advertiser.start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    if stdio_task is not None:
        stdio_task.add_done_callback(lambda _task: stop.set())
    try:
        await stop.wait()
    finally:
        _LOGGER.info("Stopping")
        if advertiser is not None:
            await advertiser.stop()
        await server.stop()
