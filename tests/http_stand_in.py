"""What the tests' stand-in HTTP engines share: reading one request off a keep-alive
connection (asyncio streams; the stand-ins answer faults a real engine cannot show on cue)."""

from __future__ import annotations

import asyncio


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The next request's head and body (by its content-length); IncompleteReadError at EOF."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.decode().split("\r\n"):
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    return head, await reader.readexactly(length)
