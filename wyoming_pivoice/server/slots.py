"""Connection slots: a hostile or idle client can never lock a real one out.

Like a hardened web server, a slot is only safe while its client has a request in flight.
When a new connection finds the server (or its own address) full, the connection that has
been idle longest with nothing in flight is evicted to make room; only when every slot is
busy is the newcomer refused. A client that holds slots with pings or half-sent frames
therefore holds nothing: it is the first to go.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_LOGGER = logging.getLogger(__name__)


@dataclass(eq=False)
class Slot:
    """One connection's place. `busy` says whether it has a request in flight; `evict`
    closes it (called at most once, on the event loop)."""

    host: str
    busy: Callable[[], bool]
    evict: Callable[[], None]
    last_request: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        """A request arrived or a reply finished: the idle clock starts again."""
        self.last_request = time.monotonic()


class ConnectionTable:
    def __init__(self, max_clients: int, max_per_host: int) -> None:
        self.max_clients = max_clients
        self.max_per_host = max_per_host
        self._slots: list[Slot] = []

    def __len__(self) -> int:
        return len(self._slots)

    def admit(self, slot: Slot) -> bool:
        """Give `slot` a place, evicting an idle connection if a limit is reached."""
        same_host = [s for s in self._slots if s.host == slot.host]
        if len(same_host) >= self.max_per_host and not self._evict_one(same_host):
            return False
        if len(self._slots) >= self.max_clients and not self._evict_one(self._slots):
            return False
        self._slots.append(slot)
        return True

    def release(self, slot: Slot) -> None:
        if slot in self._slots:
            self._slots.remove(slot)

    def _evict_one(self, candidates: list[Slot]) -> bool:
        idle = [s for s in candidates if not s.busy()]
        if not idle:
            return False
        victim = min(idle, key=lambda s: s.last_request)
        self.release(victim)
        _LOGGER.info(
            "Evicting a connection from %s idle for %.1f s to make room",
            victim.host,
            time.monotonic() - victim.last_request,
        )
        victim.evict()
        return True
