"""Follow: a Home Assistant satellite of ours plays this server's reply to the turn Home
Assistant sent us for it, as the reply is written, instead of waiting for HA's audio.

Where this server is the pipeline's conversation agent, HA sends the turn here as
`transcript{text, context{conversation_id, satellite_id, device_id}}` (satellite_id and
device_id since HA 2026.10) and speaks the reply only after `handled`, through its TTS and
ffmpeg; the satellite has heard the same `transcript` from HA a moment before. A satellite
that follows keeps one connection here:

    satellite → server  pivoice-follow {satellite_id}   once: who it is in HA
    satellite → server  pivoice-heard {text}            each transcript HA sent it
    server → satellite  pivoice-reply-start {text}      a turn of its joined to it, then
                        handled-chunk* and handled {text} (or pivoice-reply-failed)
    satellite → server  pivoice-spoken                  its synthesis of that reply is over
    satellite → server  pivoice-own-tts                 first on the TTS connection it speaks
                                                        the reply on (that one is never held)

HA then asks our TTS for the same reply, which the satellite drops: that request waits
(TTS_HOLD_S at most) until the satellite has spoken it, so the two never share the voice.

The join is what keeps another satellite's reply off the speaker:
- a turn that names its satellite (HA 2026.10+) joins only a follower that declared that
  satellite_id (HA's entity id; the satellite defaults to `assist_satellite.<its name>`);
- a turn that does not (older HA) joins only if exactly one follower heard exactly these
  words within WINDOW_S, and no other turn with these words is in the window: two
  satellites asked the same thing at once join neither, and both fall back to HA's audio;
- each `heard` joins one turn at most, each turn one follower at most.
A turn that joins nobody is answered as before; HA's audio plays on the satellite.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from wyoming.event import Event
from wyoming.handle import Handled, HandledChunk

from ..wire.follow import (  # noqa: F401  (the names handler.py and the tests read here)
    FOLLOW,
    HEARD,
    OWN_TTS,
    REPLY_FAILED,
    REPLY_START,
    SATELLITE_EVENTS,
    SPOKEN,
)

_LOGGER = logging.getLogger(__name__)

EVENTS = SATELLITE_EVENTS

WINDOW_S = 5.0  # HA sends the transcript to the satellite and the turn to us at once
OUTBOX_MAX = 1024  # events a follower has not taken: past it, it stops being followed
MAX_ID_CHARS = 255
TTS_HOLD_S = 30.0  # HA's TTS of a reply a satellite is speaking waits this long at most


def words(text: str) -> str:
    """The words of a transcript, as both sides compare them."""
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


class Follower:
    """One satellite's follow connection; events to it go through a bounded outbox."""

    def __init__(self, write: Callable[[Event], Awaitable[None]], peer: str) -> None:
        self.write = write
        self.peer = peer
        self.satellite_id: str | None = None
        self._outbox: asyncio.Queue[Event] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None
        self.gone = False

    def send(self, event: Event) -> None:
        if self.gone:
            return
        if self._outbox.qsize() >= OUTBOX_MAX:
            _LOGGER.warning("Follower %s takes nothing: no longer followed", self.peer)
            self.close()
            return
        self._outbox.put_nowait(event)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_loop(), name=f"follow {self.peer}")

    async def _send_loop(self) -> None:
        while True:
            event = await self._outbox.get()
            try:
                await self.write(event)
            except Exception as err:  # the write is bounded by the connection
                _LOGGER.info("Follower %s gone: %r", self.peer, err)
                self.gone = True
                return

    def close(self) -> None:
        self.gone = True
        if self._sender is not None:
            self._sender.cancel()


@dataclass
class Heard:
    follower: Follower
    text: str  # words()
    at: float
    used: bool = False


@dataclass
class Turn:
    text: str  # words()
    at: float
    satellite_id: str | None
    original: str = ""
    pieces: list[str] = field(default_factory=list)
    reply: str | None = None
    failed: bool = False
    follower: Follower | None = None
    spoken: asyncio.Event = field(default_factory=asyncio.Event)


def pick(turn: Turn, heard: list[Heard], turns: list[Turn]) -> Heard | None:
    """The one `heard` a turn may join, or None (pure: the join rule above)."""
    fresh = [
        h
        for h in heard
        if not h.used
        and not h.follower.gone
        and h.text == turn.text
        and abs(h.at - turn.at) <= WINDOW_S
    ]
    if turn.satellite_id is not None:
        named = [h for h in fresh if h.follower.satellite_id == turn.satellite_id]
        return named[0] if len({id(h.follower) for h in named}) == 1 else None
    if len({id(h.follower) for h in fresh}) != 1:
        return None
    rivals = [
        t
        for t in turns
        if t is not turn and t.text == turn.text and abs(t.at - turn.at) <= WINDOW_S
    ]
    return None if rivals else fresh[0]


