"""The server's LLM slot when the conversation runs on a remote engine (`--llm-url`).

It stands where the local model's ModelSlot stands (`services.llm`) and is called the same
way: `stream(fn)` with fn(engine, cancel) returning the reply's pieces — here the remote
engine's async stream, iterated on the event loop. There is no lock: the remote engine
queues or batches concurrent requests itself.

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
from collections.abc import AsyncGenerator, Callable
from typing import Any

from .. import compute_log
from ..realtime import Backoff
from .llm import LlamaChat
from .remote_llm import RemoteChat, RemoteLlmError
from .runtime import ModelSlot

_LOGGER = logging.getLogger(__name__)

PROBE_RETRY_S = 5.0  # first wait before the start-up probe asks an engine that failed it again
PROBE_RETRY_MAX_S = 60.0


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
                probe = await self.remote.probe()
                break
            except RemoteLlmError as err:
                _LOGGER.warning(
                    "%s; each turn tries again, this probe in %.0f s", err, backoff.delay
                )
            await backoff.wait()
        self.load_seconds = time.monotonic() - start
        _LOGGER.info(
            "Loaded %s in %.2f s (model %r, first piece %.3f s)",
            self.name,
            self.load_seconds,
            probe.model,
            probe.first_piece_s,
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
                pieces = fn(self.remote, threading.Event())
                async with contextlib.aclosing(pieces):
                    async for piece in pieces:
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
