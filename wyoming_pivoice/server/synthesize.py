"""Text to speech: `synthesize` → one audio run; `synthesize-start`, `synthesize-chunk`…,
`synthesize-stop` → an audio run per sentence, then `synthesize-stopped`.

Home Assistant 2026 sends all TTS as a stream to a server that advertises streaming, and
then repeats the stream's whole text in a plain `synthesize` for older servers: that copy
is recognised and not spoken twice. A stream's sentences are spoken as they complete (a
long first sentence is cut at a clause), each as its own queued request.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event
from wyoming.tts import SynthesizeStopped

from .. import compute_log
from ..text import MIN_CLAUSE_CHARS, PhraseSplitter
from ..wire.errors import ErrorCode
from .connection import Queue, Write
from .errors import Owed, RequestError
from .limits import Limits
from .services import Services, UnknownSpeaker
from .validate import speaker, text_field

_LOGGER = logging.getLogger(__name__)

SAMPLES_PER_CHUNK = 1024  # TTS audio-chunk size, as Home Assistant and piper use
# A chunk that ends in white space after a sentence's end: its writer says the sentence is
# done (our satellite sends each phrase so, once its own splitter has seen the next word).
# Without this cut the splitter waits for the next sentence's first word, so a reply's first
# sentence was spoken only once its second was complete: 3.0 s late for a chunk followed 3 s
# later by the next one (measured, session 9). An LLM's deltas carry their space in front
# (" Please"), so this does not cut a stream of them early.
_DONE_SENTENCE = re.compile(r"[.!?…。！？][\"'”’)\]]*\s+$")


def _squash(text: str) -> str:
    return "".join(text.split())


class _Stream:
    """A streaming synthesis in progress: text arrives in chunks, sentences leave as audio.

    Its character limit holds for the whole request: a second `synthesize-start` inside it
    is refused, not a fresh budget.
    """

    def __init__(self, speaker: str | None, max_chars: int) -> None:
        self.speaker = speaker
        # Clause cuts too, so a long first sentence starts speaking sooner.
        self.splitter = PhraseSplitter(MIN_CLAUSE_CHARS)
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
                ErrorCode.TEXT_TOO_LONG,
                Owed.NOTHING,  # its synthesize-stopped comes at synthesize-stop, after its audio
            )
        self.text += text
        phrases = self.splitter.feed(text)
        if _DONE_SENTENCE.search(text):
            rest = self.splitter.flush()
            if rest:
                phrases.append(rest)
        return phrases

    def is_its_copy(self, text: str) -> bool:
        """Clients repeat a stream's whole text in a plain `synthesize` (for old servers)."""
        mine, theirs = _squash(self.text), _squash(text)
        return theirs == mine or (self.refused and theirs.startswith(mine))


class Syntheses:
    """One connection's synthesis requests, the open stream among them."""

    def __init__(
        self,
        services: Services,
        limits: Limits,
        queue: Queue,
        write: Write,
        host: str,
        report: Callable[[Exception, Owed], Awaitable[None]],
    ) -> None:
        self.services = services
        self.limits = limits
        self.queue = queue
        self.write = write
        self.host = host  # the key of its speech for audio first (services.py)
        self.report = report  # sends a failed sentence's error and end (connection.py)
        self._stream: _Stream | None = None

    @property
    def receiving(self) -> bool:
        return self._stream is not None

    # ---- events ---------------------------------------------------------------------------

    def synthesize(self, data: dict[str, Any]) -> None:
        stream = self._stream
        if stream is not None:
            value = data.get("text")
            if not isinstance(value, str) or stream.is_its_copy(value):
                return  # the compatibility copy of the stream's text: spoken already
            # A different text: the client gave up on its stream. End that stream, then
            # answer this request as its own.
            self.stop()
        text = text_field(data, "text", self.limits.max_text_chars)
        if not text.strip():
            raise RequestError("empty text: nothing to speak", ErrorCode.EMPTY_TEXT)
        voice = speaker(data)
        self.queue.put(Owed.AUDIO, lambda: self._speak_all([text], voice, None))

    def start(self, data: dict[str, Any]) -> None:
        if self._stream is not None:
            raise RequestError(
                "synthesize-start inside an open stream: its limits go on", owed=Owed.NOTHING
            )
        self._stream = _Stream(speaker(data), self.limits.max_text_chars)

    def chunk(self, data: dict[str, Any]) -> None:
        stream = self._stream
        if stream is None:
            raise RequestError("synthesize-chunk outside synthesize-start/stop", owed=Owed.NOTHING)
        if stream.refused:
            return  # the rest of a refused stream: already answered with an error
        sentences = stream.feed(text_field(data, "text", self.limits.max_text_chars))
        if sentences:
            self.queue.put(
                Owed.SENTENCE, lambda: self._speak_all(sentences, stream.speaker, None, stream)
            )

    def stop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            raise RequestError("synthesize-stop without synthesize-start", owed=Owed.STREAM_END)
        rest = None if stream.refused else stream.splitter.flush()
        self.queue.put(
            Owed.STREAM_END,
            lambda: self._speak_all([rest] if rest else [], stream.speaker, SynthesizeStopped()),
            force=True,  # the end a streaming client waits for is never refused
        )

    # ---- replies --------------------------------------------------------------------------

    async def _speak_all(
        self,
        texts: list[str],
        voice: str | None,
        done: SynthesizeStopped | None,
        stream: _Stream | None = None,
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
                    await self._speak(text, voice)
        except ConnectionError:
            raise
        except Exception as err:
            if done is None:
                raise
            await self.report(err, Owed.SENTENCE)
        if done is not None:
            await self.write(done.event())

    async def _speak(self, text: str, voice: str | None) -> None:
        """One audio run for `text`, in chunks of SAMPLES_PER_CHUNK samples."""
        start = time.monotonic()
        try:
            speech = await self.services.speech(text, voice, self.host, began=start)
        except UnknownSpeaker as err:
            raise RequestError(str(err), ErrorCode.UNKNOWN_SPEAKER) from err
        rate, width, channels = speech.rate, speech.width, speech.channels
        first: float | None = None
        await self.write(AudioStart(rate=rate, width=width, channels=channels).event())
        step = SAMPLES_PER_CHUNK * width * channels
        samples = 0
        async with contextlib.aclosing(speech.audio()) as audio:
            async for pcm in audio:
                if first is None:
                    first = time.monotonic() - start
                for offset in range(0, len(pcm), step):
                    chunk = pcm[offset : offset + step]
                    timestamp = int(samples * 1000 / rate)
                    await self.write(_chunk(rate, width, channels, chunk, timestamp))
                    samples += len(chunk) // width
        await self.write(AudioStop(timestamp=int(samples * 1000 / rate)).event())
        seconds = time.monotonic() - start
        _LOGGER.info(
            "Spoke %.2f s of audio in %.3f s (first audio %.3f s, %d characters, %d pieces)",
            samples / rate,
            seconds,
            first or 0.0,
            len(text),
            len(speech.pieces),
        )
        compute_log.current().record_compute(
            "tts", speech.model, seconds, first=first, audio_seconds=samples / rate
        )
        _LOGGER.debug("Spoke %r", text)


def _chunk(rate: int, width: int, channels: int, audio: bytes, timestamp: int) -> Event:
    return AudioChunk(
        rate=rate, width=width, channels=channels, audio=audio, timestamp=timestamp
    ).event()
