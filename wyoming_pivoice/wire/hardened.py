"""One Wyoming connection to an untrusted peer, every read, write and wait bounded.

- reads: frames through BoundedReader (framing.py: block sizes checked before reading);
  the next frame must begin by `next_frame_deadline()` (the subclass decides: idle, a
  request's deadline; `frame_missed` says what passing it means) and, once its first
  byte is in, be complete within `frame_timeout`. A frame we cannot read: `error`, close.
- writes: each within `write_timeout`, so a peer that reads nothing is dropped and never
  holds more than the socket buffers (the bounded outbox).
- refusals: `close_with` sends `error` and marks the connection refused; `linger` then
  reads and drops what the peer still sends for up to a second before the close, since
  closing on unread input resets the connection and a reset can destroy the `error`.
- eviction: `evictable` says whether the connection may be closed to make room (nothing in
  flight, nothing unread, blocked on the peer, or a frame trickling in for SLOW_FRAME_S);
  `evict` closes it at its next wait, with `evicted`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.server import AsyncEventHandler

from ..realtime import timeout
from .errors import Closing, ErrorCode
from .framing import BoundedReader

_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")

SLOW_FRAME_S = 1.0  # a frame still arriving after this, with nothing in flight, is evictable


class HardenedConnection(AsyncEventHandler):
    """The bounded reading, writing and closing of one connection; the subclass gives the
    meaning (`handle_event`), the frame deadline and whether it is busy."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_frame_bytes: int,
        max_data_bytes: int,
        frame_timeout: float,
        write_timeout: float,
    ) -> None:
        super().__init__(reader, writer)
        self.bounded = BoundedReader(reader, max_frame_bytes, max_data_bytes)
        self.frame_timeout = frame_timeout
        self.write_timeout = write_timeout
        self.peer = writer.get_extra_info("peername")
        self.host = str(self.peer[0]) if isinstance(self.peer, tuple) and self.peer else "local"
        self.refused = False  # closing on a frame or client we refused: linger first
        self._evicted = asyncio.Event()
        self._blocked = False  # waiting on the peer for the next frame's first byte
        self._frame_since: float | None = None  # when the frame being read began

    # ---- what the subclass decides --------------------------------------------------------

    def next_frame_deadline(self) -> float:
        """The monotonic time by which the next frame must begin."""
        return time.monotonic() + 3600.0

    def frame_missed(self) -> None:
        """The deadline passed with no frame: raise Closing, or return to wait again (until
        a new `next_frame_deadline`)."""
        raise Closing("idle timeout", ErrorCode.IDLE)

    def busy(self) -> bool:
        """Something in flight on this connection (it may then not be evicted)."""
        return False

    # ---- eviction -------------------------------------------------------------------------

    def evictable(self) -> bool:
        """Nothing in flight and nothing to read: blocked on a peer that sends nothing, or
        one whose frame has been trickling in for over SLOW_FRAME_S (slow-loris; a real
        client's frame takes milliseconds). Bytes in the buffer may be a request whose task
        has not run yet: never evicted."""
        if self.busy():
            return False
        if self._frame_since is not None:
            return time.monotonic() - self._frame_since > SLOW_FRAME_S
        return self._blocked and not self.bounded.pending

    def evict(self) -> None:
        """Close this connection at its next wait, to make room for another."""
        self._evicted.set()

    def eviction_undone(self) -> None:
        """The peer's next frame arrived in the same instant as its eviction: it is kept
        (the subclass gives its place back)."""

    async def until_closed(self, waiting: Awaitable[T], timeout: float) -> T:
        """`waiting`, unless the connection is evicted first (Closing) or `timeout` passes."""
        task = asyncio.ensure_future(waiting)
        evicted = asyncio.ensure_future(self._evicted.wait())
        try:
            done, _ = await asyncio.wait(
                {task, evicted}, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            evicted.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if self._evicted.is_set():
            raise Closing("closed to make room for another client", ErrorCode.EVICTED)
        raise asyncio.TimeoutError

    # ---- reading --------------------------------------------------------------------------

    async def wait_for_frame(self) -> bool:
        """Wait for the next frame to begin (False: the peer has gone); Closing when its
        deadline passes and `frame_missed` says so."""
        while True:
            deadline = self.next_frame_deadline()
            try:
                self._blocked = True
                began = await self.until_closed(
                    self.bounded.wait_for_frame(), deadline - time.monotonic()
                )
            except asyncio.TimeoutError:
                self.frame_missed()
                continue
            finally:
                self._blocked = False
            if began and self._evicted.is_set():
                # Its bytes came in the same loop turn as the eviction: a request may be
                # among them, and no request is evicted.
                self._evicted.clear()
                self.eviction_undone()
            return began

    async def read_event_bounded(self) -> Event | None:
        """The next event; None when the connection ends (after `error` if we close it)."""
        try:
            if not await self.wait_for_frame():
                return None
            self._frame_since = time.monotonic()
            try:
                event = await self.until_closed(
                    async_read_event(self.bounded),  # type: ignore[arg-type]
                    self.frame_timeout,
                )
            finally:
                self._frame_since = None
        except Closing as err:
            await self.close_with(str(err), err.code)
            return None
        except asyncio.TimeoutError:
            _LOGGER.info("%s sent a partial frame for %.0f s", self.peer, self.frame_timeout)
            await self.close_with(
                f"frame not complete within {self.frame_timeout:.0f} s", ErrorCode.TIMEOUT
            )
            return None
        except (asyncio.IncompleteReadError, ConnectionError):
            _LOGGER.info("%s vanished mid-frame", self.peer)
            return None
        except Exception as err:
            # A frame whose JSON parsed but is not an event (a list, no "type", a length
            # that is not a number), or JSON nested too deep to parse.
            await self.close_with(f"malformed frame: {err!r}", ErrorCode.MALFORMED)
            return None
        if event is None:
            if self.bounded.violation:
                await self.close_with(self.bounded.violation, ErrorCode.FRAME_TOO_LARGE)
            elif self.bounded.got_line:  # bytes that are not an event (not a clean end)
                await self.close_with("malformed frame: not a JSON event", ErrorCode.MALFORMED)
        return event

    # ---- writing and closing --------------------------------------------------------------

    async def write_event(self, event: Event) -> None:
        """Write one event; a peer that reads nothing for `write_timeout` is dropped.

        Without the bound, `drain()` waits forever on a peer that stopped reading.
        """
        try:
            async with timeout(self.write_timeout):
                await async_write_event(event, self.writer)
        except asyncio.TimeoutError:
            _LOGGER.warning(
                "%s read nothing for %.0f s, dropping it", self.peer, self.write_timeout
            )
            self.writer.transport.abort()  # frees the unsent buffer; the reader sees EOF
            raise ConnectionResetError("client stopped reading") from None

    async def close_with(self, text: str, code: ErrorCode) -> None:
        """`error`, then close (after lingering: a peer still sending gets to read why)."""
        self.refused = True
        await self.error(text, code)

    async def error(self, text: str, code: ErrorCode) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.write_event(Error(text=text, code=code.value).event())

    async def linger(self, seconds: float = 1.0, max_bytes: int = 1 << 20) -> None:
        """Before closing on a refusal, let the peer's unread bytes in and drop them."""

        async def discard() -> None:
            received = 0
            while received < max_bytes:
                data = await self.reader.read(65536)
                if not data:
                    return
                received += len(data)

        with contextlib.suppress(Exception):
            self.writer.write_eof()
            async with timeout(seconds):
                await discard()
