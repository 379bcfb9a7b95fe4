"""The server-facing stages of a turn: ASR, LLM and TTS, each a small class.

Each request gets its own connection to the pivoice server: the server works through
one connection's requests in order, so separate connections let the LLM and TTS run
side by side, and closing a connection cancels its work there (how a speculative turn
is abandoned). `streaming` and `sequential` variants share one interface (protocols.py:
Transcriber, Responder, Synthesizer), so the pipeline does not care which it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.handle import Handled, HandledChunk, HandledStop, NotHandled
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from ..audio.pcm import plain_format
from ..realtime import Backoff, timeout
from ..timing import TurnClock
from .protocols import AudioPiece

_LOGGER = logging.getLogger(__name__)

ASR_CHUNK_BYTES = 32000  # 1 s of 16 kHz mono s16le per audio-chunk event
CONNECT_TIMEOUT = 5.0  # s, for one attempt to reach the server


class ServerError(RuntimeError):
    """The server refused a request, vanished, or cannot be reached."""


class ServerLink:
    """Opens connections to the pivoice server, retrying with backoff while it is down.

    A request that cannot connect within `retry_seconds` fails (its turn reports the
    error); the next request tries again, so a restarted server is picked up.
    """

    def __init__(self, uri: str, retry_seconds: float = 10.0, read_timeout: float = 120.0) -> None:
        self.uri = uri
        self.retry_seconds = retry_seconds
        self.read_timeout = read_timeout
        # A short cap: the satellite should be back within a second of the server's return.
        self._backoff = Backoff(first=0.25, maximum=1.0)
        self._down_since: float | None = None

    @contextlib.asynccontextmanager
    async def connect(self, what: str) -> AsyncIterator[Connection]:
        """A connection for one request (`what` names it in errors); closed on leaving."""
        client = await self._connect()
        try:
            yield Connection(client, what, self.read_timeout)
        finally:
            with contextlib.suppress(Exception):
                await client.disconnect()

    async def _connect(self) -> AsyncClient:
        deadline = time.monotonic() + self.retry_seconds
        while True:
            # No timeouts in the client: it would wait with `asyncio.wait_for`, which on
            # Python 3.11 (Raspberry Pi OS bookworm) swallows a cancellation that comes as
            # the wait ends; the connect is bounded here, each read by the Connection.
            client = AsyncClient.from_uri(self.uri, connect_timeout=None, read_timeout=None)
            try:
                async with timeout(CONNECT_TIMEOUT):
                    await client.connect()
            except (OSError, asyncio.TimeoutError) as err:
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    _LOGGER.warning("Server %s unreachable (%s); retrying", self.uri, err)
                if time.monotonic() + self._backoff.delay > deadline:
                    raise ServerError(f"server {self.uri} unreachable: {err}") from err
                await self._backoff.wait()
                continue
            if self._down_since is not None:
                _LOGGER.info(
                    "Server %s reachable again after %.1f s",
                    self.uri,
                    time.monotonic() - self._down_since,
                )
                self._down_since = None
            self._backoff.reset()
            return client


class Connection:
    """One request's connection: transport failures and `error` events become ServerError."""

    def __init__(self, client: AsyncClient, what: str, read_timeout: float) -> None:
        self.client = client
        self.what = what
        self.read_timeout = read_timeout

    async def send(self, *events: Event) -> None:
        try:
            for event in events:
                await self.client.write_event(event)
        except (OSError, RuntimeError) as err:
            raise ServerError(f"connection lost during {self.what}: {err}") from err

    async def receive(self) -> Event:
        what = self.what
        try:
            # A timeout context, not `wait_for`: a barge-in's cancel must end the turn's run
            # even when it meets an arriving audio chunk (3.11's wait_for returned the chunk
            # and the abandoned run went on to the end of its reply: CI, session 24).
            async with timeout(self.read_timeout):
                event = await self.client.read_event()
        except asyncio.TimeoutError:
            raise ServerError(f"no answer from the server during {what}") from None
        except (OSError, asyncio.IncompleteReadError) as err:
            raise ServerError(f"connection lost during {what}: {err}") from err
        if event is None:
            raise ServerError(f"the server closed the connection during {what}")
        if Error.is_type(event.type):
            error = Error.from_event(event)
            raise ServerError(f"server error during {what}: {error.text} ({error.code})")
        return event


# ---- ASR ------------------------------------------------------------------------------------


class Recognizer:
    """Speech → text: transcribe, audio-start, audio-chunk…, audio-stop → transcript."""

    def __init__(self, link: ServerLink, language: str | None = None) -> None:
        self.link = link
        self.language = language

    async def transcribe(self, audio: bytes, clock: TurnClock) -> str:
        async with self.link.connect("transcription") as conn:
            await conn.send(Transcribe(language=self.language).event())
            await conn.send(AudioStart(rate=16000, width=2, channels=1).event())
            for offset in range(0, len(audio), ASR_CHUNK_BYTES):
                await conn.send(
                    AudioChunk(
                        rate=16000,
                        width=2,
                        channels=1,
                        audio=audio[offset : offset + ASR_CHUNK_BYTES],
                    ).event()
                )
            await conn.send(AudioStop().event())
            while True:
                event = await conn.receive()
                if Transcript.is_type(event.type):
                    clock.mark("transcript")
                    return Transcript.from_event(event).text.strip()


# ---- LLM ------------------------------------------------------------------------------------


@dataclass
class HeardMemo:
    """What the user heard of a reply a barge-in cut, until the next request tells the server:
    it keeps only that in the conversation. Kept whole, the interrupted reply came back as the
    answer to the question that interrupted it (SmolLM2 repeats its history: 8 of 9 turns in
    one bench room)."""

    heard: str | None = None


