"""The server's limits, all in one place, and the reader that enforces frame sizes.

- header line: 64 KiB (asyncio's stream limit) → `error` "malformed", connection closed.
- data or payload block of one frame: `max_frame_bytes` (4 MiB) → `error` "frame-too-large",
  connection closed (refused before it is read).
- audio of one transcription: `max_audio_seconds` (60 s) → `error` "audio-too-long"; the
  request is dropped, the connection stays.
- text of one synthesis or turn: `max_text_chars` (4000) → `error` "text-too-long"; the request
  is dropped, the connection stays.
- requests queued on one connection: `max_pending` (64) → `error` "overloaded".
- clients connected at once: `max_clients` (16) → `error` "busy", connection closed at once.
- silence from a client: `idle_timeout` (300 s) → `error` "idle", connection closed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_audio_seconds: float = 60.0
    max_text_chars: int = 4000
    max_frame_bytes: int = 4 * 1024 * 1024
    max_pending: int = 64
    max_clients: int = 16
    idle_timeout: float = 300.0


class FrameTooLarge(ValueError):
    """A frame announced a data or payload block larger than the limit."""


class BoundedReader:
    """A StreamReader view that refuses oversized blocks before reading them.

    `wyoming.event.async_read_event` reads a frame's data and payload with
    `readexactly(n)`, where n comes from the untrusted header; refusing a large n
    here keeps a hostile header from making us buffer gigabytes.
    """

    def __init__(self, reader: asyncio.StreamReader, max_block_bytes: int) -> None:
        self._reader = reader
        self._max = max_block_bytes
        self.violation: str | None = None

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        if not isinstance(n, int) or n < 0 or n > self._max:
            self.violation = f"frame block of {n!r} bytes is over the {self._max} byte limit"
            raise FrameTooLarge(self.violation)
        return await self._reader.readexactly(n)

    def at_eof(self) -> bool:
        return self._reader.at_eof()
