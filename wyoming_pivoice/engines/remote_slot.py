"""The server's LLM slot when the conversation runs on a remote engine (`--llm-url`).

It stands where the local model's ModelSlot stands (`services.llm`) and is called the same
way: `stream(fn)` with fn(engine, cancel) returning the reply's pieces — here the remote
engine's async stream, iterated on the event loop.

Turns are scheduled here, not left to the engine: llama-cpp-python's server ends a running
stream when a new request arrives (16 of 40 starts lost a user's turn to our own start-up
probe; two clients at once lost one turn 3 times in 3, issue #22). A TurnGate lets
`RemoteChat.concurrency()` turns at once (--llm-concurrency, else what the engine is: 1 for
llama-cpp-python's server), in order of arrival; the start-up probe takes the gate like a
turn, so it never overlaps one. A turn waits for the gate up to the turn deadline, and its
first-piece timeout starts once it is the engine's. A stream cut before its first piece
(the connection dropped, the body ended unfinished) is asked once more.

With a fallback (`--llm-fallback local`), a turn the remote could not start (unreachable,
an error status, no first piece in time) is answered by the local model instead, and so
are the turns of the next `retry_after_s`: a remote that is down or stuck would otherwise
add its connect or first-piece timeout to every turn. A reply that breaks off mid-way ends
with the error, since its first words were already sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from .. import compute_log, realtime
from ..realtime import Backoff
from .llm import LlamaChat
from .remote_llm import RemoteChat, RemoteLlmError
from .runtime import ModelSlot

_LOGGER = logging.getLogger(__name__)

PROBE_RETRY_S = 5.0  # first wait before the start-up probe asks an engine that failed it again
PROBE_RETRY_MAX_S = 60.0


class TurnGate:
    """At most `width` turns at once, the rest waiting in order of arrival."""

    def __init__(self, width: int = 1) -> None:
        self.width = width
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(not f.done() for f in self._waiters)

    def resize(self, width: int) -> None:
        self.width = max(1, width)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.running < self.width:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.running += 1
                waiter.set_result(None)

    @contextlib.asynccontextmanager
    async def turn(self, timeout: float) -> AsyncIterator[None]:
        """Hold one place for the block; TimeoutError if none comes within `timeout`."""
        if self.running < self.width and not self.waiting:
            self.running += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with realtime.timeout(timeout):
                    await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self.running -= 1  # given a place, then cancelled: give it back
                    self._wake()
                else:
                    waiter.cancel()
                raise
        try:
            yield
        finally:
            self.running -= 1
            self._wake()


class RemoteLlmSlot:
    def __init__(
        self,
        remote: RemoteChat,
        fallback: ModelSlot[LlamaChat] | None = None,
        retry_after_s: float = 10.0,
    ) -> None:
        self.remote = remote
        self.fallback = fallback
        self.retry_after_s = retry_after_s
        self._local_until = 0.0  # monotonic time before which the fallback answers directly
        self.name = f"LLM (remote {remote.url})"
        self.load_seconds: float | None = None
        self._probe: asyncio.Task[None] | None = None
        self.gate = TurnGate(1)  # one at a time until the engine has said what it is

    def start_loading(self) -> None:
        """Ask the engine once (it may load its model then) and load the fallback."""
        if self._probe is None:
            self._probe = asyncio.get_running_loop().create_task(self._check())
        if self.fallback is not None:
            self.fallback.start_loading()

    async def _check(self) -> None:
        """Down (or still loading its model) at start is not fatal: every turn asks again, and
        so does this probe, backing off, until the engine has answered once (warm)."""
        start = time.monotonic()
        _LOGGER.info("Loading %s", self.name)
        backoff = Backoff(PROBE_RETRY_S, PROBE_RETRY_MAX_S)
        while True:
            try:
                async with self.gate.turn(self.remote.settings.turn_timeout):
                    probe = await self.remote.probe()
                    width = await self.remote.concurrency()
                break
            except (RemoteLlmError, TimeoutError, asyncio.TimeoutError) as err:
                _LOGGER.warning(
                    "%s; each turn tries again, this probe in %.0f s", err, backoff.delay
                )
            await backoff.wait()
        self.load_seconds = time.monotonic() - start
        self.gate.resize(width)
        _LOGGER.info(
            "Loaded %s in %.2f s (model %r, first piece %.3f s; %s engine, %d turn%s at once)",
            self.name,
            self.load_seconds,
            probe.model,
            probe.first_piece_s,
            self.remote.kind,
            width,
            "" if width == 1 else "s",
        )
        compute_log.current().record_load("llm", probe.model, self.load_seconds)

    @property
    def loaded(self) -> bool:
        """The engine answered the start-up probe."""
        return self.load_seconds is not None

    async def get(self) -> RemoteChat:
        return self.remote

    @property
    def answering(self) -> str:
        """Which engine takes the next turn."""
        if self.fallback is not None and time.monotonic() < self._local_until:
            return f"local fallback ({self.fallback.name})"
        return f"remote ({self.remote.url})"

    async def stream(self, fn: Callable[[Any, threading.Event], Any]) -> AsyncGenerator[str, None]:
        if self.fallback is None or time.monotonic() >= self._local_until:
            try:
                async with contextlib.aclosing(self._remote(fn)) as remote:
                    async for piece in remote:
                        yield piece
                return
            except RemoteLlmError as err:
                if self.fallback is None or err.started:
                    raise
                self._local_until = time.monotonic() + self.retry_after_s
                _LOGGER.warning(
                    "%s; the local model answers (the remote is tried again in %.0f s)",
                    err,
                    self.retry_after_s,
                )
        assert self.fallback is not None
        async with contextlib.aclosing(self.fallback.stream(fn)) as local:
            async for piece in local:
                yield piece

    async def _remote(self, fn: Callable[[Any, threading.Event], Any]) -> AsyncGenerator[str, None]:
        """The turn on the engine once the gate lets it in; a cut before its first piece is
        asked once more."""
        wait_s = self.remote.settings.turn_timeout
        try:
            async with self.gate.turn(wait_s):
                for attempt in (1, 2):
                    try:
                        pieces = fn(self.remote, threading.Event())
                        async with contextlib.aclosing(pieces):
                            async for piece in pieces:
                                yield piece
                        return
                    except RemoteLlmError as err:
                        if attempt == 2 or err.started or not err.cut:
                            raise
                        _LOGGER.warning("%s; asking it once more", err)
        except (TimeoutError, asyncio.TimeoutError):
            raise RemoteLlmError(
                f"remote LLM at {self.remote.url}: no turn free within {wait_s:g} s "
                f"({self.gate.running} running, {self.gate.waiting} waiting)",
                started=False,
            ) from None