class _Conversation:
    def __init__(
        self,
        link: ServerLink,
        conversation_id: str | None,
        session: str = "",
        memo: HeardMemo | None = None,
    ) -> None:
        self.link = link
        self.conversation_id = conversation_id
        self.session = session
        self.memo = memo
        self.final_text: str | None = None  # the server's whole reply (`handled`)

    def _request(self, text: str, clock: TurnClock) -> Event:
        if not self.conversation_id:
            return Transcript(text=text).event()
        # A speculative run and the run that replaces it share the turn id, so the server
        # keeps only the second in the conversation's history.
        context = {
            "conversation_id": self.conversation_id,
            "turn_id": f"{self.session}-{clock.turn}",
        }
        if self.memo is not None and self.memo.heard is not None:
            context["heard"], self.memo.heard = self.memo.heard, None  # told once
        return Transcript(text=text, context=context).event()


class StreamingResponder(_Conversation):
    """Yields the LLM's handled-chunk pieces as they are generated."""

    async def respond(self, text: str, clock: TurnClock) -> AsyncIterator[str]:
        self.final_text = None
        async with self.link.connect("conversation") as conn:
            await conn.send(self._request(text, clock))
            while True:
                event = await conn.receive()
                if HandledChunk.is_type(event.type):
                    piece = HandledChunk.from_event(event).text
                    if piece:
                        clock.mark_once("llm_first_token")
                        yield piece
                elif Handled.is_type(event.type) or NotHandled.is_type(event.type):
                    self.final_text = (event.data.get("text") or "").strip()
                elif HandledStop.is_type(event.type):
                    clock.mark("llm_done")
                    return


class WholeResponder(_Conversation):
    """Waits for the whole reply (only the final `handled`), as a non-streaming pipeline does."""

    async def respond(self, text: str, clock: TurnClock) -> AsyncIterator[str]:
        self.final_text = None
        async with self.link.connect("conversation") as conn:
            await conn.send(self._request(text, clock))
            while True:
                event = await conn.receive()
                if Handled.is_type(event.type) or NotHandled.is_type(event.type):
                    reply = (event.data.get("text") or "").strip()
                    self.final_text = reply
                    now = clock.mark("llm_done")
                    clock.mark_once("llm_first_token", now)
                    if reply:
                        yield reply
                    return


# ---- TTS ------------------------------------------------------------------------------------


async def _read_audio(
    conn: Connection,
    audio: asyncio.Queue[AudioPiece | None],
    clock: TurnClock,
    until: str,
    whole: bool = False,
) -> None:
    """Forward audio-chunks to `audio` until an event of type `until`.

    `whole`: hold every chunk until `until`, as a non-streaming client does (Home
    Assistant's plain TTS builds the whole WAV before anything plays); the TTS clock
    then stops when the audio is complete.
    """
    held: list[AudioPiece] = []
    runs = 0  # audio-stops so far: the phrase the next chunk belongs to
    while True:
        event = await conn.receive()
        if AudioStop.is_type(event.type):
            runs += 1
        if AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            if chunk.audio:
                piece = AudioPiece(chunk.audio, plain_format(chunk), runs)
                if whole:
                    held.append(piece)
                else:
                    clock.mark_once("tts_first_audio")
                    audio.put_nowait(piece)
        elif event.type == until:
            if held:
                clock.mark_once("tts_first_audio")
                for piece in held:
                    audio.put_nowait(piece)
            return


class StreamingSynthesizer:
    """Streaming synthesis on its own connection, opened at once: each phrase goes out as
    a synthesize-chunk the moment the LLM completes it, and audio comes back per sentence."""

    def __init__(self, link: ServerLink) -> None:
        self.link = link

    async def speak(
        self,
        phrases: asyncio.Queue[str | None],
        audio: asyncio.Queue[AudioPiece | None],
        clock: TurnClock,
    ) -> None:
        try:
            async with self.link.connect("synthesis") as conn:
                await conn.send(SynthesizeStart().event())
                reader = asyncio.create_task(
                    _read_audio(conn, audio, clock, SynthesizeStopped().event().type)
                )
                try:
                    spoken: list[str] = []
                    while (phrase := await phrases.get()) is not None:
                        clock.mark_once("tts_request")
                        spoken.append(phrase)
                        # The trailing space lets the server cut the phrase at once.
                        await conn.send(SynthesizeChunk(text=phrase + " ").event())
                    # The whole text again, for servers that only know `synthesize`.
                    await conn.send(Synthesize(text=" ".join(spoken)).event())
                    await conn.send(SynthesizeStop().event())
                    await reader
                finally:
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ServerError):
                        await reader
        finally:
            audio.put_nowait(None)


class WholeSynthesizer:
    """One plain `synthesize` of the whole reply once it is complete; nothing plays until
    all of its audio is in, as with Home Assistant's non-streaming TTS."""

    def __init__(self, link: ServerLink) -> None:
        self.link = link

    async def speak(
        self,
        phrases: asyncio.Queue[str | None],
        audio: asyncio.Queue[AudioPiece | None],
        clock: TurnClock,
    ) -> None:
        try:
            texts: list[str] = []
            while (phrase := await phrases.get()) is not None:
                texts.append(phrase)
            text = " ".join(texts).strip()
            if not text:
                return
            async with self.link.connect("synthesis") as conn:
                clock.mark("tts_request")
                await conn.send(Synthesize(text=text).event())
                await _read_audio(conn, audio, clock, AudioStop().event().type, whole=True)
        finally:
            audio.put_nowait(None)