class Tap:
    """What converse.py feeds a turn's reply into; forwards it once (if ever) joined."""

    def __init__(self, hub: FollowHub, turn: Turn) -> None:
        self.hub = hub
        self.turn = turn

    def piece(self, text: str) -> None:
        self.turn.pieces.append(text)
        if self.turn.follower is not None:
            self.turn.follower.send(HandledChunk(text=text).event())

    def close(self, reply: str | None) -> None:
        """The reply is complete (`reply`), or failed (None)."""
        turn = self.turn
        turn.reply, turn.failed = reply, reply is None
        if turn.follower is not None:
            self.hub.finish(turn)


class FollowHub:
    """The follow connections and recent turns of one server process."""

    def __init__(self) -> None:
        self.followers: set[Follower] = set()
        self._heard: deque[Heard] = deque(maxlen=64)
        self._turns: deque[Turn] = deque(maxlen=64)
        self._speaking: dict[Follower, Turn] = {}  # the joined turn each follower speaks

    # ---- the satellite's side -------------------------------------------------------------

    def follow(self, follower: Follower, data: dict[str, Any]) -> None:
        satellite_id = data.get("satellite_id")
        if isinstance(satellite_id, str) and 0 < len(satellite_id) <= MAX_ID_CHARS:
            follower.satellite_id = satellite_id
        self.followers.add(follower)
        _LOGGER.info("Satellite %s follows its turns (%s)", follower.peer, follower.satellite_id)

    def heard(self, follower: Follower, data: dict[str, Any], now: float | None = None) -> None:
        text = data.get("text")
        if follower not in self.followers or not isinstance(text, str) or not text.strip():
            return
        now = time.monotonic() if now is None else now
        self._heard.append(Heard(follower, words(text), now))
        self._expire(now)
        for turn in list(self._turns):
            if turn.follower is None:
                self._try_join(turn)

    def spoken(self, follower: Follower) -> None:
        """The follower's synthesis of its joined reply is over (or was stopped)."""
        turn = self._speaking.pop(follower, None)
        if turn is not None:
            turn.spoken.set()

    def leave(self, follower: Follower) -> None:
        self.followers.discard(follower)
        self.spoken(follower)
        follower.close()

    async def hold_tts(self, text: object) -> None:
        """HA's TTS request for `text`: if a follower is speaking that reply, let it finish
        first (HA's audio of it is dropped by the satellite anyway)."""
        if not isinstance(text, str) or not self._speaking:
            return
        said = words(text)
        for turn in list(self._speaking.values()):
            if turn.reply is not None and words(turn.reply) == said:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(turn.spoken.wait(), TTS_HOLD_S)
                return

    # ---- the conversation's side ----------------------------------------------------------

    def turn(self, text: str, context: dict[str, Any] | None, now: float | None = None) -> Tap:
        """A conversation turn starts: returns the tap for its reply."""
        now = time.monotonic() if now is None else now
        satellite_id = (context or {}).get("satellite_id")
        if not isinstance(satellite_id, str) or not satellite_id:
            satellite_id = None
        turn = Turn(words(text), now, satellite_id, original=text)
        self._expire(now)
        self._turns.append(turn)
        if self.followers:
            self._try_join(turn)
        return Tap(self, turn)

    def _try_join(self, turn: Turn) -> None:
        chosen = pick(turn, list(self._heard), list(self._turns))
        if chosen is None:
            return
        chosen.used = True
        turn.follower = follower = chosen.follower
        self.spoken(follower)  # a reply still being spoken there is over now
        self._speaking[follower] = turn
        _LOGGER.info("Turn %r joined to %s", turn.original[:60], follower.peer)
        follower.send(Event(REPLY_START, {"text": turn.original}))
        for piece in turn.pieces:  # what was written before the join
            follower.send(HandledChunk(text=piece).event())
        if turn.reply is not None or turn.failed:
            self.finish(turn)

    def finish(self, turn: Turn) -> None:
        follower = turn.follower
        if follower is None:
            return
        if turn.failed:
            follower.send(Event(REPLY_FAILED, {"text": turn.original}))
        else:
            follower.send(Handled(text=turn.reply or "").event())
        with contextlib.suppress(ValueError):
            self._turns.remove(turn)

    def _expire(self, now: float) -> None:
        while self._heard and now - self._heard[0].at > 2 * WINDOW_S:
            self._heard.popleft()
        while self._turns and now - self._turns[0].at > 2 * WINDOW_S:
            self._turns.popleft()


HUB = FollowHub()  # one per server process: the follow connections and turns meet here
