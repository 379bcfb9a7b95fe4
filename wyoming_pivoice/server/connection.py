"""One client connection: its lifecycle, deadlines, slot, and the ordered answers to it.

The reader loop only validates events and queues work (`handle_event`, handler.py); a
per-connection worker runs the queued requests in order (so replies keep the order of
requests) while the reader keeps watching the socket, so a client that vanishes cancels its
own work at once and frees the model for everybody else. A client that stops reading holds
only its own connection, never a model, and is dropped after `limits.write_timeout`.

Every request gets the answer its client waits for, whatever happens: a refused or failed
one gets `error` and then the in-band end Home Assistant reads (errors.py). Refusals are
queued like requests, so they keep the order of replies. A frame we cannot read, an idle or
too slow client, an eviction: `error`, then close. A connection is admitted to a slot only
once its first request has been read, so a refusal for want of a slot (`busy`) still gets
its in-band answer before the close. The limits are listed in limits.py; slots in slots.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from wyoming.event import Event

from ..engines.protocols import EngineUnavailable
from ..wire.errors import Closing, ErrorCode
from ..wire.hardened import HardenedConnection
from .errors import Owed, RequestError, ending
from .services import Services
from .slots import Slot

_LOGGER = logging.getLogger(__name__)

# Events that are not requests: answered, but they keep no connection alive (slots.py).
_NOT_REQUESTS = {"ping", "describe"}
# Runs of events whose start we must remember to end a failed request cleanly.
_RUNS = {"audio", "transcript", "handled"}

Write = Callable[[Event], Awaitable[None]]


@dataclass
class _Job:
    owed: Owed  # what its client waits for if it fails
    run: Callable[[], Awaitable[None]]
    request: bool = True  # counts against `max_pending` (refusal answers do not)


class Queue:
    """A connection's requests, run one at a time in the order they came.

    `put` refuses a request over `max_pending` (`force`: the end a streaming client waits
    for, never refused).
    """

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self.jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self.pending = 0  # requests queued or running (refusal answers excluded)
        self.running = False  # the worker is on a job

    def put(self, owed: Owed, run: Callable[[], Awaitable[None]], force: bool = False) -> None:
        if self.pending >= self.max_pending and not force:
            raise RequestError(
                f"too many pending requests (limit {self.max_pending})", ErrorCode.OVERLOADED
            )
        self.pending += 1
        self.jobs.put_nowait(_Job(owed, run))

    def answer(self, run: Callable[[], Awaitable[None]], owed: Owed = Owed.NOTHING) -> None:
        """Queue an answer that is not a request (a refusal, a reply owed after the rest)."""
        self.jobs.put_nowait(_Job(owed, run, request=False))

    @property
    def idle(self) -> bool:
        return self.pending == 0 and not self.running and self.jobs.empty()


class Connection(HardenedConnection):
    """The lifecycle of one connection; `handle_event` and `receiving` say what its events
    mean (handler.py). Its reads, writes and refusals are bounded by wire/hardened.py."""

    def __init__(
        self,
        services: Services,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        limits = services.settings.limits
        super().__init__(
            reader,
            writer,
            max_frame_bytes=limits.max_frame_bytes,
            max_data_bytes=limits.max_data_bytes,
            frame_timeout=limits.frame_timeout,
            write_timeout=limits.write_timeout,
        )
        self.services = services
        self.limits = limits
        self.slot = Slot(self.host, idle=self.evictable, evict=self.evict)
        self.queue = Queue(self.limits.max_pending)
        self._worker: asyncio.Task[None] | None = None
        self._request_deadline: float | None = None  # a request being received must end by then
        self._open_runs: set[str] = set()  # audio/transcript/handled runs started, not stopped
        self._draining = False  # refused `busy`: the client's audio is dropped until its end

    # ---- what the events mean (handler.py) ------------------------------------------------

    def receiving(self) -> bool:
        """A request is being received (its first event in, its last not yet)."""
        return False

    def owed_by(self, event_type: str) -> Owed:
        """What a refused event of this type owes its client (unless its error says)."""
        return Owed.NOTHING

    def is_request(self, event_type: str) -> bool:
        """An event that asks for work: the first one admits the connection to a slot."""
        return event_type not in _NOT_REQUESTS

    # ---- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Read events until the client leaves; answer bad frames with an error, then close."""
        services = self.services
        services.clients += 1
        try:
            if not services.connections.enter(self.slot):
                # Only when every waiting connection is mid-frame: nothing can be read here.
                self.refused = True
                await self.error(
                    f"server busy: {services.connections.waiting} connections are sending",
                    ErrorCode.BUSY,
                )
                return
            self._worker = asyncio.create_task(self._work(), name=f"pivoice worker {self.peer}")
            while await self._read_one():
                pass
            # The client finished sending; let queued replies go out before closing.
            if not self._worker.done():
                await self.queue.jobs.put(_STOP)
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await self._worker
        finally:
            services.connections.release(self.slot)
            if self._worker is not None:
                self._worker.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._worker  # also collects a worker that died of a lost client
            if self.refused and services.clients <= 2 * self.limits.max_clients:
                await self.linger()
            services.clients -= 1
            self.writer.close()

    def busy(self) -> bool:
        """A request in flight: being received, queued, running or its replies going out."""
        return not self.queue.idle or self.receiving()

    def eviction_undone(self) -> None:
        self.services.connections.readmit(self.slot)

    # ---- reading, with its deadlines (the reading itself: wire/hardened.py) ---------------

    def next_frame_deadline(self) -> float:
        """A request being received ends by its deadline; else the idle clock runs."""
        if self._request_deadline is not None:
            return self._request_deadline
        return self.slot.last_request + self.limits.idle_timeout

    def frame_missed(self) -> None:
        """Closing when the client was idle too long, or left a request unfinished for too
        long. A client whose replies are still going out is not idle."""
        if self._request_deadline is not None:
            raise Closing(
                f"request not complete within {self.limits.request_timeout:.0f} s",
                ErrorCode.TIMEOUT,
            )
        if self.busy():
            self.slot.touch()
            return
        _LOGGER.info("%s idle for %.0f s, closing", self.peer, self.limits.idle_timeout)
        raise Closing("idle timeout", ErrorCode.IDLE)

    async def _read_one(self) -> bool:
        """Read and dispatch one event; False ends the connection."""
        event = await self.read_event_bounded()
        if event is None:
            return False
        if self._draining:
            return event.type != "audio-stop"  # the refused audio's end: now close
        if self._worker is not None and self._worker.done():
            return False  # the worker died (client gone while writing)
        event_type = event.type if isinstance(event.type, str) else ""
        if self.is_request(event_type):
            if not self.slot.admitted and not await self._admit(event_type):
                if self.owed_by(event_type) is not Owed.TRANSCRIPT or event_type == "audio-stop":
                    return False
                # Home Assistant writes all its audio before it reads: a close now would
                # reset it mid-stream. Its audio is read and dropped until audio-stop (within
                # the request deadline); the empty transcript already waits in its buffer.
                self._draining = True
                self._request_deadline = time.monotonic() + self.limits.request_timeout
                return True
            self.slot.touch()

        try:
            return await self.handle_event(event)
        except RequestError as err:
            owed = err.owed or self.owed_by(event_type)
            _LOGGER.info("%s: refused %s: %s (%s)", self.peer, event_type, err.code, err)
            if self.queue.jobs.qsize() >= 2 * self.limits.max_pending:
                # Refusals piling up faster than the client reads their answers.
                await self.close_with(
                    "too many refused requests waiting to be answered", ErrorCode.OVERLOADED
                )
                return False
            self.queue.answer(partial(self._answer, err, owed), owed)
            return True
        except Closing as err:
            await self.close_with(str(err), err.code)
            return False
        except ConnectionError:
            return False  # gone while we answered it (or dropped for not reading)
        finally:
            self._track_request()

    async def _admit(self, event_type: str) -> bool:
        """A slot for the connection whose first request is `event_type`; refused (False),
        the client gets `busy` and the end it waits for, then the connection closes."""
        table = self.services.connections
        if table.admit(self.slot):
            return True
        # A stream refused at its start ends at once: the connection closes.
        owed = Owed.STREAM_END if event_type == "synthesize-start" else self.owed_by(event_type)
        _LOGGER.info("%s: refused %s: every slot has a request in flight", self.peer, event_type)
        self.refused = True
        error = RequestError(
            f"server busy: all {len(table)} connections have a request in flight", ErrorCode.BUSY
        )
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._answer(error, owed)
        return False

    def _track_request(self) -> None:
        """A request being received must end within `request_timeout` of its first event."""
        if not self.receiving():
            self._request_deadline = None
        elif self._request_deadline is None:
            self._request_deadline = time.monotonic() + self.limits.request_timeout

    # ---- answering ------------------------------------------------------------------------

    async def reply(self, event: Event) -> None:
        """Answer at once if nothing is owed before it; else in its place after the rest."""
        if self.queue.jobs.empty() and not self.queue.running:
            await self.write_event(event)
            return
        if self.queue.jobs.qsize() >= 2 * self.limits.max_pending:
            raise Closing("too many requests waiting to be answered", ErrorCode.OVERLOADED)
        self.queue.answer(partial(self.write_event, event))

    async def _work(self) -> None:
        queue = self.queue
        while True:
            job = await queue.jobs.get()
            if job is _STOP:
                return
            queue.running = True
            try:
                await job.run()
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as err:
                await self.report(err, job.owed)
            finally:
                queue.running = False
                if job.request:
                    queue.pending -= 1
                self.slot.touch()  # the idle clock starts when the replies are out

    async def report(self, err: Exception, owed: Owed) -> None:
        """A failed request's `error` event and the end its client waits for."""
        if isinstance(err, EngineUnavailable):
            # Not our bug: one line says which engine and why; no trace.
            _LOGGER.warning("%s: %s", self.peer, err)
            err = RequestError(str(err), ErrorCode.UNAVAILABLE)
        elif not isinstance(err, RequestError):
            _LOGGER.error("%s: request failed", self.peer, exc_info=err)
            err = RequestError(f"internal error: {err}", ErrorCode.INTERNAL)
        await self._answer(err, owed)

    async def _answer(self, err: RequestError, owed: Owed) -> None:
        await self.error(str(err), err.code)
        rate = self.services.description.voice.sample_rate
        for event in ending(owed, err.code, self._open_runs, rate):
            await self.write_event(event)

    async def write_event(self, event: Event) -> None:
        """Write one event (bounded: hardened.py), noting the runs it starts and stops."""
        run, _, part = event.type.partition("-")
        if run in _RUNS and part == "start":
            self._open_runs.add(run)
        elif run in _RUNS and part == "stop":
            self._open_runs.discard(run)
        await super().write_event(event)


async def _stop_marker() -> None:
    """Queued last when the client has finished sending."""


_STOP = _Job(Owed.NOTHING, _stop_marker, request=False)
