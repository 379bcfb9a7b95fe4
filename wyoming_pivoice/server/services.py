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
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from .. import compute_log
from ..compute_log import model_name
from ..conversation import ConversationStore, Exchange
from ..engines import registry
from ..engines.priority import AudioFirst
from ..engines.protocols import (
    ChatEngine,
    EngineDescription,
    Message,
    PromptBuilder,
    SpeechToText,
    TextToSpeech,
)
from ..engines.remote_llm import RemoteChat
from ..engines.remote_slot import RemoteLlmSlot
from ..engines.runtime import ModelSlot
from ..models import ModelNotFoundError
from ..settings import ServerSettings
from .info import ServiceDescription
from .slots import ConnectionTable

T = TypeVar("T")
_LOGGER = logging.getLogger(__name__)


def loaded(kind: str, settings: Any) -> Any:
    """The registry's engine for these settings, warmed up: loading includes one call, so the
    first real request does not pay first-run costs."""
    try:
        engine = registry.load(kind, settings)
    except ModelNotFoundError as err:
        # One line a user can act on (offline, a wrong name …); each request for this
        # model then gets an `error` and its in-band end.
        _LOGGER.error("Cannot load the %s model: %s", kind, err)
        raise
    engine.warm_up()
    return engine


class _Streaming(Protocol):
    """A slot that streams fn(engine, cancel): ModelSlot (a blocking engine, in a thread)
    or RemoteLlmSlot (the remote engine's async stream, or its local fallback's)."""

    name: str

    @property
    def loaded(self) -> bool: ...

    def start_loading(self) -> Any: ...

    def stream(self, fn: Callable[[Any, threading.Event], Any]) -> AsyncGenerator[str, None]: ...


class SlotChat:
    """The one async ChatEngine the server holds, over the local llama.cpp engine (sync,
    in its ModelSlot) or the remote one (async, in RemoteLlmSlot): both engines take
    `stream(messages, max_tokens, cancel, pause)`, and each slot drives what its engine
    returns. The prompt is fitted where the engine is held (conversation.py)."""

    def __init__(self, slot: _Streaming) -> None:
        self.slot = slot

    @property
    def name(self) -> str:
        return self.slot.name

    @property
    def loaded(self) -> bool:
        return self.slot.loaded

    def start_loading(self) -> None:
        self.slot.start_loading()

    def reply(
        self,
        prompt: PromptBuilder,
        max_tokens: int | None = None,
        pause: Callable[[], None] | None = None,
        on_prompt: Callable[[Any, list[Message]], None] | None = None,
    ) -> AsyncIterator[str]:
        def turn(engine: Any, cancel: threading.Event) -> Any:
            messages = prompt(engine)
            if on_prompt is not None:
                on_prompt(engine, messages)
            return engine.stream(messages, max_tokens, cancel=cancel, pause=pause)

        return self.slot.stream(turn)


def chat_engine(settings: ServerSettings) -> ChatEngine:
    """The local model, or with --llm-url the remote engine (the local model as its fallback)."""
    local = ModelSlot(f"LLM ({settings.llm.engine})", lambda: loaded("chat", settings.llm), "llm")
    remote = settings.remote_llm
    if remote is None:
        return SlotChat(local)
    fallback = local if remote.fallback == "local" else None
    return SlotChat(RemoteLlmSlot(RemoteChat(remote, settings.llm), fallback))


def chat_description(settings: ServerSettings) -> EngineDescription:
    local = registry.describe("chat", settings.llm)
    remote = settings.remote_llm
    if remote is None:
        return local
    text = f"the OpenAI-compatible engine at {remote.url}"
    if remote.fallback == "local":
        text += f" (the local {local.model} answers while it cannot)"
    return EngineDescription(
        kind="chat",
        engine="openai-compatible",
        model=remote.model or "remote",
        languages=local.languages,
        attribution="wyoming-pivoice",
        url="https://github.com/wyoming-pivoice",
        description=text,
    )


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
        llm = chat_engine(settings)
        slot = llm.slot if isinstance(llm, SlotChat) else None
        answering = (lambda: slot.answering) if isinstance(slot, RemoteLlmSlot) else None
        asr, tts = settings.asr, settings.tts
        description = ServiceDescription(
            asr=registry.describe("asr", asr),
            voice=registry.describe("tts", tts),
            llm=chat_description(settings),
            answering=answering,
        )
        _warn_language(settings, description)
        return cls(
            settings=settings,
            description=description,
            asr=ModelSlot(f"ASR ({asr.engine})", lambda: loaded("asr", asr), "asr"),
            tts=ModelSlot(f"TTS ({tts.engine})", lambda: loaded("tts", tts), "tts"),
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

        def prompt(engine: Any) -> list[Message]:
            return store.prompt(engine, earlier, text, reply_tokens)

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
