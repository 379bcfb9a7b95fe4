"""Reading Wyoming frames from an untrusted peer: block sizes checked before reading.

Used by the server and the Home Assistant satellite alike (server/limits.py describes the
refusals).
"""

from __future__ import annotations

import asyncio
import json

MAX_FRAME_BYTES = 4 * 1024 * 1024  # a frame's payload block
MAX_DATA_BYTES = 256 * 1024  # its data block: parsed JSON takes many times its size


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

    @property
    def pending(self) -> bool:
        """Bytes have arrived that no frame has consumed yet (a request may be among them).

        asyncio's StreamReader has no public count of its buffer; `_buffer` has been its
        bytearray since Python 3.4. Without it a connection whose request had just arrived,
        before its task ran, looked idle and could be evicted.
        """
        buffered = getattr(self._reader, "_buffer", None)
        return bool(self._first) or (buffered is not None and len(buffered) > 0)

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
