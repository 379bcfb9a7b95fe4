"""The one listener of both modes: microphone → wake word → endpointer → what was heard.

The listener reads the microphone for as long as it runs (a live device must not back up)
and, chunk by chunk, runs the detectors its `Gate` asks for: the wake word while a turn
may start, the endpointer while speech is awaited. What it heard goes to the caller's
`on_heard` in capture order. Who decides is the mode's business: the standalone satellite's
`WakeWindow` below, the Home Assistant satellite's state machine (ha/machine.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from .protocols import AudioSource, EndpointDetector, EndpointEvent, EndpointKind, WakeDetector

_LOGGER = logging.getLogger(__name__)

# After a wake word, how long a request may take to start: one figure for both modes (the
# Home Assistant machine's `Timeouts.no_speech` is this; the core names it, the fronts import it).
NO_SPEECH_S = 8.0
READ_RETRY_S = 1.0  # a microphone read that failed is tried again after this long


@dataclass(frozen=True)
class Heard:
    """One chunk and what the detectors made of it."""

    chunk: bytes
    time: float  # monotonic time the chunk was captured
    wake: bool = False  # the wake word ended in this chunk
    events: list[EndpointEvent] = field(default_factory=list)


class Gate(Protocol):
    """Which detectors run on the next chunk, captured at `now`."""

    def wants_speech(self, now: float) -> bool: ...

    def wants_wake(self, now: float) -> bool: ...


class Listener:
    """Microphone → (wake word) → endpointer, one chunk at a time."""

    def __init__(
        self,
        source: AudioSource,
        endpointer: EndpointDetector,
        wake: WakeDetector | None = None,
    ) -> None:
        self.source = source
        self.endpointer = endpointer
        self.wake = wake
        self._stopping = False

    async def load(self) -> None:
        """Load the VAD (the wake word loads when it is made)."""
        await self.endpointer.load()

    def stop(self) -> None:
        """Stop reading after the current chunk (e.g. --max-turns reached)."""
        self._stopping = True

    async def run(self, gate: Gate, on_heard: Callable[[Heard], Awaitable[None]]) -> float:
        """Open the microphone (its errors are raised) and listen until it ends or `stop`;
        returns the time of the last chunk. The caller closes the microphone."""
        await self.source.open()
        now = time.monotonic()
        while not self._stopping:
            try:
                chunk = await self.source.read()
            except Exception as err:  # sources retry by themselves; this is a last resort
                _LOGGER.warning("Microphone read failed: %s", err)
                await asyncio.sleep(READ_RETRY_S)
                continue
            # When the chunk was captured: now, unless the source knows better.
            now = getattr(self.source, "chunk_time", None) or time.monotonic()
            if chunk is None:
                _LOGGER.info("Microphone stream ended")
                break
            try:
                await on_heard(await self._hear(gate, chunk, now))
            except Exception:  # a VAD or wake word failure costs this chunk, not the mic
                _LOGGER.exception("Could not process a microphone chunk")
        return now

    async def _hear(self, gate: Gate, chunk: bytes, now: float) -> Heard:
        speech = gate.wants_speech(now)
        wake = self.wake is not None and gate.wants_wake(now)
        events = await self.endpointer.feed(chunk, now) if speech else []
        fired = False
        if wake and self.wake is not None:
            fired = await self.wake.async_detect(chunk)
            if fired:
                _LOGGER.info("Wake word %r detected", self.wake.phrase)
        return Heard(chunk, now, fired, events)


class WakeWindow:
    """The standalone satellite's gate. Without a wake word every chunk goes to the
    endpointer; with one, the endpointer hears only what follows the word, until the
    request's endpoint or NO_SPEECH_S without speech, and then the word is awaited again.
    """

    def __init__(
        self,
        listener: Listener,
        timeout: float = NO_SPEECH_S,
        on_wake: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.listener = listener
        self.timeout = timeout
        self.on_wake = on_wake  # e.g. barge-in: the wake word stops a reply
        self._awake_until: float | None = None

    def wants_speech(self, now: float) -> bool:
        return self.listener.wake is None or self._awake(now)

    def wants_wake(self, now: float) -> bool:
        return not self._awake(now)

    def _awake(self, now: float) -> bool:
        if self._awake_until is None:
            return False
        if now < self._awake_until or self.listener.endpointer.in_speech:
            return True
        _LOGGER.info("No speech after the wake word; listening for it again")
        self._awake_until = None
        return False

    async def heard(self, heard: Heard) -> list[EndpointEvent]:
        """Follow the window through what was heard; returns the endpointing events."""
        wake = self.listener.wake
        if heard.wake and wake is not None:
            await wake.async_reset()
            self.listener.endpointer.reset()  # the wake word itself is no part of the request
            self._awake_until = heard.time + self.timeout
            if self.on_wake is not None:
                await self.on_wake()
        if wake is not None and any(e.kind is EndpointKind.ENDPOINT for e in heard.events):
            self._awake_until = None  # one wake word, one turn
        return heard.events
