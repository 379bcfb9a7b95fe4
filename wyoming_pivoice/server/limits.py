"""The server's limits, all in one place, and the reader that enforces frame sizes.

- header line of a frame: 64 KiB (asyncio's stream limit) → `error` "malformed", connection
  closed. So is any frame that is not a JSON event (not JSON, not an object, no string
  "type", a length that is not a number, JSON nested too deep).
- payload block (audio) of one frame: `max_frame_bytes` (4 MiB); data block (JSON) of one
  frame: `max_data_bytes` (256 KiB: parsed JSON takes many times its size in memory) →
  `error` "frame-too-large", connection closed (refused before it is read).
- audio of one transcription: `max_audio_seconds` (60 s) → `error` "audio-too-long"; the
  request is dropped, the connection stays.
- audio queued for transcription on one connection: 2 × `max_audio_seconds` → `error`
  "overloaded"; that request is dropped.
- text of one synthesis or turn, all the chunks of one streaming synthesis, and a turn's
  `context` (as JSON): `max_text_chars` (4000) → `error` "text-too-long"; the request (or
  the rest of the stream, which still ends with `synthesize-stopped`) is dropped, the
  connection stays. Text with a NUL or a lone surrogate → `error` "bad-request".
- requests queued on one connection: `max_pending` (64) → `error` "overloaded".
- clients connected at once: `max_clients` (16) → `error` "busy", connection closed at once.
- silence from a client: `idle_timeout` (300 s) → `error` "idle", connection closed.
- a client that reads none of its replies: `write_timeout` (30 s without taking any
  buffered reply) → connection dropped. It never holds a model: a model is free as soon
  as it has produced a request's output.
- conversation memory: 6 turns for each of the 64 most recent `conversation_id`s, forgotten
  after 300 s idle (conversation.py); one reply: `--max-tokens` (256).

Memory one connection can hold is thereby bounded: one frame being read, one transcription
being received, and its queue (at most two transcriptions' audio plus small text requests).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_audio_seconds: float = 60.0
    max_text_chars: int = 4000
    max_frame_bytes: int = 4 * 1024 * 1024
    max_data_bytes: int = 256 * 1024
    max_pending: int = 64
    max_clients: int = 16
    idle_timeout: float = 300.0
    write_timeout: float = 30.0


class FrameTooLarge(ValueError):
    """A frame announced a data or payload block larger than its limit."""


class BoundedReader:
    """A StreamReader view that refuses oversized blocks before reading them.

    `wyoming.event.async_read_event` reads a frame's data and then its payload with
    `readexactly(n)`, where n comes from the untrusted header; refusing a large n
    here keeps a hostile header from making us buffer gigabytes. The data block (JSON,
    read first) has the smaller cap: a 4 MiB block of `{}`s parses into ~100 MB.
    """

    def __init__(
        self, reader: asyncio.StreamReader, max_block_bytes: int, max_data_bytes: int
    ) -> None:
        self._reader = reader
        self._max = max_block_bytes
        self._max_data = max_data_bytes
        self._data_length: object = None  # the current header's data_length, until read
        self.violation: str | None = None
        self.got_line = False  # the last header read had bytes (so no event means a bad one)

    async def readline(self) -> bytes:
        self.got_line = True  # stays True if the line is over asyncio's limit (ValueError)
        line = await self._reader.readline()
        self.got_line = bool(line)
        self._data_length = _data_length(line)
        return line

    async def readexactly(self, n: int) -> bytes:
        limit, what = self._max, "payload"
        if self._data_length is not None and n == self._data_length:
            limit, what = self._max_data, "data"
            self._data_length = None  # the next block is the payload
        if not isinstance(n, int) or n < 0 or n > limit:
            self.violation = f"frame {what} block of {n!r} bytes is over the {limit} byte limit"
            raise FrameTooLarge(self.violation)
        return await self._reader.readexactly(n)


def _data_length(line: bytes) -> object:
    """The data_length a header line announces (None if none, or not a header at all)."""
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return header.get("data_length") if isinstance(header, dict) else None
