"""The server's limits, all in one place, and the reader that enforces frame sizes.

Every refusal sends `error` (for clients that read it) and then ends the client's wait in a
way Home Assistant understands, since HA ignores `error` (README, *Limits*):
- a request that is refused but leaves the connection readable gets the answer its client
  waits for: an empty `transcript` (ASR), an empty audio run `audio-start`/`audio-stop`
  (`synthesize`), `synthesize-stopped` (a stream), `not-handled` with a short text (a turn).
  The connection stays: later requests on it are still served, in order.
- a connection we cannot or will not read on (a bad frame, a slot refused, idle, too slow,
  evicted) gets `error` and is closed: EOF releases every client.

- header line of a frame: 64 KiB (asyncio's stream limit) → `malformed`, closed. So is any
  frame that is not a JSON event.
- payload block of one frame: `max_frame_bytes` (4 MiB); data block: `max_data_bytes`
  (256 KiB: parsed JSON takes many times its size) → `frame-too-large`, closed.
- a frame, once its first byte is in: complete within `frame_timeout` (30 s) → `timeout`, closed.
- a request (transcription, streaming synthesis), from its first event to its last:
  `request_timeout` (120 s) → `timeout`, closed.
- audio of one transcription: `max_audio_seconds` (60 s) → `audio-too-long`; queued audio
  on one connection: 2 × that → `overloaded`.
- text of one synthesis, turn or stream (all its chunks), a turn's `context` as JSON:
  `max_text_chars` (4000) → `text-too-long`.
- requests queued on one connection: `max_pending` (64) → `overloaded`; twice that many
  unanswered refusals → closed.
- connections: `max_clients` (16), `max_clients_per_host` (12) from one address. At a limit
  the connection that has been idle longest with no request in flight is evicted (`evicted`,
  closed); only if every one is busy is the newcomer refused (`busy`, closed).
- silence: `idle_timeout` (300 s) since the client's last request and last reply → `idle`,
  closed. `ping` and `describe` are answered but do not count as requests: they keep no slot.
- a client that reads none of its replies: `write_timeout` (30 s) → dropped.
- synthesis: one inference speaks at most `MAX_PIECE_PHONEMES` (engines/tts.py); the model
  is given back between pieces so other clients' requests interleave.
- conversation: prompt + reply fit the model's context in its own tokens (oldest history
  dropped first, then the user text cut); memory per (client address, conversation id).
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
    max_clients_per_host: int = 12
    idle_timeout: float = 300.0
    write_timeout: float = 30.0
    frame_timeout: float = 30.0
    request_timeout: float = 120.0


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
        self._first = b""  # a frame's first byte, read by `wait_for_frame`

    async def wait_for_frame(self) -> bool:
        """Wait for the next frame's first byte (False at EOF): the idle wait, which has a
        different deadline from reading the rest of the frame."""
        if not self._first:
            self._first = await self._reader.read(1)
        return bool(self._first)

    async def readline(self) -> bytes:
        self.got_line = True  # stays True if the line is over asyncio's limit (ValueError)
        first, self._first = self._first, b""
        line = first if first == b"\n" else first + await self._reader.readline()
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
