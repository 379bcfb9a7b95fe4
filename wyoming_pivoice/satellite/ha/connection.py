"""Home Assistant's connections to the satellite: each one bounded, and one of them at a time
driving the satellite.

Every connection is the server's hardened one (wire/hardened.py: bounded frames, a deadline
for the next frame and for each frame once begun, bounded writes, `error` with the one
ErrorCode enum before a close, lingering so the peer can read it), plus a cap on connections
(the oldest not driving the satellite makes room). A peer that
has claimed the satellite but does not ping, as HA does every 2 s, loses it to the next
connection that asks. Events for HA go to the connection's outbox (its own writer task,
each write bounded), so nothing that sends waits on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
import time
from collections.abc import Awaitable, Callable

from wyoming.event import Event, write_event

from ...wire.errors import Closing, ErrorCode
from ...wire.framing import MAX_DATA_BYTES, MAX_FRAME_BYTES
from ...wire.hardened import HardenedConnection

_LOGGER = logging.getLogger(__name__)

WRITE_TIMEOUT = 5.0  # a write HA does not take within this long means HA is gone
TAKEOVER_WAIT = 1.0  # a newcomer waits this long for the old connection to finish closing
PING_GRACE = 6.0  # HA pings every 2 s (and gives up 5 s after an unanswered one)
MAX_CONNECTIONS = 8  # HA and its describe probes; past it the oldest idle one is closed
IDLE_TIMEOUT = 30.0  # a connection that does not drive the satellite and sends nothing
ACTIVE_IDLE_TIMEOUT = 300.0  # the driving connection, if it never pings (pings: ha_silence)
OUTBOX_MAX = 512  # events HA has not taken yet (mic audio is 31 a second): past it HA is gone
FRAME_TIMEOUT = 10.0  # a frame once begun (HA's largest, a 2 KB audio chunk, takes microseconds)


def _keepalive(writer: asyncio.StreamWriter) -> None:
    """TCP keepalive, so a Home Assistant that vanished without a FIN is noticed."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


