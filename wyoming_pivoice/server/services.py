"""The process-wide state every connection shares — one slot per model, the limits, the
conversation histories, the connection slots — and the scheduling of the models.

The request handlers (transcribe.py, converse.py, synthesize.py) ask for text or audio
here and know nothing of model APIs; the scheduling is decided here:
- one call at a time per model (engines/runtime.py), the model given back as soon as its
  worker thread is done;
- synthesis takes the voice for one bounded piece at a time (engines/tts.py), so another
  client's request is served between two pieces of a long text;
- audio first (engines/priority.py): while a synthesis for a turn's own client runs, begun
  after the turn, the LLM waits at its next token boundary.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from .. import compute_log
from ..compute_log import model_name
from ..conversation import ConversationStore, Exchange
from ..engines import chat, registry
from ..engines.priority import AudioFirst
from ..engines.protocols import ChatEngine, Message, SpeechToText, TextToSpeech, TokenCounter
from ..engines.runtime import ModelSlot
from ..settings import ServerSettings
from .info import ServiceDescription
from .slots import ConnectionTable

T = TypeVar("T")
_LOGGER = logging.getLogger(__name__)


@dataclass
class Services:
    settings: ServerSettings
    description: ServiceDescription
    asr: ModelSlot[SpeechToText]
    tts: ModelSlot[TextToSpeech]
    llm: ChatEngine
    conversations: ConversationStore
    connections: ConnectionTable
    audio_first: AudioFirst = field(default_factory=AudioFirst)
    clients: int = 0  # handlers alive, refused ones included

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> Services:
        llm = chat.engine(settings.llm, settings.remote_llm)
        asr, tts = settings.asr, settings.tts
        description = ServiceDescription(
            asr=registry.describe("asr", asr),
            voice=registry.describe("tts", tts),
            llm=chat.describe(settings.llm, settings.remote_llm),
            answering=chat.answering(llm),
        )
        _warn_language(settings, description)
        return cls(
            settings=settings,
            description=description,
            asr=ModelSlot(f"ASR ({asr.engine})", lambda: registry.warmed("asr", asr), "asr"),
            tts=ModelSlot(f"TTS ({tts.engine})", lambda: registry.warmed("tts", tts), "tts"),
            llm=llm,
            conversations=ConversationStore(settings.llm.system_prompt),
            connections=ConnectionTable(
                settings.limits.max_clients, settings.limits.max_clients_per_host
            ),
            audio_first=AudioFirst(enabled=settings.audio_first),
        )

    def start_loading(self) -> None:
        """ASR and TTS always preload; the LLM too unless --llm-lazy (then on first turn).

        The ASR loads first, alone: faster-whisper's tokenizer parse holds the GIL for
        ~0.2 s (longer on a busy CPU), and with the other loaders beside it that stretched
        past Home Assistant's one second for `describe`.
        """

        def then_the_rest(_done: object) -> None:
            self.tts.start_loading()
            if not self.settings.llm_lazy:
                self.llm.start_loading()

        self.asr.start_loading().add_done_callback(then_the_rest)

    def transcribe(self, audio: np.ndarray, language: str | None) -> Output[str]:
        """The text of each decoded segment of 16 kHz mono float32 `audio`."""
        output: Output[str] = Output()

        def segments(asr: SpeechToText, cancel: threading.Event) -> Iterator[str]:
            output.model = model_name(asr)
            return asr.segments(audio, language, cancel)

        output.items = self.asr.stream(segments)
        return output

    def answer(self, key: str, earlier: list[Exchange], text: str, began: float) -> Output[str]:
        """The reply's pieces to `text` after the `earlier` exchanges, its prompt fitted to
        the model's context; it yields to speech for `key` that begins after `began`."""
        pause = self.audio_first.pause_for(key, since=began)
        reply_tokens = self.settings.llm.max_tokens
        store = self.conversations
        output: Output[str] = Output()

        def prompt(engine: TokenCounter) -> list[Message]:
            fitted = store.fit(engine, earlier, text, reply_tokens)
            output.history_kept = fitted.kept
            return fitted.messages

        def on_prompt(engine: Any, messages: list[Message]) -> None:
            output.model = model_name(engine)
            # The model's own tokenizer, only while the compute log is written.
            output.prompt_tokens = compute_log.current().prompt_tokens(engine, messages)

        output.items = self.llm.reply(prompt, pause=pause, on_prompt=on_prompt)
        return output

    async def speech(self, text: str, speaker: str | None, key: str, began: float) -> Speech:
        """`text` as speech for `key` (a request that began at `began`), cut into pieces.

        Raises UnknownSpeaker if the voice has no such speaker.
        """
        tts = await self.tts.get()
        try:
            tts.speaker_id(speaker)
        except ValueError as err:
            raise UnknownSpeaker(str(err)) from err
        pieces = await self.tts.run(lambda engine: engine.pieces(text))

        def speak(engine: TextToSpeech, cancel: threading.Event, piece: str) -> Iterator[bytes]:
            return self.audio_first.while_speaking(engine.speak(piece, speaker, cancel), key, began)

        def piece_audio(piece: str) -> AsyncGenerator[bytes, None]:
            return self.tts.stream(lambda engine, cancel: speak(engine, cancel, piece))

        return Speech(
            model_name(tts), tts.sample_rate, tts.sample_width, tts.channels, pieces, piece_audio
        )


def _warn_language(settings: ServerSettings, description: ServiceDescription) -> None:
    """--language asked for what a stage cannot serve: one line that says what to change."""
    language = settings.language
    if language is None or language.startswith("en"):
        return
    if description.asr.languages == ("en",):
        _LOGGER.warning(
            "--language %s: the ASR model %s is English-only; use a multilingual one, "
            "e.g. --asr-model base",
            language,
            description.asr.model,
        )
    if not any(v.split("_")[0] == language.split("_")[0] for v in description.voice.languages):
        _LOGGER.warning(
            "--language %s: the voice %s speaks %s",
            language,
            description.voice.model,
            ", ".join(description.voice.languages),
        )


class Output(Generic[T]):
    """A request's output as a model streams it, and what the compute log needs of it.

    Iterate it inside `contextlib.aclosing`, so leaving early frees the model at once.
    """

    def __init__(self) -> None:
        self.items: AsyncIterator[T] | None = None
        self.model = "?"  # the engine's model name, known once the engine has the request
        self.prompt_tokens: int | None = None  # an LLM prompt's, by its own tokenizer
        self.history_kept: int | None = None  # an LLM prompt's exchanges (conversation.fit)

    def __aiter__(self) -> AsyncIterator[T]:
        assert self.items is not None
        return self.items

    async def aclose(self) -> None:
        close = getattr(self.items, "aclose", None)  # an async generator's: frees the model
        if close is not None:
            await close()


class UnknownSpeaker(ValueError):
    """The voice has no speaker by that name or id."""


@dataclass
class Speech:
    """One text's audio: 16-bit PCM at `rate`, spoken one piece (one inference) at a time."""

    model: str
    rate: int
    width: int
    channels: int
    pieces: list[str]
    _piece_audio: Callable[[str], AsyncGenerator[bytes, None]]

    async def audio(self) -> AsyncGenerator[bytes, None]:
        """The PCM of every piece in order; the voice is taken anew for each piece."""
        for piece in self.pieces:
            async with contextlib.aclosing(self._piece_audio(piece)) as chunks:
                async for pcm in chunks:
                    yield pcm
