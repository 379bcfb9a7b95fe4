"""Conversation: `transcript` → `handled-start`, a `handled-chunk` per piece, `handled`,
`handled-stop`.

Home Assistant reads only the final `handled`; streaming clients (our satellite) speak the
chunks as they come. History is kept per client address and conversation id
(conversation.py); a repeated `turn_id` replaces that turn (a satellite's speculative run
that more speech made void).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from wyoming.handle import Handled, HandledChunk, HandledStart, HandledStop

from .. import compute_log
from ..realtime import timeout
from ..wire.errors import ErrorCode
from . import follow
from .connection import Queue, Write
from .errors import Owed, RequestError
from .limits import Limits
from .services import Services
from .validate import context, context_str, text_field

_LOGGER = logging.getLogger(__name__)

# Said when the model wrote nothing within --reply-timeout (HA speaks `handled`'s text).
SLOW_REPLY = "Sorry, I could not answer in time."


class Conversations:
    """One connection's turns, answered for its client's address."""

    def __init__(
        self, services: Services, limits: Limits, queue: Queue, write: Write, host: str
    ) -> None:
        self.services = services
        self.limits = limits
        self.queue = queue
        self.write = write
        self.host = host

    def transcript(self, data: dict[str, Any]) -> None:
        text = text_field(data, "text", self.limits.max_text_chars)
        turn_context = context(data, self.limits.max_text_chars)
        self.queue.put(Owed.TURN, lambda: self._answer(text, turn_context))

    async def _answer(self, text: str, turn_context: dict[str, Any] | None) -> None:
        text = text.strip()
        if not text:
            raise RequestError("empty text: nothing to answer", ErrorCode.EMPTY_TEXT)
        turn_id = context_str(turn_context, "turn_id")
        store = self.services.conversations
        key = store.key(self.host, context_str(turn_context, "conversation_id"))
        heard = context_str(turn_context, "heard")  # our satellite: a barge-in cut the last reply
        if heard is not None:
            store.heard_only(key, heard)
        earlier = store.earlier(key, turn_id)
        start = time.monotonic()
        first: float | None = None
        await self.write(HandledStart(context=turn_context).event())
        pieces: list[str] = []
        # A follower's speculation already writing this very prompt's reply (follow.py).
        spec = follow.HUB.claim(text, turn_context, earlier)
        # A following satellite speaks the reply as it is written.
        tap = follow.HUB.turn(text, turn_context, key=key, speculation=spec)
        if spec is not None:
            output = follow.speculated(spec)
        else:
            output = self.services.answer(self.host, earlier, text, began=start)
        late = False
        try:
            async with contextlib.aclosing(output):
                async for piece in _until(output, start + self.limits.reply_timeout):
                    if piece is None:
                        late = True
                        break
                    if first is None:
                        first = time.monotonic() - start
                    pieces.append(piece)
                    tap.piece(piece)
                    await self.write(HandledChunk(text=piece).event())
            if late:
                _LOGGER.warning(
                    "Reply cut after %.0f s (--reply-timeout): the model wrote %d pieces",
                    self.limits.reply_timeout,
                    len(pieces),
                )
                if not "".join(pieces).strip():
                    pieces.append(SLOW_REPLY)
                    tap.piece(SLOW_REPLY)
                    await self.write(HandledChunk(text=SLOW_REPLY).event())
        except BaseException:
            tap.close(None)
            raise
        if spec is not None:  # the LLM's own first token, not the wait for this turn
            first = spec.first
        reply = "".join(pieces).strip()
        tap.close(reply)
        store.record(key, text, reply, turn_id, kept=output.history_kept)
        await self.write(Handled(text=reply, context=turn_context).event())
        await self.write(HandledStop().event())
        seconds = time.monotonic() - start
        _LOGGER.info(
            "Answered in %.3f s (first token %.3f s, %d characters)",
            seconds,
            first or 0.0,
            len(reply),
        )
        tokens_in = output.prompt_tokens  # None unless the local model counted them
        compute_log.current().record_compute(
            "llm",
            output.model,
            seconds,
            first=first,
            tokens_in=tokens_in,
            tokens_out=None if tokens_in is None else len(pieces),  # llama.cpp: a piece a token
        )
        _LOGGER.debug("Turn %r answered %r", text, reply)


async def _until(pieces: AsyncIterable[str], deadline: float) -> AsyncIterator[str | None]:
    """`pieces` up to `deadline` (time.monotonic()), then one None. Only the wait for the next
    piece is cut, never a write of one; the cancelled wait ends the model's generator, which
    frees the model (its `aclosing` then has nothing left to do)."""
    items = aiter(pieces)
    while True:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise asyncio.TimeoutError
            async with timeout(left):
                piece = await anext(items)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            yield None
            return
        yield piece
