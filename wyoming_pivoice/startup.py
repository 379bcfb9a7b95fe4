"""Starting and stopping an endpoint, one way for all three: the server, the standalone
satellite and the Home Assistant satellite.

- `run`: the process. SIGTERM/SIGINT end it quietly until its event loop takes them over
  (no KeyboardInterrupt traceback while models import), and an exit need not wait for the
  interpreter's teardown.
- `stop_on_signals`: inside the loop, the first SIGTERM/SIGINT calls the endpoint's stop;
  later ones are ignored, so they cannot cut its clean-up short (and leave a mic or speaker
  command running).
- `advertise`/`withdraw`: the zeroconf advert of a TCP endpoint, as its settings say.

Each signal or advert is bound to the endpoint when it is ready for it: a server listens
before it loads models (HA's `describe` gets an answer), the Home Assistant satellite is
advertised once its VAD has loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from .zeroconf import Advertiser, ZeroconfSettings, default_name

if TYPE_CHECKING:
    from wyoming.server import AsyncServer

_LOGGER = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SIGNALLED = "signalled"


def run(main: Callable[[], Coroutine[Any, Any, int | None]], fast_exit: bool = False) -> int:
    """Run `main()` in a new event loop; returns its exit code (0 after a signal).

    `fast_exit`: once `main` has closed everything (mic and speaker commands ended, files
    written), skip the interpreter's teardown of onnxruntime and friends, which alone takes
    0.2 s here and more on a Pi, so that a stop takes well under a second.
    """
    for sig in SIGNALS:
        signal.signal(sig, _exit_quietly)
    try:
        code = int(asyncio.run(main()) or 0)
    except SystemExit as stop:
        if stop.code != _SIGNALLED:
            raise
        _LOGGER.info("Stopped by a signal")
        code = 0
    if fast_exit:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _exit_quietly(signum: int, frame: object) -> None:
    raise SystemExit(_SIGNALLED)


def stop_on_signals(stop: Callable[[], object]) -> None:
    """From now on in the running loop, the first SIGTERM/SIGINT calls `stop`."""
    loop = asyncio.get_running_loop()
    stopping = False

    def on_signal(sig: signal.Signals) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        _LOGGER.info("Stopping on %s", sig.name)
        stop()

    for sig in SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)


async def advertise(
    settings: ZeroconfSettings, server: AsyncServer, uri: str, role: str, default_port: int
) -> Advertiser | None:
    """Advertise a TCP endpoint as `_wyoming._tcp` (None: zeroconf off, or not over TCP)."""
    from wyoming.server import AsyncTcpServer

    if not settings.enabled or not isinstance(server, AsyncTcpServer):
        return None
    advertiser = Advertiser(
        settings.name or default_name(role),
        urlparse(uri).port or default_port,
        settings.host or server.host,
    )
    await advertiser.start()
    return advertiser


async def withdraw(advertiser: Advertiser | None, timeout: float | None = None) -> None:
    """Unregister the advert; its goodbye packets are a courtesy a stop may bound."""
    if advertiser is None:
        return
    try:
        await asyncio.wait_for(advertiser.stop(), timeout)
    except Exception as err:
        _LOGGER.warning("Withdrawing the zeroconf advert failed: %r", err)
