"""Follow: a Home Assistant satellite of ours plays this server's reply to the turn Home
Assistant sent us for it, as the reply is written, instead of waiting for HA's audio.

Where this server is the pipeline's conversation agent, HA sends the turn here as
`transcript{text, context{conversation_id, satellite_id, device_id}}` (satellite_id and
device_id since HA 2026.10) and speaks the reply only after `handled`, through its TTS and
ffmpeg; the satellite has heard the same `transcript` from HA a moment before. A satellite
that follows keeps one connection here:

    satellite → server  pivoice-follow {satellite_id}   once: who it is in HA
    satellite → server  pivoice-heard {text}            each transcript HA sent it
    satellite → server  pivoice-speculate {fresh?} <audio>  its utterance at its speculative
                                                        endpoint (fresh: no turn since HA connected)
    satellite → server  pivoice-void                    …of no use (speech resumed, HA answered)
    server → satellite  pivoice-reply-start {text}      a turn of its joined to it, then
                        handled-chunk* and handled {text} (or pivoice-reply-failed)
    server → satellite  pivoice-reply-start {text, speculated, held}, handled-chunk*…:
                        the reply to a speculation, held; then pivoice-reply-release (it
                        is the turn's: play it) or pivoice-reply-drop (it is not)
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

Speculation: HA transcribes the utterance only after the satellite's endpoint (the whole
silence window), then sends the turn; standalone, the satellite starts STT and the LLM 64 ms
into the silence (bench --ha-follow: endpoint → transcript +151/+173 ms in HA mode against
−119/−115 ms standalone, most of the +313/+281 ms gap). So a follower also sends the utterance
at its speculative endpoint (`pivoice-speculate`, the audio standalone would transcribe); the
server transcribes it and starts the reply to those words at once, streamed to the follower,
which synthesizes it and holds the audio (`pivoice-reply-start{held}`). HA's turn uses
that reply only if it is provably the reply HA's turn asks for, i.e. the LLM's prompt is the
same: the turn's text (HA's own transcript of HA's audio, by the STT it always runs) equals the
speculation's text exactly, its conversation history equals the one the speculation was asked
with, and no --knowledge notes enter the prompt. Nothing of the speculation reaches HA's STT:
a transcript is never reused, so HA's transcript is always what transcribing HA's audio gives
(HA's audio is not the speculation's: it runs on through the silence window). The claim
releases the held reply (`pivoice-reply-release`: it plays); a turn that does not match is
answered as before, after the speculation is cancelled (it would hold the LLM) and its held
audio dropped (`pivoice-reply-drop`). An unclaimed speculation is cancelled after
SPECULATION_S, on `pivoice-void` (speech resumed, HA answered the run itself) or when HA's
transcript has other words. HA's own intents ("Prefer handling commands locally") send us no
turn, so nothing claims the speculation and its audio is never played.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from wyoming.event import Event
from wyoming.handle import Handled, HandledChunk

from ..audio.pcm import StreamingConverter, check_format
from ..realtime import timeout
from ..wire.follow import (  # noqa: F401  (the names handler.py and the tests read here)
    FOLLOW,
    HEARD,
    OWN_TTS,
    REPLY_DROP,
    REPLY_FAILED,
    REPLY_RELEASE,
    REPLY_START,
    SATELLITE_EVENTS,
    SPECULATE,
    SPOKEN,
    VOID,
)
from .services import Output, Services

if TYPE_CHECKING:
    from ..conversation import Exchange

_LOGGER = logging.getLogger(__name__)

EVENTS = SATELLITE_EVENTS

WINDOW_S = 5.0  # HA sends the transcript to the satellite and the turn to us at once
OUTBOX_MAX = 1024  # events a follower has not taken: past it, it stops being followed
MAX_ID_CHARS = 255
TTS_HOLD_S = 30.0  # HA's TTS of a reply a satellite is speaking waits this long at most
# An unclaimed speculation is cancelled this long after it began: HA's turn comes within the
# silence window's rest, HA's STT and its hop (~0.5 s; seconds under load).
SPECULATION_S = 10.0
# HA keeps a satellite's conversation id this long after its last use (chat_session
# CONVERSATION_TIMEOUT, 5 min; its cleanup runs every 301 s, so up to ~10 min).
HA_CONVERSATION_S = 300.0
MAX_SPECULATION_BYTES = 20 * 16000 * 2  # the satellite's longest utterance (--vad-max-speech-s)


def words(text: str) -> str:
    """The words of a transcript, as both sides compare them."""
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


class Follower:
    """One satellite's follow connection; events to it go through a bounded outbox."""

    def __init__(self, write: Callable[[Event], Awaitable[None]], peer: str) -> None:
        self.write = write
        self.peer = peer
        self.satellite_id: str | None = None
        # The next speculation's guess (FollowHub._guess): the conversation of its last joined
        # turn and when that came; how many joins in a row came in a new conversation while
        # HA would have kept the last one; whether HA (re)connected since its last join.
        self.key: Hashable | None = None
        self.key_at: float | None = None
        self.switches = 0
        self.reconnected = False
        self.speculation: Speculation | None = None
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
    key: Hashable | None = None  # its conversation (the store's key)
    speculated: bool = False  # its reply is a follower's speculation (FollowHub.claim),
    # which that follower has been sent as it was written: nothing more goes to it
    original: str = ""
    pieces: list[str] = field(default_factory=list)
    reply: str | None = None
    failed: bool = False
    follower: Follower | None = None
    spoken: asyncio.Event = field(default_factory=asyncio.Event)