class Connections:
    """The open connections, and the active one: the one that drives the satellite.

    `handle` gets every event of every connection (False ends that connection);
    `on_connect`/`on_disconnect` hear when the satellite gains or loses its driver.
    """

    def __init__(
        self,
        handle: Callable[[HaConnection, Event], Awaitable[bool]],
        on_connect: Callable[[], None],
        on_disconnect: Callable[[], None],
    ) -> None:
        self.handle = handle
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self.active: HaConnection | None = None
        self._open: dict[HaConnection, None] = {}  # oldest first

    def factory(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> HaConnection:
        """For wyoming's AsyncServer: one HaConnection per client."""
        return HaConnection(self, reader, writer)

    def admit(self, conn: HaConnection) -> bool:
        """A new connection; at the cap the oldest one not driving the satellite makes room."""
        if len(self._open) >= MAX_CONNECTIONS:
            victim = next((c for c in self._open if c is not self.active), None)
            if victim is None:
                return False
            _LOGGER.warning("Too many connections: closing the oldest, %s", victim.peer)
            self._open.pop(victim, None)
            victim.abort()
        self._open[conn] = None
        return True

    async def claim(self, conn: HaConnection) -> bool:
        """Make `conn` the active connection if there is none, the old one is gone, or the
        old one does not ping (not Home Assistant, or a dead one)."""
        deadline = time.monotonic() + TAKEOVER_WAIT
        while True:
            old, now = self.active, time.monotonic()
            if old is conn:
                return True
            if old is not None and (old.gone or not old.pinging(now)):
                why = "gone" if old.gone else f"no ping for {PING_GRACE:.0f} s"
                self.drop(old, f"{conn.peer} takes over ({why})")
                old = self.active
            if old is None:
                self.active = conn
                _LOGGER.info("Home Assistant connected from %s", conn.peer)
                self._on_connect()
                return True
            if now >= deadline:
                return False
            await asyncio.sleep(0.05)

    def closed(self, conn: HaConnection) -> None:
        self._open.pop(conn, None)
        self.drop(conn, "disconnected")

    def send_failed(self, conn: HaConnection, event: Event, err: BaseException) -> None:
        self.drop(conn, f"sending {event.type} failed ({err!r})")

    def drop(self, conn: HaConnection, reason: str) -> None:
        """The active connection is over: close it, and the satellite goes back to idle."""
        if conn is not self.active:
            return
        self.active = None
        _LOGGER.info("Home Assistant %s: %s; back to idle", conn.peer, reason)
        conn.abort()
        self._on_disconnect()

    def close_active(self, reason: str) -> None:
        """Close the active connection at the satellite's own request."""
        conn, self.active = self.active, None
        if conn is not None:
            _LOGGER.warning("Closing the connection to %s: %s", conn.peer, reason)
            conn.abort()

    def send(self, event: Event) -> None:
        """Queue for the active connection; one that takes nothing is dropped."""
        conn = self.active
        if conn is not None and not conn.send(event):
            self.drop(conn, f"it has not taken {OUTBOX_MAX} events")

    def abort_all(self) -> None:
        for conn in list(self._open):
            conn.abort()
        self.active = None


class HaConnection(HardenedConnection):
    """One TCP connection (Home Assistant, or a `describe`-only probe)."""

    def __init__(
        self,
        connections: Connections,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(
            reader,
            writer,
            max_frame_bytes=MAX_FRAME_BYTES,
            max_data_bytes=MAX_DATA_BYTES,
            frame_timeout=FRAME_TIMEOUT,
            write_timeout=WRITE_TIMEOUT,
        )
        self.connections = connections
        self.opened = time.monotonic()
        self.last_ping: float | None = None
        self._outbox: asyncio.Queue[Event] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None
        self._writing = False  # an event is being written (taken from the outbox, or a reply)
        _keepalive(writer)

    @property
    def active(self) -> bool:
        """This connection drives the satellite."""
        return self.connections.active is self

    def next_frame_deadline(self) -> float:
        return time.monotonic() + (ACTIVE_IDLE_TIMEOUT if self.active else IDLE_TIMEOUT)

    def frame_missed(self) -> None:
        idle = ACTIVE_IDLE_TIMEOUT if self.active else IDLE_TIMEOUT
        _LOGGER.info("Connection %s idle for %.0f s: closing it", self.peer, idle)
        raise Closing("idle timeout", ErrorCode.IDLE)

    async def run(self) -> None:
        if not self.connections.admit(self):
            await self.refuse("satellite busy: too many connections", ErrorCode.BUSY)
            return
        try:
            while await self._read_one():
                pass
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as err:
            _LOGGER.info("Connection %s lost: %s", self.peer, err)
        finally:
            self.connections.closed(self)
            self.abort()

    async def _read_one(self) -> bool:
        """Read and handle one event; False ends the connection."""
        event = await self.read_event_bounded()  # a bad frame or idle: `error` sent
        if event is None:
            if self.refused:
                _LOGGER.warning("Closing %s after a refused frame", self.peer)
                await self.linger()
            return False
        return await self.handle_event(event)

    async def handle_event(self, event: Event) -> bool:
        return await self.connections.handle(self, event)

    async def reply(self, event: Event) -> None:
        """Answer (describe, ping), bounded: a peer that takes nothing is dropped. Behind
        what is queued for it, if anything: a pong must not overtake earlier events."""
        if self._sender is not None:
            if not self.send(event):
                raise ConnectionError(f"{self.peer} takes no events")
            return
        self._writing = True
        try:
            await self.write_event(event)  # within WRITE_TIMEOUT, or the peer is dropped
        finally:
            self._writing = False

    def send(self, event: Event) -> bool:
        """Send an event to the peer, in order; False if it has stopped taking them.

        With nothing queued or being written and the socket's buffer empty, it is handed to
        the socket now; otherwise it waits in the outbox for the writer task (whose wait on a
        full buffer is bounded). Through the writer task a barge-in's run-pipeline took two
        more turns of the loop: 1-17 ms after the barge-in at load 24-26 (test_ha_barge_in)."""
        if self._outbox.qsize() >= OUTBOX_MAX:
            return False
        if not self._writing and self._outbox.empty() and self._write_now(event):
            return True
        self._outbox.put_nowait(event)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_loop(), name=f"to {self.peer}")
        return True

    def _write_now(self, event: Event) -> bool:
        """Hand `event` to the socket now, if nothing of earlier events is still buffered."""
        transport = self.writer.transport
        if transport.is_closing() or transport.get_write_buffer_size() > 0:
            return False
        frame = io.BytesIO()
        write_event(event, frame)  # wyoming's own framing, as async_write_event's
        transport.write(frame.getvalue())
        _written(event)
        return True

    async def _send_loop(self) -> None:
        while True:
            event = await self._outbox.get()
            self._writing = True
            try:
                await self.write_event(event)  # within WRITE_TIMEOUT
            except (ConnectionError, OSError, RuntimeError) as err:
                self.connections.send_failed(self, event, err)
                return
            finally:
                self._writing = False
            _written(event)

    async def refuse(self, text: str, code: ErrorCode) -> None:
        """An `error` the peer can read, then close (its unread input is let in first:
        closing on unread bytes resets the connection and can destroy the error)."""
        with contextlib.suppress(Exception):
            await self.close_with(text, code)
            await self.linger()
        self.abort()

    def pinging(self, now: float) -> bool:
        """Pings (or has only just connected) as Home Assistant does."""
        return now - (self.last_ping or self.opened) < PING_GRACE

    def abort(self) -> None:
        """Close at once, dropping anything unsent."""
        if self._sender is not None:
            self._sender.cancel()
        self.writer.transport.abort()

    @property
    def gone(self) -> bool:
        return self.writer.is_closing() or self.reader.at_eof()


def _written(event: Event) -> None:
    if event.type == "run-pipeline":  # where a barge-in's time goes (test_ha_barge_in)
        _LOGGER.info("Wrote run-pipeline at %.3f", time.monotonic())
