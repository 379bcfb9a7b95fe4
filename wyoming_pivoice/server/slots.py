"""Connection slots: a hostile or idle client can never lock a real one out, and no request
is ever evicted.

A connection waits in the lobby until its first request (not `ping`, not `describe`) has
been read; only then does admission decide, so it decides knowing what the client asked
and can answer it in-band (errors.py). Admitted, a connection keeps its slot while it has a
request in flight or bytes not yet read; once its replies are out and it sends nothing, it
is idle, and the one idle longest is evicted for a newcomer. Only when every slot holds a
request is the newcomer refused: `busy`, with the end its client waits for.

Before this order (issue #22) admission ran before anything was read and a slot's idle
clock started when it connected, so in a burst the newcomer evicted the oldest connection
whose request sat unread in its buffer: 27-31 of 37 real requests per round of 50 clients.

The lobby holds nothing but a socket: its connections must send a request within the idle
timeout (pings and describes are answered but do not count). Past `max_waiting`, a
newcomer closes the one that has waited longest with nothing sent (from its own address
first), if it has waited `LOBBY_GRACE_S`: a client sends its first frame milliseconds
after connecting, so in a burst the new connections, not yet heard, are all kept. Only
past `LOBBY_HARD_FACTOR` times `max_waiting`, every one of them young or mid-frame, is a
newcomer closed unread (`busy`): a lockout then costs a flood of fresh connections each
second, not a few idle ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_LOGGER = logging.getLogger(__name__)

LOBBY_PER_SLOT = 4  # connections that may wait for their first request, per slot
LOBBY_GRACE_S = 1.0  # a connection silent this long since it connected may be closed for room
LOBBY_HARD_FACTOR = 4


@dataclass(eq=False)
class Slot:
    """One connection's place. `idle` says whether it may be evicted now (no request in
    flight, no byte waiting to be read, blocked on the client); `evict` closes it (called
    at most once, on the event loop)."""

    host: str
    idle: Callable[[], bool]
    evict: Callable[[], None]
    last_request: float = field(default_factory=time.monotonic)
    admitted: bool = False  # has a slot (it sent a request); else waits in the lobby

    def touch(self) -> None:
        """A request arrived or a reply finished: the idle clock starts again."""
        self.last_request = time.monotonic()


class ConnectionTable:
    def __init__(self, max_clients: int, max_per_host: int, max_waiting: int | None = None) -> None:
        self.max_clients = max_clients
        self.max_per_host = max_per_host
        self.max_waiting = max_waiting or LOBBY_PER_SLOT * max_clients
        self._slots: list[Slot] = []  # admitted
        self._lobby: list[Slot] = []  # waiting for their first request
        self.evictions = 0  # admitted connections evicted (for tests and figures)
        self.refusals = 0  # requests refused `busy`

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def waiting(self) -> int:
        return len(self._lobby)

    def enter(self, slot: Slot) -> bool:
        """A new connection joins the lobby; False if the lobby is full of connections that
        are young or in the middle of a frame (then it cannot even be read)."""
        if len(self._lobby) >= self.max_waiting:
            old = time.monotonic() - LOBBY_GRACE_S
            quiet = [s for s in self._lobby if s.last_request < old]
            same_host = [s for s in quiet if s.host == slot.host]
            _ = self._evict_one(same_host, "waited") or self._evict_one(quiet, "waited")
        if len(self._lobby) >= LOBBY_HARD_FACTOR * self.max_waiting:
            self.refusals += 1
            return False
        self._lobby.append(slot)
        return True

    def admit(self, slot: Slot) -> bool:
        """Give `slot` (whose first request has been read) a place, evicting an idle
        admitted connection if a limit is reached; False: every candidate has a request."""
        if slot.admitted:
            return True
        same_host = [s for s in self._slots if s.host == slot.host]
        if len(same_host) >= self.max_per_host and not self._evict_one(same_host, "idle"):
            self.refusals += 1
            return False
        if len(self._slots) >= self.max_clients and not self._evict_one(self._slots, "idle"):
            self.refusals += 1
            return False
        if slot in self._lobby:
            self._lobby.remove(slot)
        slot.admitted = True
        slot.touch()
        self._slots.append(slot)
        return True

    def readmit(self, slot: Slot) -> None:
        """An evicted connection whose next frame arrived as it was evicted keeps its place
        (one over the limit until a connection ends): a request is never evicted."""
        if slot.admitted and slot not in self._slots:
            self._slots.append(slot)
            self.evictions -= 1
        elif not slot.admitted and slot not in self._lobby:
            self._lobby.append(slot)

    def release(self, slot: Slot) -> None:
        for place in (self._slots, self._lobby):
            if slot in place:
                place.remove(slot)

    def _evict_one(self, candidates: list[Slot], what: str) -> bool:
        idle = [s for s in candidates if s.idle()]
        if not idle:
            return False
        victim = min(idle, key=lambda s: s.last_request)
        self.release(victim)
        if victim.admitted:
            self.evictions += 1
        _LOGGER.info(
            "Closing a connection from %s %s for %.1f s to make room",
            victim.host,
            what,
            time.monotonic() - victim.last_request,
        )
        victim.evict()
        return True
