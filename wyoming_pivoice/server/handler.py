"""Turns Wyoming events into engine calls, one connection at a time.

The reader loop only validates events and queues work; a per-connection worker
runs the queued requests in order (so replies keep the order of requests) while
the reader keeps watching the socket, so a client that vanishes cancels its own
work at once and frees the model for everybody else. A client that stops reading
holds only its own connection, never a model, and is dropped after
`limits.write_timeout`.

A request that fails ends with an `error` event (nothing else follows for it); a
streaming synthesis still ends with `synthesize-stopped`, and a failed conversation turn
sends `not-handled` just before its error: that is what their clients wait for. The
limits are listed in limits.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

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

from ..audio import AudioFormatError, StreamingConverter, check_format
from ..text import PhraseSplitter
from .limits import BoundedReader
from .services import Services

_LOGGER = logging.getLogger(__name__)

SAMPLES_PER_CHUNK = 1024  # TTS audio-chunk size, as Home Assistant and piper use
# Streaming synthesis also cuts at a clause once it is this long, so a long first sentence
# starts speaking sooner (the satellite cuts its phrases by the same rule).
STREAM_MIN_CLAUSE_CHARS = 24

Job = Callable[[], Awaitable[None]]

# What a failed conversation turn answers in-band (the `error` after it says why).
FAILED_TURN = "Sorry, I could not answer that."


class RequestError(Exception):
    """A request we refuse; `code` goes into the error event."""

    def __init__(self, text: str, code: str = "bad-request") -> None:
        super().__init__(text)
        self.code = code


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
    """A streaming synthesis in progress: text arrives in chunks, sentences leave as audio."""

    def __init__(self, speaker: str | None, max_chars: int) -> None:
        self.speaker = speaker
        self.splitter = PhraseSplitter(STREAM_MIN_CLAUSE_CHARS)
        self.chars = 0
        self.max_chars = max_chars
        self.refused = False  # over the limit: the rest of the text is dropped

    def feed(self, text: str) -> list[str]:
        if self.refused:
            return []
        self.chars += len(text)
        if self.chars > self.max_chars:
            self.refused = True
            raise RequestError(
                f"streamed text is over the {self.max_chars} character limit", "text-too-long"
            )
        return self.splitter.feed(text)


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
        self._jobs: asyncio.Queue[Job] = asyncio.Queue(self.limits.max_pending)
        self._worker: asyncio.Task[None] | None = None
        self._transcription: _Transcription | None = None
        self._dropping_audio = False  # the current audio stream's request was refused
        self._queued_samples = 0  # audio held by queued transcriptions
        self._synthesis: _SynthesisStream | None = None
        self._refused = False  # closing on a frame or client we refused

    # ---- connection lifecycle -------------------------------------------------------------

    async def run(self) -> None:
        """Read events until the client leaves; answer bad frames with an error, then close."""
        services = self.services
        services.clients += 1
        try:
            if services.clients > self.limits.max_clients:
                self._refused = True
                await self._error(
                    f"server busy: {self.limits.max_clients} clients already connected", "busy"
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

    async def _read_one(self) -> bool:
        """Read and dispatch one event; False ends the connection."""
        try:
            event = await asyncio.wait_for(
                async_read_event(self.bounded),  # type: ignore[arg-type]
                timeout=self.limits.idle_timeout,
            )
        except asyncio.TimeoutError:
            _LOGGER.info("%s idle for %.0f s, closing", self.peer, self.limits.idle_timeout)
            await self._error("idle timeout", "idle")
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

        try:
            return await self.handle_event(event)
        except RequestError as err:
            _LOGGER.info("%s: refused %s: %s", self.peer, event.type, err)
            await self._error(str(err), err.code)
            return True
        except ConnectionError:
            return False  # gone while we answered it (or dropped for not reading)

    async def handle_event(self, event: Event) -> bool:
        if not isinstance(event.type, str) or not isinstance(event.data, dict):
            raise RequestError("event 'type' must be a string and 'data' an object", "malformed")
        data = event.data
        if event.type in _HANDLED:
            _check_utf8(data)

        if Describe.is_type(event.type):
            await self.write_event(self.services.description.info().event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=data.get("text")).event())
        elif Transcribe.is_type(event.type):
            language = data.get("language")
            self._transcription = _Transcription(
                language if isinstance(language, str) else None, self.limits.max_audio_seconds
            )
        elif AudioStart.is_type(event.type):
            self._audio_start(data)
        elif AudioChunk.is_type(event.type):
            self._audio_chunk(event)
        elif AudioStop.is_type(event.type):
            self._audio_stop()
        elif Transcript.is_type(event.type):
            text = _text_field(data, "text", self.limits.max_text_chars)
            context = _context(data, self.limits.max_text_chars)
            self._queue(lambda: self._converse(text, context))
        elif Synthesize.is_type(event.type):
            if self._synthesis is None:  # inside a stream it only repeats the text: skip it
                text = _text_field(data, "text", self.limits.max_text_chars)
                if not text.strip():
                    raise RequestError("empty text: nothing to speak", "empty-text")
                speaker = _speaker(data)
                self._queue(lambda: self._synthesize([text], speaker, None))
        elif SynthesizeStart.is_type(event.type):
            self._synthesis = _SynthesisStream(_speaker(data), self.limits.max_text_chars)
        elif SynthesizeChunk.is_type(event.type):
            self._synthesis_chunk(data)
        elif SynthesizeStop.is_type(event.type):
            self._synthesis_stop()
        else:
            _LOGGER.debug("%s: ignoring event %s", self.peer, event.type)
        return True

    # ---- ASR ------------------------------------------------------------------------------

    def _audio_start(self, data: dict[str, Any]) -> None:
        if self._transcription is None:
            # Clients that skip `transcribe` still get a transcript, in the default language.
            self._transcription = _Transcription(None, self.limits.max_audio_seconds)
        try:
            fmt = check_format(data.get("rate"), data.get("width"), data.get("channels"))
        except AudioFormatError as err:
            self._refuse_audio()
            raise RequestError(str(err), "bad-audio-format") from err
        self._transcription.converter = StreamingConverter(fmt)

    def _audio_chunk(self, event: Event) -> None:
        transcription = self._transcription
        if self._dropping_audio:
            return  # the rest of a refused request's audio: already answered with an error
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
        self._transcription = None
        self._dropping_audio = True

    def _audio_stop(self) -> None:
        transcription = self._transcription
        self._transcription = None
        self._dropping_audio = False
        if transcription is None or transcription.converter is None:
            return  # audio-stop of a refused or never-started request: nothing to answer
        audio = transcription.audio()
        if audio.size == 0:
            raise RequestError("no audio was received before audio-stop", "empty-audio")
        # Queued audio is the one thing a pipelining client could pile up: cap it at two
        # requests' worth so one connection's memory stays bounded.
        if self._queued_samples + audio.size > 2 * transcription.max_samples:
            raise RequestError("too much audio waiting to be transcribed", "overloaded")
        self._queued_samples += audio.size
        self._queue(lambda: self._transcribe(audio, transcription.language))

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
            "Transcribed %.2f s of audio in %.3f s: %r",
            audio.size / 16000,
            time.monotonic() - start,
            text,
        )

    # ---- conversation ---------------------------------------------------------------------

    async def _converse(self, text: str, context: dict[str, Any] | None) -> None:
        text = text.strip()
        if not text:
            raise RequestError("empty text: nothing to answer", "empty-text")
        conversation_id = _context_str(context, "conversation_id")
        turn_id = _context_str(context, "turn_id")  # ours: a repeated id replaces that turn
        store = self.services.conversations
        messages = store.messages(conversation_id, text, turn_id)
        start = time.monotonic()
        first: float | None = None
        await self.write_event(HandledStart(context=context).event())
        pieces: list[str] = []
        pause = self.services.audio_first.pause
        stream = self.services.llm.stream(
            lambda llm, cancel: llm.stream(messages, cancel=cancel, pause=pause)
        )
        try:
            async with contextlib.aclosing(stream):
                async for piece in stream:
                    if first is None:
                        first = time.monotonic() - start
                    pieces.append(piece)
                    await self.write_event(HandledChunk(text=piece).event())
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:
            # Home Assistant ignores `error` and reads until handled/not-handled: give it
            # its answer first, then the error (with the reason) ends the turn.
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.write_event(NotHandled(text=FAILED_TURN, context=context).event())
            raise
        reply = "".join(pieces).strip()
        store.record(conversation_id, text, reply, turn_id)
        # Home Assistant reads only the final `handled`; streaming clients get both.
        await self.write_event(Handled(text=reply, context=context).event())
        await self.write_event(HandledStop().event())
        self.services.count("handle")
        _LOGGER.info(
            "Answered in %.3f s (first token %.3f s): %r",
            time.monotonic() - start,
            first or 0.0,
            reply,
        )

    # ---- TTS ------------------------------------------------------------------------------

    def _synthesis_chunk(self, data: dict[str, Any]) -> None:
        if self._synthesis is None:
            raise RequestError("synthesize-chunk outside synthesize-start/stop")
        if self._synthesis.refused:
            return  # the rest of a refused stream: already answered with an error
        text = _text_field(data, "text", self.limits.max_text_chars)
        sentences = self._synthesis.feed(text)
        if sentences:
            speaker = self._synthesis.speaker
            self._queue(lambda: self._synthesize(sentences, speaker, None))

    def _synthesis_stop(self) -> None:
        stream = self._synthesis
        self._synthesis = None
        if stream is None:
            raise RequestError("synthesize-stop without synthesize-start")
        rest = None if stream.refused else stream.splitter.flush()
        self._queue(
            lambda: self._synthesize(
                [rest] if rest else [], stream.speaker, SynthesizeStopped().event()
            )
        )

    async def _synthesize(self, texts: list[str], speaker: str | None, done: Event | None) -> None:
        """Speak each text as one audio-start…audio-stop run, then send `done` if given.

        `done` (a stream's `synthesize-stopped`) goes out even after a failed sentence:
        streaming clients read until it comes.
        """
        try:
            for text in texts:
                if text.strip():
                    await self._speak(text, speaker)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as err:
            if done is None:
                raise
            await self._report(err)
        if done is not None:
            await self.write_event(done)

    async def _speak(self, text: str, speaker: str | None) -> None:
        tts = await self.services.tts.get()
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
        stream = self.services.tts.stream(
            lambda engine, cancel: audio_first.while_speaking(
                engine.sentences(text, speaker, cancel)
            )
        )
        try:
            async with contextlib.aclosing(stream):
                async for pcm in stream:
                    if first is None:
                        first = time.monotonic() - start
                    for offset in range(0, len(pcm), step):
                        piece = pcm[offset : offset + step]
                        await self.write_event(
                            AudioChunk(
                                rate=rate,
                                width=width,
                                channels=channels,
                                audio=piece,
                                timestamp=int(samples * 1000 / rate),
                            ).event()
                        )
                        samples += len(piece) // width
        except ConnectionError:
            raise  # nobody left to tell
        except Exception:
            # Home Assistant's plain TTS waits for audio-stop and ignores `error`: close the
            # audio run before the error goes out, or it would hang on a failed synthesis.
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.write_event(AudioStop(timestamp=int(samples * 1000 / rate)).event())
            raise
        await self.write_event(AudioStop(timestamp=int(samples * 1000 / rate)).event())
        self.services.count("synthesize")
        _LOGGER.info(
            "Spoke %.2f s of audio in %.3f s (first audio %.3f s) for %r",
            samples / rate,
            time.monotonic() - start,
            first or 0.0,
            text,
        )

    # ---- plumbing -------------------------------------------------------------------------

    def _queue(self, job: Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except asyncio.QueueFull:
            raise RequestError(
                f"too many pending requests (limit {self.limits.max_pending})", "overloaded"
            ) from None

    async def _work(self) -> None:
        while True:
            job = await self._jobs.get()
            if job is _STOP:
                return
            try:
                await job()
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as err:
                await self._report(err)

    async def _report(self, err: Exception) -> None:
        """A failed request's `error` event: refused (RequestError) or failed inside."""
        if isinstance(err, RequestError):
            await self._error(str(err), err.code)
        else:
            _LOGGER.error("%s: request failed", self.peer, exc_info=err)
            await self._error(f"internal error: {err}", "internal")

    async def write_event(self, event: Event) -> None:
        """Write one event; a client that reads nothing for `write_timeout` is dropped.

        Without the bound, `drain()` waits forever on a client that stopped reading.
        """
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


_STOP: Job = _stop_marker

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
