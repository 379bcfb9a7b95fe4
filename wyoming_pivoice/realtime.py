"""Waiting on the wall clock: backing off between retries, and a 3.10-safe timeout.

Standard library only, so a microphone, the server link and an engine probe can all import
it without pulling anything else in. Pacing a stream like a device is audio/pacing.py.
"""

from __future__ import annotations

import asyncio
import sys

if sys.version_info >= (3, 11):
    from asyncio import timeout
else:  # the same context manager, before asyncio had it (wait_for can swallow a cancellation)
    from async_timeout import timeout

__all__ = ["Backoff", "timeout"]


class Backoff:
    """Delays between retries: `first` doubling up to `maximum`; `reset` after a success."""

    def __init__(self, first: float = 0.5, maximum: float = 10.0) -> None:
        self.first = first
        self.maximum = maximum
        self.delay = first  # the next wait

    def next(self) -> float:
        """The delay to wait now (the one after it doubles)."""
        delay = self.delay
        self.delay = min(delay * 2, self.maximum)
        return delay

    async def wait(self) -> None:
        await asyncio.sleep(self.next())

    def reset(self) -> None:
        self.delay = self.first
