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
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from .. import compute_log
from ..compute_log import model_name
from ..conversation import ConversationStore, Exchange
from ..engines.asr import WhisperAsr
from ..engines.llm import LlamaChat
from ..engines.priority import AudioFirst
from ..engines.remote_llm import RemoteChat
from ..engines.remote_slot import RemoteLlmSlot
from ..engines.runtime import ModelSlot
from ..engines.tts import PiperTts
from ..settings import ServerSettings
from .info import ServiceDescription
from .slots import ConnectionTable

E = TypeVar("E", WhisperAsr, PiperTts, LlamaChat)
T = TypeVar("T")


def warmed(engine: E) -> E:
    """Loading includes one warm-up call: the first real request should not pay first-run costs."""
    engine.warm_up()
    return engine


def llm_slot(settings: ServerSettings) -> ModelSlot[LlamaChat] | RemoteLlmSlot:
    """The local model, or with --llm-url the remote engine (the local model as its fallback)."""
    local = ModelSlot("LLM (llama.cpp)", lambda: warmed(LlamaChat(settings.llm)), "llm")
    remote = settings.remote_llm
    if remote is None:
        return local
    fallback = local if remote.fallback == "local" else None
    return RemoteLlmSlot(RemoteChat(remote, settings.llm), fallback)


@dataclass
class Services:
    settings: ServerSettings
    description: ServiceDescription
    asr: ModelSlot[WhisperAsr]
    tts: ModelSlot[PiperTts]
    llm: ModelSlot[LlamaChat] | RemoteLlmSlot
    conversations: ConversationStore
    connections: ConnectionTable
    audio_first: AudioFirst = field(default_factory=AudioFirst)
    clients: int = 0  # handlers alive, refused ones included

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> Services:
        llm = llm_slot(settings)
        answering = (lambda: llm.answering) if isinstance(llm, RemoteLlmSlot) else None
        return cls(
            settings=settings,
            description=ServiceDescription.from_settings(settings, answering),
            asr=ModelSlot("ASR (faster-whisper)", lambda: warmed(WhisperAsr(settings.asr)), "asr"),
            tts=ModelSlot("TTS (piper)", lambda: warmed(PiperTts(settings.tts)), "tts"),
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

        def segments(asr: WhisperAsr, cancel: threading.Event) -> Iterator[str]:
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

        def turn(llm: Any, cancel: threading.Event) -> Any:
            messages = store.prompt(llm, earlier, text, reply_tokens)
            output.model = model_name(llm)
            # The model's own tokenizer, only while the compute log is written.
            output.prompt_tokens = compute_log.current().prompt_tokens(llm, messages)
            return llm.stream(messages, cancel=cancel, pause=pause)

        output.items = self.llm.stream(turn)
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

        def speak(engine: PiperTts, cancel: threading.Event, piece: str) -> Iterator[bytes]:
            return self.audio_first.while_speaking(engine.speak(piece, speaker, cancel), key, began)

        def piece_audio(piece: str) -> AsyncGenerator[bytes, None]:
            return self.tts.stream(lambda engine, cancel: speak(engine, cancel, piece))

        return Speech(
            model_name(tts), tts.sample_rate, tts.sample_width, tts.channels, pieces, piece_audio
        )


class Output(Generic[T]):
    """A request's output as a model streams it, and what the compute log needs of it.

    Iterate it inside `contextlib.aclosing`, so leaving early frees the model at once.
    """

    def __init__(self) -> None:
        self.items: AsyncGenerator[T, None] | None = None
        self.model = "?"  # the engine's model name, known once the engine has the request
        self.prompt_tokens: int | None = None  # an LLM prompt's, by its own tokenizer

    def __aiter__(self) -> AsyncGenerator[T, None]:
        assert self.items is not None
        return self.items

    async def aclose(self) -> None:
        if self.items is not None:
            await self.items.aclose()


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
