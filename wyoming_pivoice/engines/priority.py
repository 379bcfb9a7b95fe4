"""Audio first: while Piper synthesizes, the LLM waits between tokens.

On a 2-core Pi the streaming pipeline has llama.cpp writing phrase 2 while Piper speaks
phrase 1, and each slows the other down: here Piper's first audio for a first phrase
took 131 ms alone, 235 ms while the LLM decoded flat out, and 144 ms when the LLM
yields (`bench --knobs`, overlap). The user waits for audio, not for tokens: the
LLM only has to stay ahead of playback, and a phrase plays for seconds. So a synthesis
holds the LLM back at its next token boundary, for at most `max_pause_s` at a time so a
busy TTS can never starve a conversation.

Only the turn's own speech counts: syntheses and turns carry a key (the server uses the
client's address, which a satellite's turn and its speech share), and a turn pauses only
for syntheses with its key. Another client's long synthesis does not slow every reply.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


class AudioFirst:
    """One per server: syntheses mark themselves `speaking`; the LLM `pause`s between tokens."""

    def __init__(self, enabled: bool = True, max_pause_s: float = 2.0) -> None:
        self.enabled = enabled
        self.max_pause_s = max_pause_s
        self._lock = threading.Lock()
        self._speaking: dict[str | None, int] = {}
        self._quiet: dict[str | None, threading.Event] = {}

    def _event(self, key: str | None) -> threading.Event:
        event = self._quiet.get(key)
        if event is None:
            event = self._quiet[key] = threading.Event()
            event.set()
        return event

    @contextlib.contextmanager
    def speaking(self, key: str | None = None) -> Iterator[None]:
        """Mark a synthesis for `key` as running (any thread)."""
        with self._lock:
            self._speaking[key] = self._speaking.get(key, 0) + 1
            self._event(key).clear()
        try:
            yield
        finally:
            with self._lock:
                self._speaking[key] -= 1
                if self._speaking[key] == 0:
                    del self._speaking[key]
                    self._quiet.pop(key).set()

    def while_speaking(self, items: Iterator[T], key: str | None = None) -> Iterator[T]:
        """`items`, produced with the synthesis mark held."""
        with self.speaking(key):
            yield from items

    def pause_for(self, key: str | None) -> Callable[[], None]:
        """The `pause` of a turn with this key."""

        def pause() -> None:
            if self.enabled:
                with self._lock:
                    event = self._quiet.get(key)
                if event is not None:
                    event.wait(self.max_pause_s)

        return pause

    def pause(self) -> None:
        """Called by the LLM between tokens: wait while a synthesis (without key) runs."""
        self.pause_for(None)()

    @property
    def speaking_now(self) -> bool:
        """Any synthesis running, whatever its key."""
        with self._lock:
            return bool(self._speaking)
