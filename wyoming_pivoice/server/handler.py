"""Turns Wyoming events into engine calls, one connection at a time.

The reader loop only validates events and queues work; a per-connection worker
runs the queued requests in order (so replies keep the order of requests) while
the reader keeps watching the socket, so a client that vanishes cancels its own
work at once and frees the model for everybody else. A client that stops reading
holds only its own connection, never a model, and is dropped after
`limits.write_timeout`.

Every request gets the answer its client waits for, whatever happens: a refused or
failed one gets `error` and then the in-band end Home Assistant reads (it ignores
`error`): an empty `transcript`, an empty audio run, `synthesize-stopped` or
`not-handled`. Refusals are queued like requests, so they keep the order of replies.
The limits are listed in limits.py; connection slots in connections.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.handle import Handled, HandledChunk, HandledStart, HandledStop, NotHandled
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from .. import compute_log
from ..audio import AudioFormatError, StreamingConverter, check_format
from ..text import PhraseSplitter
from .connections import Slot
from .limits import BoundedReader
from .services import Services

_LOGGER = logging.getLogger(__name__)

SAMPLES_PER_CHUNK = 1024  # TTS audio-chunk size, as Home Assistant and piper use
# Streaming synthesis also cuts at a clause once it is this long, so a long first sentence
# starts speaking sooner (the satellite cuts its phrases by the same rule).
STREAM_MIN_CLAUSE_CHARS = 24

T = TypeVar("T")

# What a refused or failed request's client waits for (Home Assistant ignores `error`).
TRANSCRIBE, SYNTHESIZE, SENTENCE, STREAM_END, TURN, NOTHING = (
    "transcribe",  # an empty `transcript`
    "synthesize",  # an (empty) audio run closed with `audio-stop`
    "sentence",  # one sentence of a stream: its audio run closed; the stream goes on
    "stream-end",  # `synthesize-stopped`
    "turn",  # `not-handled` with a short text
    "nothing",  # an event that owes no answer of its own (its stream's end comes later)
)
_KIND_OF_EVENT = {
    "transcribe": TRANSCRIBE,
    "audio-start": TRANSCRIBE,
    "audio-chunk": TRANSCRIBE,
    "audio-stop": TRANSCRIBE,
    "transcript": TURN,
    "synthesize": SYNTHESIZE,
    "synthesize-stop": STREAM_END,
}
# The `not-handled` text, which Home Assistant may speak: short, and free of the request's text.
_SORRY = {
    "text-too-long": "Sorry, that was too long for me.",
    "empty-text": "Sorry, I did not catch that.",
}
_SORRY_DEFAULT = "Sorry, I could not answer that."
# Events that are not requests: answered, but they keep no connection alive (connections.py).
_NOT_REQUESTS = {"ping", "describe"}


class RequestError(Exception):
    """A request we refuse; `code` goes into the error event, `kind` says what ends it."""

    def __init__(self, text: str, code: str = "bad-request", kind: str | None = None) -> None:
        super().__init__(text)
        self.code = code
        self.kind = kind


class _Closing(Exception):
    """The connection ends: `error` with this text and code, then close."""

    def __init__(self, text: str, code: str) -> None:
        super().__init__(text)
        self.code = code


@dataclass
class _Job:
    kind: str  # what its client waits for if it fails (see TRANSCRIBE …)
    run: Callable[[], Awaitable[None]]
    request: bool = True  # counts against `max_pending` (refusal answers do not)


def _text_field(data: dict[str, Any], key: str, max_chars: int, required: bool = True) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise RequestError(f"'{key}' must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise RequestError(
            f"'{key}' is {len(value)} characters, over the {max_chars} limit", "text-too-long"
        )
    if "\0" in value:
        raise RequestError(f"'{key}' contains a NUL character")
    return value


def _context_str(context: dict[str, Any] | None, key: str) -> str | None:
    value = (context or {}).get(key)
    return value if isinstance(value, str) else None


def _context(data: dict[str, Any], max_chars: int) -> dict[str, Any] | None:
    """A turn's context, echoed back in `handled`: kept only if it is small."""
    context = _optional_dict(data, "context")
    if context is not None and len(json.dumps(context)) > max_chars:
        raise RequestError(f"'context' is over the {max_chars} character limit", "text-too-long")
    return context


