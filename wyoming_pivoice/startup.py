"""Starting and stopping an endpoint, one way for all three: the server, the standalone
satellite and the Home Assistant satellite.

- `run`: the process. SIGTERM/SIGINT end it quietly until its event loop takes them over
  (no KeyboardInterrupt traceback while models import), and an exit need not wait for the
  interpreter's teardown.
- `stop_on_signals`: inside the loop, the first SIGTERM/SIGINT calls the endpoint's stop;
  later ones are ignored, so they cannot cut its clean-up short (and leave a mic or speaker
  command running).
- `advertise`/`withdraw`: the zeroconf advert of a TCP endpoint, as its settings say.
- `StartupError`: a mistake in the options or the machine (a port in use, a model that will
  not load) ends the start with one ERROR line that says what to do, never a traceback.

Each signal or advert is bound to the endpoint when it is ready for it: a server listens
before it loads models (HA's `describe` gets an answer), the Home Assistant satellite is
advertised once its VAD has loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from . import realtime
from .zeroconf import Advertiser, ZeroconfSettings, default_name, detect_host

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
    except StartupError as err:
        _LOGGER.error("%s", err)
        code = err.code
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
    """Advertise a TCP endpoint as `_wyoming._tcp` (None: zeroconf off, or not over TCP).

    The satellite calls it once it is ready, so it also logs the ready line then.
    """
    from wyoming.server import AsyncTcpServer

    if role == "satellite":
        _LOGGER.info("Ready: %s", how_to_add(role, uri, settings, default_port))

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
        async with realtime.timeout(timeout):
            await advertiser.stop()
    except Exception as err:
        _LOGGER.warning("Withdrawing the zeroconf advert failed: %r", err)


class StartupError(Exception):
    """A start that cannot go on, in one line that says what to do; `code` is the exit status
    (2: the options, 1: the machine or a model)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


async def listen(server: AsyncServer, factory: Any, uri: str) -> None:
    """Start a Wyoming server; a port in use (and the like) is a StartupError with the fix."""
    try:
        await server.start(factory)
    except OSError as err:
        port = urlparse(uri).port
        if err.errno == errno.EADDRINUSE:
            raise StartupError(
                f"Cannot listen on {uri}: the port is in use (another wyoming-pivoice or "
                f"Wyoming server?). Stop it (`ss -ltnp 'sport = :{port}'` shows which), "
                f"or choose another port: --uri tcp://0.0.0.0:{(port or 10800) + 1}"
            ) from None
        if err.errno == errno.EACCES and port is not None and port < 1024:
            raise StartupError(
                f"Cannot listen on {uri}: ports below 1024 need root; use e.g. "
                "--uri tcp://0.0.0.0:10800"
            ) from None
        if err.errno == errno.EADDRNOTAVAIL:
            raise StartupError(
                f"Cannot listen on {uri}: this machine has no such address; use "
                f"--uri tcp://0.0.0.0:{port or 10800} (every address)"
            ) from None
        raise StartupError(f"Cannot listen on {uri}: {err.strerror or err}") from None


def reachable_host(uri: str, zeroconf: ZeroconfSettings) -> str | None:
    """The host Home Assistant should be given for a TCP `uri` (None: not over TCP)."""
    parsed = urlparse(uri)
    if parsed.scheme != "tcp":
        return None
    if parsed.hostname in (None, "", "0.0.0.0", "::"):
        return zeroconf.host or detect_host()
    return parsed.hostname


def how_to_add(role: str, uri: str, zeroconf: ZeroconfSettings, default_port: int) -> str:
    """How to add this endpoint to Home Assistant, for the ready line."""
    host = reachable_host(uri, zeroconf)
    if host is None:
        return f"{uri} is not reachable from Home Assistant (serve --uri tcp://0.0.0.0:PORT)"
    if host.startswith("127."):
        if urlparse(uri).hostname in ("0.0.0.0", "::"):
            return f"{uri}: this machine has no address but loopback (no network yet?)"
        return f"{uri} listens on loopback only: Home Assistant on another machine cannot reach it"
    port = urlparse(uri).port or default_port
    text = (
        "add it in Home Assistant: Settings → Devices & services → Add integration → "
        f"Wyoming Protocol, host {host}, port {port}"
    )
    if zeroconf.enabled:
        name = zeroconf.name or default_name(role)
        text += f" (or Configure the discovered {name})"
    return text


def audio_device_problem(spec: str | None, want_input: bool) -> str | None:
    """Why PortAudio has no device `spec` (an index or part of a name, as the satellite
    finds it), naming those it has; None when it has one (or `spec` is the default)."""
    if spec in (None, "", "default") or (not want_input and spec == "null"):
        return None
    from .doctor.audio import probe_pyaudio  # asks PortAudio with ALSA's noise silenced

    report = probe_pyaudio()
    kind = "input" if want_input else "output"
    flag = "--mic-device" if want_input else "--snd-device"
    if report.error:
        return f"{flag} {spec!r}: {report.error}"
    have = [d for d in report.devices if (d.inputs if want_input else d.outputs) > 0]
    if spec.isdigit():
        found = any(d.index == int(spec) for d in have)
    else:
        found = any(spec.lower() in d.name.lower() for d in have)
    if found:
        return None
    if not have:
        tool = "arecord" if want_input else "aplay"
        command = "--mic-command 'arecord …'" if want_input else "--snd-command 'aplay …'"
        return (
            f"{flag} {spec!r}: PortAudio finds no {kind} device at all (is a sound card "
            f"plugged in? `{tool} -l` lists them); or use {command}"
        )
    listed = ", ".join(f"{d.index} '{d.name}'" for d in have)
    return f"{flag} {spec!r}: no such {kind} device; give an index or part of a name: {listed}"
