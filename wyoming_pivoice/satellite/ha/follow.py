"""Follow (--server with --uri): speak our server's reply to this satellite's HA turn as the
server writes it, the way the standalone satellite does, instead of waiting for Home
Assistant's audio of it (HA speaks a Wyoming agent's reply only after `handled`, through
ffmpeg, which holds ~4.6 s of audio).

One connection to the pivoice server says who we are in HA (`pivoice-follow{satellite_id}`),
our utterance at its speculative endpoint (`pivoice-speculate`, the audio standalone would
transcribe there; `pivoice-void` when speech resumes) and each transcript HA sent us
(`pivoice-heard{text}`). The server answers a speculation at once (`pivoice-reply-start
{held}`): we synthesize it as it is written but hold its audio until HA's turn proves to be
the same prompt (`pivoice-reply-release`: it plays) or not (`pivoice-reply-drop`). When the
server joins a turn to us (server/follow.py says how the join is kept safe), its reply's
pieces arrive as `handled-chunk`s and go through the standalone path: PhraseSplitter →
StreamingSynthesizer (its own connection to the server) → audio pieces, handed to
`on_audio`. The state machine decides whether they play and drops HA's duplicate; anything
HA says that we did not follow (its own intents, another agent, announcements) plays as
before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable

from wyoming.client import AsyncClient
from wyoming.event import Event
from wyoming.handle import Handled, HandledChunk
from wyoming.ping import Ping

from ...realtime import Backoff, timeout
from ...text import PhraseSplitter
from ...timing import TurnClock
from ...wire.follow import (
    FOLLOW,
    HEARD,
    OWN_TTS,
    REPLY_DROP,
    REPLY_FAILED,
    REPLY_RELEASE,
    REPLY_START,
    SPECULATE,
    SPOKEN,
    VOID,
)
from ..stages import AudioPiece, Connection, ServerLink, StreamingSynthesizer

_LOGGER = logging.getLogger(__name__)

KEEPALIVE_S = 60.0  # the server closes a connection idle for 300 s
OUTBOX_MAX = 64
# A speculative reply's audio is held until the server says it is the turn's; past this much
# (it is bounded by the LLM's max tokens anyway) it is not played at all.
HELD_MAX_BYTES = 60 * 22050 * 2


def ha_entity_id(name: str) -> str:
    """The entity id HA gives a Wyoming satellite named `name` (its device's name, slugified),
    which HA 2026.10+ sends as the turn's `satellite_id`."""
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return f"assist_satellite.{slug or 'satellite'}"


class _OwnTtsLink(ServerLink):
    """Each TTS connection says first that it speaks a followed reply: the server holds HA's
    request for the same words until we are done, never ours."""

    @contextlib.asynccontextmanager
    async def connect(self, what: str) -> AsyncIterator[Connection]:
        async with super().connect(what) as conn:
            await conn.send(Event(OWN_TTS, {}))
            yield conn


class Follow:
    """The follow connection and the reply being spoken; every call returns at once."""

    def __init__(
        self,
        uri: str,
        satellite_id: str,
        min_clause_chars: int,
        on_joined: Callable[[], bool],
        on_audio: Callable[[AudioPiece], None],
        on_text: Callable[[str], None],
        on_done: Callable[[], None],
        clock: Callable[[], TurnClock | None],
    ) -> None:
        self.uri = uri
        self.satellite_id = satellite_id
        self.min_clause_chars = min_clause_chars
        self.link = _OwnTtsLink(uri, retry_seconds=5.0)
        self._on_joined, self._on_audio, self._on_text, self._on_done = (
            on_joined,
            on_audio,
            on_text,
            on_done,
        )
        self._clock = clock
        self._outbox: asyncio.Queue[Event] = asyncio.Queue(OUTBOX_MAX)
        self._speaking: asyncio.Task[None] | None = None
        self._phrases: asyncio.Queue[str | None] | None = None
        self._splitter: PhraseSplitter | None = None
        self._first = True  # no audio of the reply has been handed on yet
        # A speculation's reply, synthesized before HA's turn came: its audio, HA's words for
        # it and whether its synthesis is over, kept until released or dropped.
        self._held: list[AudioPiece] | None = None
        self._held_bytes = 0
        self._held_text: str | None = None
        self._held_done = False
        # No turn of ours has been joined since HA (re)connected: HA's entity may be new, and
        # with it its conversation (server/follow.py `_guess`).
        self._fresh = True
        self.connected = False

    # ---- what the satellite tells it --------------------------------------------------------

    def heard(self, text: str) -> None:
        """HA sent us this transcript: the server may join the turn it is answering."""
        if self.connected and not self._outbox.full():
            self._outbox.put_nowait(Event(HEARD, {"text": text}))

    def ha_connected(self) -> None:
        """HA (re)connected to us: until our server joins a turn of ours, its conversation is
        likely new (a restarted HA, a reloaded entry start with none)."""
        self._fresh = True

    def speculate(self, audio: bytes) -> None:
        """Our endpointer's speculative endpoint, with the utterance standalone would
        transcribe: the server may write the reply to it before HA asks (server/follow.py).
        Only a put on the outbox: the mic → HA stream never waits for it."""
        if self.connected and not self._outbox.full():
            data = {"fresh": True} if self._fresh else {}
            self._outbox.put_nowait(Event(SPECULATE, data, payload=audio))

    def void(self) -> None:
        """The speculation is of no use: speech resumed, or HA answers the run itself."""
        if self.connected and not self._outbox.full():
            self._outbox.put_nowait(Event(VOID, {}))

    def stop(self) -> None:
        """Stop speaking the followed reply (barge-in, HA speaks another, a disconnect)."""
        if self._held is not None:
            self._discard()  # never played, never the server's turn: nothing to say
            return
        if self._speaking is not None:
            self._speaking.cancel()
            self._spoken()
        self._speaking = self._phrases = self._splitter = None

    def _discard(self) -> None:
        """Forget a held reply unplayed (the server dropped it, or the connection went)."""
        if self._speaking is not None:
            self._speaking.cancel()
        self._speaking = self._phrases = self._splitter = None
        self._held, self._held_text, self._held_done, self._held_bytes = None, None, False, 0

    def _spoken(self) -> None:
        """Tell the server our synthesis is over: HA's TTS of the same reply may go now."""
        if self.connected and not self._outbox.full():
            self._outbox.put_nowait(Event(SPOKEN, {}))

    # ---- the connection ---------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the follow connection up (reconnecting with backoff) until cancelled."""
        backoff = Backoff(first=1.0, maximum=30.0)
        while True:
            # The client's own timeouts wait with wait_for (tests/test_layout.py says why not).
            client = AsyncClient.from_uri(self.uri, connect_timeout=None, read_timeout=None)
            try:
                async with timeout(5.0):
                    await client.connect()
                await client.write_event(Event(FOLLOW, {"satellite_id": self.satellite_id}))
                _LOGGER.info("Following our turns on %s as %s", self.uri, self.satellite_id)
                self.connected = True
                backoff.reset()
                writer = asyncio.create_task(self._write_loop(client))
                try:
                    while (event := await client.read_event()) is not None:
                        self._received(event)
                finally:
                    writer.cancel()
                    with contextlib.suppress(BaseException):
                        await writer
                    if self._held is not None:
                        self._discard()  # the server that held it is gone
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as err:
                _LOGGER.debug("Follow connection to %s: %r", self.uri, err)
            finally:
                self.connected = False
                with contextlib.suppress(Exception):
                    await client.disconnect()
            await backoff.wait()

    async def _write_loop(self, client: AsyncClient) -> None:
        while True:
            try:
                async with timeout(KEEPALIVE_S):
                    event = await self._outbox.get()
            except asyncio.TimeoutError:
                event = Ping().event()
            async with timeout(5.0):
                await client.write_event(event)

    def _received(self, event: Event) -> None:
        if event.type == REPLY_START and event.data.get("held"):
            # Our speculation's reply: synthesized now, played only once HA's turn claims it.
            self.stop()
            self._held, self._held_text, self._held_done, self._held_bytes = [], None, False, 0
            self._start()
        elif event.type == REPLY_RELEASE and self._held is not None:
            self._fresh = False  # a turn of ours reached the server in HA's conversation
            self._release()
        elif event.type == REPLY_DROP and self._held is not None:
            _LOGGER.debug("Our speculation's reply was no turn's: dropped unplayed")
            self._discard()
        elif event.type == REPLY_START:
            self._fresh = False  # a turn of ours reached the server in HA's conversation
            self.stop()
            if self._on_joined():
                _LOGGER.info(
                    "Our server joined this turn: speaking its reply as it is written%s",
                    " (its speculation)" if event.data.get("speculated") else "",
                )
                self._start()
            else:  # not for this run (a stop word, HA already speaking): HA's TTS may go
                _LOGGER.info("Our server joined a turn this run does not follow: HA's audio plays")
                self._spoken()
        elif HandledChunk.is_type(event.type) and self._phrases is not None:
            assert self._splitter is not None
            for phrase in self._splitter.feed(str(event.data.get("text") or "")):
                self._phrases.put_nowait(phrase)
        elif Handled.is_type(event.type) and self._phrases is not None:
            assert self._splitter is not None
            rest = self._splitter.flush()
            if rest:
                self._phrases.put_nowait(rest)
            self._phrases.put_nowait(None)
            if self._held is not None:
                self._held_text = str(event.data.get("text") or "")
            else:
                self._on_text(str(event.data.get("text") or ""))
        elif event.type == REPLY_FAILED and self._phrases is not None:
            self._phrases.put_nowait(None)

    def _release(self) -> None:
        """HA's turn is our speculation's: what was held plays, the rest as it comes."""
        held, text, done = self._held or [], self._held_text, self._held_done
        overflow = self._held_bytes > HELD_MAX_BYTES
        self._held, self._held_text, self._held_done, self._held_bytes = None, None, False, 0
        if overflow or not self._on_joined():
            _LOGGER.info("Our server joined a turn this run does not follow: HA's audio plays")
            self._discard()
            self._spoken()  # HA's TTS of it, held by the server, may go
            return
        _LOGGER.info(
            "Our server joined this turn: speaking its reply as it is written (its speculation)"
        )
        for piece in held:
            self._deliver(piece)
        if text is not None:
            self._on_text(text)
        if done:
            self._spoken()
            self._on_done()

    def _deliver(self, piece: AudioPiece) -> None:
        if self._held is not None:
            self._held_bytes += len(piece.pcm)
            if self._held_bytes <= HELD_MAX_BYTES:
                self._held.append(piece)
            return
        if self._first:
            _LOGGER.info("Playing our server's reply to this turn (followed)")
            self._first = False
        self._on_audio(piece)

    def _start(self) -> None:
        self._first = True
        self._phrases = asyncio.Queue()
        self._splitter = PhraseSplitter(self.min_clause_chars)
        self._speaking = asyncio.create_task(self._speak(self._phrases), name="follow reply")

    async def _speak(self, phrases: asyncio.Queue[str | None]) -> None:
        """The standalone path: phrases → StreamingSynthesizer → audio, as it comes."""
        audio: asyncio.Queue[AudioPiece | None] = asyncio.Queue()
        clock = self._clock() or TurnClock(0, "ha-follow")
        tts = asyncio.create_task(StreamingSynthesizer(self.link).speak(phrases, audio, clock))
        try:
            while (piece := await audio.get()) is not None:
                self._deliver(piece)
            await tts
        except asyncio.CancelledError:
            raise
        except Exception as err:
            _LOGGER.warning("Speaking the followed reply failed: %s", err)
        finally:
            if not tts.done():
                tts.cancel()
                with contextlib.suppress(BaseException):
                    await tts
        self._speaking = None
        if self._held is not None:  # told at its release
            self._held_done = True
            return
        self._spoken()
        self._on_done()
