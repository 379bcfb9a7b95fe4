"""Audio first: while Piper synthesizes, the LLM waits between tokens.

On a 2-core Pi the streaming pipeline has llama.cpp writing phrase 2 while Piper speaks
phrase 1, and each slows the other down: here Piper's first audio for a first phrase
took 131 ms alone, 235 ms while the LLM decoded flat out, and 144 ms when the LLM
yields (`bench --knobs`, overlap). The user waits for audio, not for tokens: the
LLM only has to stay ahead of playback, and a phrase plays for seconds. So a synthesis
holds the LLM back at its next token boundary, for at most `max_pause_s` at a time so a
busy TTS can never starve a conversation.

Only the turn's own speech counts: syntheses and turns carry a key (the server uses the
client's address, which a satellite's turn and its speech share) and a start time, and a turn
pauses only for syntheses with its key that began after it did (its own phrases come after
its first tokens). Another client's long synthesis, or one already under way when the turn
began, does not slow the reply.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


class AudioFirst:
    """One per server: syntheses mark themselves `speaking`; the LLM `pause`s between tokens."""

    def __init__(self, enabled: bool = True, max_pause_s: float = 2.0) -> None:
        self.enabled = enabled
        self.max_pause_s = max_pause_s
        self._changed = threading.Condition()
        self._active: list[tuple[str | None, float]] = []  # (key, began) per running synthesis

    @contextlib.contextmanager
    def speaking(self, key: str | None = None, began: float | None = None) -> Iterator[None]:
        """Mark a synthesis for `key` (of a request that began at `began`) as running."""
        mark = (key, time.monotonic() if began is None else began)
        with self._changed:
            self._active.append(mark)
        try:
            yield
        finally:
            with self._changed:
                self._active.remove(mark)
                self._changed.notify_all()

    def while_speaking(
        self, items: Iterator[T], key: str | None = None, began: float | None = None
    ) -> Iterator[T]:
        """`items`, produced with the synthesis mark held."""
        with self.speaking(key, began):
            yield from items

    def pause_for(self, key: str | None, since: float | None = None) -> Callable[[], None]:
        """The `pause` of a turn with this key that began at `since` (None: any time)."""

        def holding() -> bool:
            return any(k == key and (since is None or b >= since) for k, b in self._active)

        def pause() -> None:
            if self.enabled:
                with self._changed:
                    self._changed.wait_for(lambda: not holding(), self.max_pause_s)

        return pause

    def pause(self) -> None:
        """Called by the LLM between tokens: wait while a synthesis (without key) runs."""
        self.pause_for(None)()

    @property
    def speaking_now(self) -> bool:
        """Any synthesis running, whatever its key."""
        with self._changed:
            return bool(self._active)