class Speculation:
    """A follower's utterance transcribed, and the reply to those words written, before HA
    asks; held until a turn claims it (FollowHub.claim) or cancelled."""

    def __init__(self, follower: Follower, at: float) -> None:
        self.follower = follower
        self.at = at
        self.text: str | None = None  # our transcript of the satellite's audio, stripped
        self.earlier: list[Exchange] | None = None  # the history the reply was asked with
        self.pieces: list[str] = []
        self.first: float | None = None  # seconds from the LLM's start to its first piece
        self.output: Output[str] | None = None
        self.error: BaseException | None = None
        self.done = False
        self.claimed = False
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def announce(self, text: str) -> None:
        """The follower synthesizes the reply as it is written, holding its audio until the
        turn claims it (pivoice-reply-release) or it is dropped (pivoice-reply-drop)."""
        self.text = text
        self.follower.send(Event(REPLY_START, {"text": text, "speculated": True, "held": True}))

    def cancel(self) -> None:
        if self.task is not None and not self.done:
            self.task.cancel()
        if not self.claimed and self.text is not None:
            self.follower.send(Event(REPLY_DROP, {}))  # its held audio is never played
        self.done = True
        self.changed.set()

    async def replay(self) -> AsyncIterator[str]:
        """The reply's pieces: those written so far, then each as it comes."""
        sent = 0
        try:
            while True:
                while sent < len(self.pieces):
                    sent += 1
                    yield self.pieces[sent - 1]
                if self.done:
                    break
                self.changed.clear()
                await self.changed.wait()
            if self.error is not None:
                raise self.error
            if self.task is not None and self.task.cancelled():
                raise RuntimeError("the speculative reply was cancelled")
        finally:
            self.cancel()  # the turn left early: the LLM stops (a no-op once done)


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
        if self.turn.follower is not None and not self.turn.speculated:
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
        spec = follower.speculation
        if spec is not None and spec.text is not None and words(spec.text) != words(text):
            self.void(follower)  # HA heard other words: its turn cannot claim it
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
        self.void(follower)
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
                    async with timeout(TTS_HOLD_S):
                        await turn.spoken.wait()
                return

    # ---- speculation -----------------------------------------------------------------------

    def speculate(
        self,
        follower: Follower,
        audio: bytes | None,
        services: Services,
        host: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        """The follower's utterance so far: transcribe it and start the reply to its words.
        `data["fresh"]`: no turn of its has come since HA (re)connected to it (_guess)."""
        self.void(follower)
        if follower not in self.followers or not audio or len(audio) > MAX_SPECULATION_BYTES:
            return
        if services.conversations.notes is not None:
            return  # --knowledge: notes enter the prompt; not proven the same, so not guessed
        spec = follower.speculation = Speculation(follower, time.monotonic())
        fresh = bool((data or {}).get("fresh"))
        follower.reconnected |= fresh
        spec.task = asyncio.create_task(self._speculate(spec, audio, services, host, fresh))
        asyncio.get_running_loop().call_later(SPECULATION_S, self._expire_speculation, spec)

    def void(self, follower: Follower) -> None:
        """The follower's speculation is of no use (speech went on, HA answered itself)."""
        spec = follower.speculation
        if spec is not None and not spec.claimed:
            spec.cancel()
            follower.speculation = None

    def _expire_speculation(self, spec: Speculation) -> None:
        if not spec.claimed and spec.follower.speculation is spec:
            self.void(spec.follower)

    def _guess(self, follower: Follower, fresh: bool = False) -> Hashable | None:
        """The conversation the follower's next turn will likely be in: the last joined turn's
        (HA keeps a satellite's conversation id five minutes, and our store forgets a history
        after as long idle, so past that this is an empty one as well), a new one's too
        (guessing an empty history there missed the second turn of every new HA conversation
        against the real HA 2026.10). A new one if:
        - the satellite says no turn of its came since HA (re)connected (`fresh`): HA's entity
          starts with no conversation (a restart, a reloaded entry); the last turn's history
          guessed there missed the first turn of each new HA (the real HA 2026.10);
        - its last three turns came in three conversations, each while HA would have kept the
          last one (a client that starts one per turn; HA does not). Counted only then: a
          user's turns minutes apart each start a new HA conversation, and counting those
          (session 13's rule) guessed an empty history for the follow-up of each.
        A wrong guess costs only the speculation: the claim checks the history."""
        if fresh or follower.key_at is None or follower.switches >= 2:
            return None
        return follower.key

    async def _speculate(
        self, spec: Speculation, audio: bytes, services: Services, host: str, fresh: bool
    ) -> None:
        try:
            # The same conversion and model as a transcribe request (transcribe.py).
            converter = StreamingConverter(check_format(16000, 2, 1))
            samples = np.concatenate([converter.convert(audio), converter.flush()])
            parts: list[str] = []
            heard = services.transcribe(samples, services.settings.language)
            async with contextlib.aclosing(heard):
                async for part in heard:
                    parts.append(part)
            text = " ".join(parts).strip()
            if not text:
                return
            key = self._guess(spec.follower, fresh)
            spec.earlier = services.conversations.earlier(key)
            spec.announce(text)
            start = time.monotonic()
            _LOGGER.debug("Speculating on %r for %s", text[:60], spec.follower.peer)
            spec.output = output = services.answer(host, spec.earlier, text, began=start)
            async with contextlib.aclosing(output):
                async for piece in output:
                    if spec.first is None:
                        spec.first = time.monotonic() - start
                    spec.pieces.append(piece)
                    spec.changed.set()
                    spec.follower.send(HandledChunk(text=piece).event())
            spec.follower.send(Handled(text="".join(spec.pieces).strip()).event())
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the turn that claims it gets the error, as its own
            spec.error = err
            if spec.text is not None:
                spec.follower.send(Event(REPLY_FAILED, {"text": spec.text}))
        finally:
            spec.done = True
            spec.changed.set()

    def claim(
        self,
        text: str,
        context: dict[str, Any] | None,
        earlier: list[Exchange],
    ) -> Speculation | None:
        """The speculation whose reply is this turn's (the same prompt), or None; the others
        are cancelled, as they would hold the LLM this turn needs."""
        satellite_id = _satellite_id(context)
        fits = [
            f.speculation
            for f in self.followers
            if f.speculation is not None
            and not f.speculation.claimed
            and f.speculation.text is not None
            and f.speculation.error is None  # a failed one: the turn is answered afresh
            and (satellite_id is None or f.satellite_id == satellite_id)
        ]
        same = [s for s in fits if s.text == text.strip() and s.earlier == earlier]
        # Without a satellite id (HA before 2026.10): only if one speculation has these words.
        chosen = same[0] if len(same) == 1 else None
        for follower in list(self.followers):
            if follower.speculation is not None and follower.speculation is not chosen:
                self.void(follower)
        if chosen is not None:
            chosen.claimed = True
            chosen.follower.speculation = None
            chosen.follower.send(Event(REPLY_RELEASE, {}))  # its held audio plays now
            _LOGGER.info(
                "Turn %r answered by the speculation of %s (%d pieces written)",
                text[:60],
                chosen.follower.peer,
                len(chosen.pieces),
            )
        return chosen

    # ---- the conversation's side ----------------------------------------------------------

    def turn(
        self,
        text: str,
        context: dict[str, Any] | None,
        now: float | None = None,
        key: Hashable | None = None,
        speculation: Speculation | None = None,
    ) -> Tap:
        """A conversation turn starts: returns the tap for its reply."""
        now = time.monotonic() if now is None else now
        satellite_id = _satellite_id(context)
        turn = Turn(words(text), now, satellite_id, key, original=text)
        self._expire(now)
        self._turns.append(turn)
        if speculation is not None:  # joined already: its follower has the reply's pieces
            turn.speculated = True
            self._attach(turn, speculation.follower)
            for heard in self._heard:  # HA's transcript of it joins nothing else
                if heard.follower is speculation.follower and heard.text == turn.text:
                    heard.used = True
        elif self.followers:
            self._try_join(turn)
        return Tap(self, turn)

    def _try_join(self, turn: Turn) -> None:
        chosen = pick(turn, list(self._heard), list(self._turns))
        if chosen is None:
            return
        chosen.used = True
        follower = chosen.follower
        self._attach(turn, follower)
        follower.send(Event(REPLY_START, {"text": turn.original}))
        for piece in turn.pieces:  # what was written before the join
            follower.send(HandledChunk(text=piece).event())
        if turn.reply is not None or turn.failed:
            self.finish(turn)

    def _attach(self, turn: Turn, follower: Follower) -> None:
        turn.follower = follower
        if turn.key == follower.key:
            follower.switches = 0
        elif (
            follower.key_at is not None
            and not follower.reconnected
            and turn.at - follower.key_at < HA_CONVERSATION_S
        ):
            follower.switches += 1  # a new conversation HA would not have started
        else:
            follower.switches = 0  # the first, HA's expired one, or a new HA entity's
        follower.key, follower.key_at, follower.reconnected = turn.key, turn.at, False
        self.spoken(follower)  # a reply still being spoken there is over now
        self._speaking[follower] = turn
        _LOGGER.info("Turn %r joined to %s", turn.original[:60], follower.peer)

    def finish(self, turn: Turn) -> None:
        follower = turn.follower
        if follower is None:
            return
        if turn.speculated:
            pass  # the speculation sent its follower the reply's end itself
        elif turn.failed:
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


def speculated(spec: Speculation) -> Output[str]:
    """A claimed speculation's reply as the turn's output (what converse.py iterates)."""
    output: Output[str] = Output()
    output.items = spec.replay()
    if spec.output is not None:
        output.model, output.prompt_tokens = spec.output.model, spec.output.prompt_tokens
        output.history_kept = spec.output.history_kept
    return output


def _satellite_id(context: dict[str, Any] | None) -> str | None:
    satellite_id = (context or {}).get("satellite_id")
    return satellite_id if isinstance(satellite_id, str) and satellite_id else None


HUB = FollowHub()  # one per server process: the follow connections and turns meet here