def _check_utf8(data: dict[str, Any]) -> None:
    """The wire is UTF-8: text with lone surrogates (from JSON escapes) cannot be echoed
    back or handed to a model, so refuse it at the door."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError) as err:
        raise RequestError(f"event data cannot be sent back as UTF-8 text: {err}") from None


def _optional_dict(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = data.get(key)
    return value if isinstance(value, dict) else None


def _squash(text: str) -> str:
    return "".join(text.split())


class _Transcription:
    """Audio collected for one transcribe request, already at 16 kHz mono."""

    def __init__(self, language: str | None, max_seconds: float) -> None:
        self.language = language
        self.max_samples = int(max_seconds * 16000)
        self.converter: StreamingConverter | None = None
        self.parts: list[np.ndarray] = []
        self.samples = 0

    def add(self, audio: np.ndarray) -> None:
        self.samples += audio.size
        if self.samples > self.max_samples:
            raise RequestError(
                f"audio is longer than the {self.max_samples // 16000} s limit", "audio-too-long"
            )
        self.parts.append(audio)

    def audio(self) -> np.ndarray:
        if self.converter is not None:
            self.add(self.converter.flush())
        return np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.float32)


class _SynthesisStream:
    """A streaming synthesis in progress: text arrives in chunks, sentences leave as audio.

    Its character limit holds for the whole request: a second `synthesize-start` inside it
    is refused, not a fresh budget.
    """

    def __init__(self, speaker: str | None, max_chars: int) -> None:
        self.speaker = speaker
        self.splitter = PhraseSplitter(STREAM_MIN_CLAUSE_CHARS)
        self.text = ""  # what it accepted so far (to recognise the compatibility `synthesize`)
        self.max_chars = max_chars
        self.refused = False  # over the limit: the rest of the text is dropped

    def feed(self, text: str) -> list[str]:
        if self.refused:
            return []
        if len(self.text) + len(text) > self.max_chars:
            self.refused = True
            raise RequestError(
                f"streamed text is over the {self.max_chars} character limit",
                "text-too-long",
                NOTHING,  # its synthesize-stopped comes at synthesize-stop, after its audio
            )
        self.text += text
        return self.splitter.feed(text)

    def is_its_copy(self, text: str) -> bool:
        """Clients repeat a stream's whole text in a plain `synthesize` (for old servers)."""
        mine, theirs = _squash(self.text), _squash(text)
        return theirs == mine or (self.refused and theirs.startswith(mine))


