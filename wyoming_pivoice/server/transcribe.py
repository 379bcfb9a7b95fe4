"""Speech to text: `transcribe`, `audio-start`, `audio-chunk`…, `audio-stop` → `transcript`.

Audio is converted to 16 kHz mono as it arrives and checked against its limits; at
`audio-stop` the request is queued, and its reply streams `transcript-start`, a
`transcript-chunk` per segment, the `transcript` and `transcript-stop`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import numpy as np
from wyoming.asr import Transcript, TranscriptChunk, TranscriptStart, TranscriptStop

from .. import compute_log
from ..audio.pcm import AudioFormatError, StreamingConverter, check_format
from ..wire.errors import ErrorCode
from .connection import Queue, Write
from .errors import Owed, RequestError
from .limits import Limits
from .services import Services
from .validate import language

_LOGGER = logging.getLogger(__name__)


class _Audio:
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
                f"audio is longer than the {self.max_samples // 16000} s limit",
                ErrorCode.AUDIO_TOO_LONG,
            )
        self.parts.append(audio)

    def audio(self) -> np.ndarray:
        if self.converter is not None:
            self.add(self.converter.flush())
        return np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.float32)


class Transcriptions:
    """One connection's transcribe requests: the one being received, and the queued audio."""

    def __init__(self, services: Services, limits: Limits, queue: Queue, write: Write) -> None:
        self.services = services
        self.limits = limits
        self.queue = queue
        self.write = write
        self._current: _Audio | None = None
        self._dropping = False  # the current audio stream's request was refused
        self._queued_samples = 0  # audio held by queued transcriptions

    @property
    def receiving(self) -> bool:
        return self._current is not None

    def transcribe(self, data: dict[str, Any]) -> None:
        self._current = _Audio(language(data), self.limits.max_audio_seconds)
        self._dropping = False

    def audio_start(self, data: dict[str, Any]) -> None:
        if self._current is None:
            # Clients that skip `transcribe` still get a transcript, in the default language.
            self._current = _Audio(None, self.limits.max_audio_seconds)
        try:
            fmt = check_format(data.get("rate"), data.get("width"), data.get("channels"))
        except AudioFormatError as err:
            self._refuse()
            raise RequestError(str(err), ErrorCode.BAD_AUDIO_FORMAT) from err
        self._current.converter = StreamingConverter(fmt)

    def audio_chunk(self, payload: bytes | None) -> None:
        current = self._current
        if self._dropping:
            return  # the rest of a refused request's audio: already answered
        if current is None or current.converter is None:
            self._refuse()
            raise RequestError("audio-chunk before audio-start", ErrorCode.BAD_AUDIO_FORMAT)
        if not payload:
            return
        try:
            current.add(current.converter.convert(payload))
        except RequestError:
            self._refuse()
            raise

    def _refuse(self) -> None:
        """The rest of this audio stream is dropped (it was answered) until audio-stop."""
        self._current = None
        self._dropping = True

    def audio_stop(self) -> None:
        current, self._current = self._current, None
        dropping, self._dropping = self._dropping, False
        if dropping:
            return  # audio-stop of a refused request: it was answered at the refusal
        if current is None or current.converter is None:
            raise RequestError("audio-stop without audio-start", ErrorCode.EMPTY_AUDIO)
        audio = current.audio()
        if audio.size == 0:
            raise RequestError("no audio was received before audio-stop", ErrorCode.EMPTY_AUDIO)
        # Queued audio is the one thing a pipelining client could pile up: cap it at two
        # requests' worth so one connection's memory stays bounded.
        if self._queued_samples + audio.size > 2 * current.max_samples:
            raise RequestError("too much audio waiting to be transcribed", ErrorCode.OVERLOADED)
        self._queued_samples += audio.size
        try:
            self.queue.put(Owed.TRANSCRIPT, lambda: self._run(audio, current.language))
        except RequestError:
            self._queued_samples -= audio.size
            raise

    async def _run(self, audio: np.ndarray, language: str | None) -> None:
        try:
            await self._reply(audio, language)
        finally:
            self._queued_samples -= audio.size

    async def _reply(self, audio: np.ndarray, language: str | None) -> None:
        start = time.monotonic()
        await self.write(TranscriptStart(language=language).event())
        parts: list[str] = []
        output = self.services.transcribe(audio, language)
        async with contextlib.aclosing(output):
            async for text in output:
                parts.append(text)
                await self.write(TranscriptChunk(text=text).event())
        text = " ".join(parts)
        await self.write(Transcript(text=text, language=language).event())
        await self.write(TranscriptStop().event())
        seconds = time.monotonic() - start
        _LOGGER.info(
            "Transcribed %.2f s of audio in %.3f s (%d characters)",
            audio.size / 16000,
            seconds,
            len(text),
        )
        compute_log.current().record_compute(
            "asr", output.model, seconds, audio_seconds=audio.size / 16000
        )
        _LOGGER.debug("Transcript: %r", text)
