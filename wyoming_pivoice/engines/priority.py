"""Audio first: while Piper synthesizes, the LLM waits between tokens.

On a 2-core Pi the streaming pipeline has llama.cpp writing phrase 2 while Piper speaks
phrase 1, and each slows the other down: here Piper's first audio for a first phrase
took 131 ms alone, 235 ms while the LLM decoded flat out, and 144 ms when the LLM
yields (`bench --knobs`, overlap). The user waits for audio, not for tokens: the
LLM only has to stay ahead of playback, and a phrase plays for seconds. So a synthesis
holds the LLM back at its next token boundary, for at most `max_pause_s` at a time so a
busy TTS can never starve a conversation.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


class AudioFirst:
    """One per server: syntheses mark themselves `speaking`; the LLM `pause`s between tokens."""

    def __init__(self, enabled: bool = True, max_pause_s: float = 2.0) -> None:
        self.enabled = enabled
        self.max_pause_s = max_pause_s
        self._lock = threading.Lock()
        self._speaking = 0
        self._quiet = threading.Event()
        self._quiet.set()

    @contextlib.contextmanager
    def speaking(self) -> Iterator[None]:
        """Mark a synthesis as running (any thread)."""
        with self._lock:
            self._speaking += 1
            self._quiet.clear()
        try:
            yield
        finally:
            with self._lock:
                self._speaking -= 1
                if self._speaking == 0:
                    self._quiet.set()

    def while_speaking(self, items: Iterator[T]) -> Iterator[T]:
        """`items`, produced with the synthesis mark held."""
        with self.speaking():
            yield from items

    def pause(self) -> None:
        """Called by the LLM between tokens: wait while a synthesis runs."""
        if self.enabled:
            self._quiet.wait(self.max_pause_s)

    @property
    def speaking_now(self) -> bool:
        return not self._quiet.is_set()