class PivoiceEventHandler(AsyncEventHandler):
    def __init__(
        self,
        services: Services,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(reader, writer)
        self.services = services
        self.limits = services.settings.limits
        self.bounded = BoundedReader(
            reader, self.limits.max_frame_bytes, self.limits.max_data_bytes
        )
        self.peer = writer.get_extra_info("peername")
        self.host = str(self.peer[0]) if isinstance(self.peer, tuple) and self.peer else "local"
        self.slot = Slot(self.host, busy=self._busy, evict=self._evict)
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self._pending = 0  # requests queued or running (refusal answers excluded)
        self._running = False  # the worker is on a job
        self._worker: asyncio.Task[None] | None = None
        self._transcription: _Transcription | None = None
        self._dropping_audio = False  # the current audio stream's request was refused
        self._queued_samples = 0  # audio held by queued transcriptions
        self._synthesis: _SynthesisStream | None = None
        self._request_deadline: float | None = None  # a request being received must end by then
        self._open_runs: set[str] = set()  # audio/transcript/handled runs started, not stopped
        self._refused = False  # closing on a frame or client we refused
        self._evicted = asyncio.Event()

    # ---- connection lifecycle -------------------------------------------------------------

    async def run(self) -> None:
        """Read events until the client leaves; answer bad frames with an error, then close."""
        services = self.services
        services.clients += 1
        try:
            if not services.connections.admit(self.slot):
                self._refused = True
                await self._error(
                    f"server busy: all {len(services.connections)} connections have a "
                    "request in flight",
                    "busy",
                )
                return
            self._worker = asyncio.create_task(self._work(), name=f"pivoice worker {self.peer}")
            while await self._read_one():
                pass
            # The client finished sending; let queued replies go out before closing.
            if not self._worker.done():
                await self._jobs.put(_STOP)
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await self._worker
        finally:
            services.connections.release(self.slot)
            if self._worker is not None:
                self._worker.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._worker  # also collects a worker that died of a lost client
            if self._refused and services.clients <= 2 * self.limits.max_clients:
                await self._linger()
            services.clients -= 1
            self.writer.close()

    async def _linger(self, seconds: float = 1.0, max_bytes: int = 1 << 20) -> None:
        """Before closing on a refusal, let the client's unread bytes in and drop them.

        Closing with unread input makes the kernel reset the connection, and a reset can
        destroy our `error` event before the client has read it.
        """

        async def discard() -> None:
            received = 0
            while received < max_bytes:
                data = await self.reader.read(65536)
                if not data:
                    return
                received += len(data)

        with contextlib.suppress(Exception):
            self.writer.write_eof()
            await asyncio.wait_for(discard(), seconds)

    def _busy(self) -> bool:
        """A request in flight: being received, queued, running or its replies going out."""
        return (
            self._pending > 0
            or self._running
            or self._transcription is not None
            or self._synthesis is not None
            or not self._jobs.empty()
        )

    def _evict(self) -> None:
        """Close this idle connection to make room for another (connections.py)."""
        self._evicted.set()

    async def _until_evicted(self, waiting: Awaitable[T], timeout: float) -> T:
        """`waiting`, unless the connection is evicted first (_Closing) or `timeout` passes."""
        task = asyncio.ensure_future(waiting)
        evicted = asyncio.ensure_future(self._evicted.wait())
        try:
            done, _ = await asyncio.wait(
                {task, evicted}, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            evicted.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if self._evicted.is_set():
            raise _Closing("closed to make room for another client", "evicted")
        raise asyncio.TimeoutError

    async def _wait_for_frame(self) -> bool:
        """Wait for the next frame to begin (False: the client has gone).

        Raises _Closing when the client was idle too long, or left a request unfinished
        for too long. A client whose replies are still going out is not idle.
        """
        while True:
            if self._request_deadline is not None:
                deadline = self._request_deadline
            else:
                deadline = self.slot.last_request + self.limits.idle_timeout
            try:
                return await self._until_evicted(
                    self.bounded.wait_for_frame(), deadline - time.monotonic()
                )
            except asyncio.TimeoutError:
                if self._request_deadline is not None:
                    raise _Closing(
                        f"request not complete within {self.limits.request_timeout:.0f} s",
                        "timeout",
                    ) from None
                if self._busy():
                    self.slot.touch()
                    continue
                _LOGGER.info("%s idle for %.0f s, closing", self.peer, self.limits.idle_timeout)
                raise _Closing("idle timeout", "idle") from None

    async def _read_one(self) -> bool:
        """Read and dispatch one event; False ends the connection."""
        try:
            if not await self._wait_for_frame():
                return False
            event = await self._until_evicted(
                async_read_event(self.bounded),  # type: ignore[arg-type]
                self.limits.frame_timeout,
            )
        except _Closing as err:
            self._refused = True  # linger: a client still sending must get to read why
            await self._error(str(err), err.code)
            return False
        except asyncio.TimeoutError:
            _LOGGER.info("%s sent a partial frame for %.0f s", self.peer, self.limits.frame_timeout)
            self._refused = True
            await self._error(
                f"frame not complete within {self.limits.frame_timeout:.0f} s", "timeout"
            )
            return False
        except (asyncio.IncompleteReadError, ConnectionError):
            _LOGGER.info("%s vanished mid-frame", self.peer)
            return False
        except Exception as err:
            # A frame whose JSON parsed but is not an event (a list, no "type", a length
            # that is not a number), or JSON nested too deep to parse.
            self._refused = True
            await self._error(f"malformed frame: {err!r}", "malformed")
            return False

        if event is None:
            if self.bounded.violation:
                self._refused = True
                await self._error(self.bounded.violation, "frame-too-large")
            elif self.bounded.got_line:  # bytes that are not an event (not a clean end)
                self._refused = True
                await self._error("malformed frame: not a JSON event", "malformed")
            return False
        if self._worker is not None and self._worker.done():
            return False  # the worker died (client gone while writing)
        kind_of_event = event.type if isinstance(event.type, str) else ""
        if kind_of_event not in _NOT_REQUESTS:
            self.slot.touch()

        try:
            return await self.handle_event(event)
        except RequestError as err:
            kind = err.kind or _KIND_OF_EVENT.get(kind_of_event, NOTHING)
            _LOGGER.info("%s: refused %s: %s (%s)", self.peer, kind_of_event, err.code, err)
            if self._jobs.qsize() >= 2 * self.limits.max_pending:
                # Refusals piling up faster than the client reads their answers.
                self._refused = True
                await self._error("too many refused requests waiting to be answered", "overloaded")
                return False
            self._jobs.put_nowait(_Job(kind, partial(self._answer, err, kind), request=False))
            return True
        except _Closing as err:
            self._refused = True
            await self._error(str(err), err.code)
            return False
        except ConnectionError:
            return False  # gone while we answered it (or dropped for not reading)

    async def handle_event(self, event: Event) -> bool:
        if not isinstance(event.type, str) or not isinstance(event.data, dict):
            raise RequestError("event 'type' must be a string and 'data' an object", "malformed")
        data = event.data
        if event.type in _HANDLED:
            _check_utf8(data)

        if Describe.is_type(event.type):
            await self._reply(self.services.description.info().event())
        elif Ping.is_type(event.type):
            await self._reply(Pong(text=data.get("text")).event())
        elif Transcribe.is_type(event.type):
            language = data.get("language")
            self._transcription = _Transcription(
                language if isinstance(language, str) else None, self.limits.max_audio_seconds
            )
            self._dropping_audio = False
            self._request_started()
        elif AudioStart.is_type(event.type):
            self._audio_start(data)
        elif AudioChunk.is_type(event.type):
            self._audio_chunk(event)
        elif AudioStop.is_type(event.type):
            self._audio_stop()
        elif Transcript.is_type(event.type):
            text = _text_field(data, "text", self.limits.max_text_chars)
            context = _context(data, self.limits.max_text_chars)
            self._queue(TURN, lambda: self._converse(text, context))
        elif Synthesize.is_type(event.type):
            self._synthesize_event(data)
        elif SynthesizeStart.is_type(event.type):
            if self._synthesis is not None:
                raise RequestError(
                    "synthesize-start inside an open stream: its limits go on", kind=NOTHING
                )
            self._synthesis = _SynthesisStream(_speaker(data), self.limits.max_text_chars)
            self._request_started()
        elif SynthesizeChunk.is_type(event.type):
            self._synthesis_chunk(data)
        elif SynthesizeStop.is_type(event.type):
            self._synthesis_stop()
        else:
            _LOGGER.debug("%s: ignoring event %s", self.peer, event.type)
        return True

    async def _reply(self, event: Event) -> None:
        """Answer at once if nothing is owed before it; else in its place after the rest."""
        if self._jobs.empty() and not self._running:
            await self.write_event(event)
            return
        if self._jobs.qsize() >= 2 * self.limits.max_pending:
            raise _Closing("too many requests waiting to be answered", "overloaded")
        self._jobs.put_nowait(_Job(NOTHING, partial(self.write_event, event), request=False))

    def _request_started(self) -> None:
        if self._request_deadline is None:
            self._request_deadline = time.monotonic() + self.limits.request_timeout

    def _request_received(self) -> None:
        if self._transcription is None and self._synthesis is None:
            self._request_deadline = None

    # ---- ASR ------------------------------------------------------------------------------

    def _audio_start(self, data: dict[str, Any]) -> None:
        if self._transcription is None:
            # Clients that skip `transcribe` still get a transcript, in the default language.
            self._transcription = _Transcription(None, self.limits.max_audio_seconds)
            self._request_started()
        try:
            fmt = check_format(data.get("rate"), data.get("width"), data.get("channels"))
        except AudioFormatError as err:
            self._refuse_audio()
            raise RequestError(str(err), "bad-audio-format") from err
        self._transcription.converter = StreamingConverter(fmt)

    def _audio_chunk(self, event: Event) -> None:
        transcription = self._transcription
        if self._dropping_audio:
            return  # the rest of a refused request's audio: already answered
        if transcription is None or transcription.converter is None:
            self._refuse_audio()
            raise RequestError("audio-chunk before audio-start", "bad-audio-format")
        if not event.payload:
            return
        try:
            transcription.add(transcription.converter.convert(event.payload))
        except RequestError:
            self._refuse_audio()
            raise

    def _refuse_audio(self) -> None:
        """The rest of this audio stream is dropped (it was answered) until audio-stop."""
        self._transcription = None
        self._dropping_audio = True
        self._request_received()

    def _audio_stop(self) -> None:
        transcription = self._transcription
        self._transcription = None
        dropping, self._dropping_audio = self._dropping_audio, False
        self._request_received()
        if dropping:
            return  # audio-stop of a refused request: it was answered at the refusal
        if transcription is None or transcription.converter is None:
            raise RequestError("audio-stop without audio-start", "empty-audio")
        audio = transcription.audio()
        if audio.size == 0:
            raise RequestError("no audio was received before audio-stop", "empty-audio")
        # Queued audio is the one thing a pipelining client could pile up: cap it at two
        # requests' worth so one connection's memory stays bounded.
        if self._queued_samples + audio.size > 2 * transcription.max_samples:
            raise RequestError("too much audio waiting to be transcribed", "overloaded")
        self._queued_samples += audio.size
        try:
            self._queue(TRANSCRIBE, lambda: self._transcribe(audio, transcription.language))
        except RequestError:
            self._queued_samples -= audio.size
            raise

    async def _transcribe(self, audio: np.ndarray, language: str | None) -> None:
        try:
            await self._transcribe_held(audio, language)
        finally:
            self._queued_samples -= audio.size

    async def _transcribe_held(self, audio: np.ndarray, language: str | None) -> None:
        start = time.monotonic()
        await self.write_event(TranscriptStart(language=language).event())
        parts: list[str] = []
        segments = self.services.asr.stream(
            lambda asr, cancel: asr.segments(audio, language, cancel)
        )
        async with contextlib.aclosing(segments):
            async for text in segments:
                parts.append(text)
                await self.write_event(TranscriptChunk(text=text).event())
        text = " ".join(parts)
        await self.write_event(Transcript(text=text, language=language).event())
        await self.write_event(TranscriptStop().event())
        self.services.count("transcribe")
        _LOGGER.info(
            "Transcribed %.2f s of audio in %.3f s (%d characters)",
            audio.size / 16000,
            time.monotonic() - start,
            len(text),
        )
        asr = compute_log.model_name(await self.services.asr.get())  # loaded: it just ran
        compute_log.current().record_compute(
            "asr", asr, time.monotonic() - start, audio_seconds=audio.size / 16000
        )
        _LOGGER.debug("Transcript: %r", text)

    # ---- conversation ---------------------------------------------------------------------

    async def _converse(self, text: str, context: dict[str, Any] | None) -> None:
        text = text.strip()
        if not text:
            raise RequestError("empty text: nothing to answer", "empty-text")
        conversation_id = _context_str(context, "conversation_id")
        turn_id = _context_str(context, "turn_id")  # ours: a repeated id replaces that turn
        store = self.services.conversations
        key = store.key(self.host, conversation_id)
        earlier = store.earlier(key, turn_id)
        start = time.monotonic()
        first: float | None = None
        await self.write_event(HandledStart(context=context).event())
        pieces: list[str] = []
        pause = self.services.audio_first.pause_for(self.host, since=start)
        reply_tokens = self.services.settings.llm.max_tokens

        prompt: dict[str, Any] = {}  # the engine that answers and the prompt's tokens

        def turn(llm: Any, cancel: Any) -> Any:
            messages = store.prompt(llm, earlier, text, reply_tokens)
            prompt.update(
                model=compute_log.model_name(llm),
                tokens=compute_log.current().prompt_tokens(llm, messages),
            )
            return llm.stream(messages, cancel=cancel, pause=pause)

        stream = self.services.llm.stream(turn)
        async with contextlib.aclosing(stream):
            async for piece in stream:
                if first is None:
                    first = time.monotonic() - start
                pieces.append(piece)
                await self.write_event(HandledChunk(text=piece).event())
        reply = "".join(pieces).strip()
        store.record(key, text, reply, turn_id)
        # Home Assistant reads only the final `handled`; streaming clients get both.
        await self.write_event(Handled(text=reply, context=context).event())
        await self.write_event(HandledStop().event())
        self.services.count("handle")
        _LOGGER.info(
            "Answered in %.3f s (first token %.3f s, %d characters)",
            time.monotonic() - start,
            first or 0.0,
            len(reply),
        )
        tokens_in = prompt.get("tokens")  # by the model's own tokenizer (None: not counted)
        compute_log.current().record_compute(
            "llm",
            prompt.get("model", "?"),
            time.monotonic() - start,
            first=first,
            tokens_in=tokens_in,
            tokens_out=None if tokens_in is None else len(pieces),  # one piece per generated token
        )
        _LOGGER.debug("Turn %r answered %r", text, reply)

    # ---- TTS ------------------------------------------------------------------------------

    def _synthesize_event(self, data: dict[str, Any]) -> None:
        stream = self._synthesis
        if stream is not None:
            value = data.get("text")
            if not isinstance(value, str) or stream.is_its_copy(value):
                return  # the compatibility copy of the stream's text: spoken already
            # A different text: the client gave up on its stream. End that stream, then
            # answer this request as its own.
            self._synthesis_stop()
        text = _text_field(data, "text", self.limits.max_text_chars)
        if not text.strip():
            raise RequestError("empty text: nothing to speak", "empty-text")
        speaker = _speaker(data)
        self._queue(SYNTHESIZE, lambda: self._synthesize([text], speaker, None))

    def _synthesis_chunk(self, data: dict[str, Any]) -> None:
        if self._synthesis is None:
            raise RequestError("synthesize-chunk outside synthesize-start/stop", kind=NOTHING)
        if self._synthesis.refused:
            return  # the rest of a refused stream: already answered with an error
        text = _text_field(data, "text", self.limits.max_text_chars)
        sentences = self._synthesis.feed(text)
        if sentences:
            stream = self._synthesis
            self._queue(SENTENCE, lambda: self._synthesize(sentences, stream.speaker, None, stream))

    def _synthesis_stop(self) -> None:
        stream = self._synthesis
        self._synthesis = None
        self._request_received()
        if stream is None:
            raise RequestError("synthesize-stop without synthesize-start", kind=STREAM_END)
        rest = None if stream.refused else stream.splitter.flush()
        self._queue(
            STREAM_END,
            lambda: self._synthesize(
                [rest] if rest else [], stream.speaker, SynthesizeStopped().event()
            ),
            force=True,  # the end a streaming client waits for is never refused
        )

    async def _synthesize(
        self,
        texts: list[str],
        speaker: str | None,
        done: Event | None,
        stream: _SynthesisStream | None = None,
    ) -> None:
        """Speak each text as one audio-start…audio-stop run, then send `done` if given.

        `done` (a stream's `synthesize-stopped`) goes out even after a failed sentence:
        streaming clients read until it comes. A stream refused meanwhile (over its limit)
        speaks no more: its client is waiting for the end.
        """
        try:
            for text in texts:
                if stream is not None and stream.refused:
                    break
                if text.strip():
                    await self._speak(text, speaker)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as err:
            if done is None:
                raise
            await self._report(err, SENTENCE)
        if done is not None:
            await self.write_event(done)

    async def _speak(self, text: str, speaker: str | None) -> None:
        """One audio run for `text`, synthesized in bounded pieces (engines/tts.py).

        The model is taken for one piece at a time, so another client's request is served
        between two pieces of a long text instead of after all of it.
        """
        slot = self.services.tts
        tts = await slot.get()
        try:
            tts.speaker_id(speaker)
        except ValueError as err:
            raise RequestError(str(err), "unknown-speaker") from err
        rate, width, channels = tts.sample_rate, tts.sample_width, tts.channels
        start = time.monotonic()
        first: float | None = None
        await self.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        step = SAMPLES_PER_CHUNK * width * channels
        samples = 0
        audio_first = self.services.audio_first
        pieces = await slot.run(lambda engine: engine.pieces(text))
        for piece in pieces:
            stream = slot.stream(
                lambda engine, cancel, piece=piece: audio_first.while_speaking(
                    engine.speak(piece, speaker, cancel), self.host, start
                )
            )
            async with contextlib.aclosing(stream):
                async for pcm in stream:
                    if first is None:
                        first = time.monotonic() - start
                    for offset in range(0, len(pcm), step):
                        chunk = pcm[offset : offset + step]
                        await self.write_event(
                            AudioChunk(
                                rate=rate,
                                width=width,
                                channels=channels,
                                audio=chunk,
                                timestamp=int(samples * 1000 / rate),
                            ).event()
                        )
                        samples += len(chunk) // width
        await self.write_event(AudioStop(timestamp=int(samples * 1000 / rate)).event())
        self.services.count("synthesize")
        _LOGGER.info(
            "Spoke %.2f s of audio in %.3f s (first audio %.3f s, %d characters, %d pieces)",
            samples / rate,
            time.monotonic() - start,
            first or 0.0,
            len(text),
            len(pieces),
        )
        compute_log.current().record_compute(
            "tts",
            compute_log.model_name(tts),
            time.monotonic() - start,
            first=first,
            audio_seconds=samples / rate,
        )
        _LOGGER.debug("Spoke %r", text)

    # ---- plumbing -------------------------------------------------------------------------

    def _queue(self, kind: str, run: Callable[[], Awaitable[None]], force: bool = False) -> None:
        if self._pending >= self.limits.max_pending and not force:
            raise RequestError(
                f"too many pending requests (limit {self.limits.max_pending})", "overloaded"
            )
        self._pending += 1
        self._jobs.put_nowait(_Job(kind, run))

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            if job is _STOP:
                return
            self._running = True
            try:
                await job.run()
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as err:
                await self._report(err, job.kind)
            finally:
                self._running = False
                if job.request:
                    self._pending -= 1
                self.slot.touch()  # the idle clock starts when the replies are out

    async def _report(self, err: Exception, kind: str) -> None:
        """A failed request's `error` event and the end its client waits for."""
        if not isinstance(err, RequestError):
            _LOGGER.error("%s: request failed", self.peer, exc_info=err)
            err = RequestError(f"internal error: {err}", "internal")
        await self._answer(err, kind)

    async def _answer(self, err: RequestError, kind: str) -> None:
        await self._error(str(err), err.code)
        for event in self._ending(kind, err.code):
            await self.write_event(event)

    def _ending(self, kind: str, code: str) -> list[Event]:
        """What ends a refused or failed request for a client that ignores `error`."""
        runs = self._open_runs
        if kind == TRANSCRIBE:
            ending = [Transcript(text="").event()]
            return [*ending, TranscriptStop().event()] if "transcript" in runs else ending
        if kind == TURN:
            ending = [NotHandled(text=_SORRY.get(code, _SORRY_DEFAULT)).event()]
            return [*ending, HandledStop().event()] if "handled" in runs else ending
        if kind in (SYNTHESIZE, SENTENCE):
            if "audio" in runs:
                return [AudioStop().event()]
            if kind == SENTENCE:
                return []
            rate = self.services.description.voice.sample_rate
            return [AudioStart(rate=rate, width=2, channels=1).event(), AudioStop().event()]
        if kind == STREAM_END:
            return [SynthesizeStopped().event()]
        return []

    async def write_event(self, event: Event) -> None:
        """Write one event; a client that reads nothing for `write_timeout` is dropped.

        Without the bound, `drain()` waits forever on a client that stopped reading.
        """
        run, _, part = event.type.partition("-")
        if run in _RUNS and part == "start":
            self._open_runs.add(run)
        elif run in _RUNS and part == "stop":
            self._open_runs.discard(run)
        try:
            await asyncio.wait_for(
                async_write_event(event, self.writer), timeout=self.limits.write_timeout
            )
        except asyncio.TimeoutError:
            _LOGGER.warning(
                "%s read nothing for %.0f s, dropping it", self.peer, self.limits.write_timeout
            )
            self.writer.transport.abort()  # frees the unsent buffer; the reader sees EOF
            raise ConnectionResetError("client stopped reading") from None

    async def _error(self, text: str, code: str) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.write_event(Error(text=text, code=code).event())


async def _stop_marker() -> None:
    """Queued last when the client has finished sending."""


_STOP = _Job(NOTHING, _stop_marker, request=False)
_RUNS = {"audio", "transcript", "handled"}

# Events we act on; any other type is ignored whatever its data holds.
_HANDLED = {
    "describe",
    "ping",
    "transcribe",
    "audio-start",
    "audio-chunk",
    "audio-stop",
    "transcript",
    "synthesize",
    "synthesize-start",
    "synthesize-chunk",
    "synthesize-stop",
}


def _speaker(data: dict[str, Any]) -> str | None:
    voice = data.get("voice")
    if isinstance(voice, dict) and isinstance(voice.get("speaker"), str):
        return voice["speaker"]
    return None
