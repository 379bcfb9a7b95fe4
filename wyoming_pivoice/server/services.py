"""The process-wide state every connection shares: one slot per model, the limits,
the conversation histories and the connection slots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from ..conversation import ConversationStore
from ..engines.asr import WhisperAsr
from ..engines.llm import LlamaChat
from ..engines.priority import AudioFirst
from ..engines.remote_llm import RemoteChat
from ..engines.remote_slot import RemoteLlmSlot
from ..engines.runtime import ModelSlot
from ..engines.tts import PiperTts
from ..settings import ServerSettings
from .connections import ConnectionTable
from .info import ServiceDescription

E = TypeVar("E", WhisperAsr, PiperTts, LlamaChat)


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
    served: dict[str, int] = field(default_factory=dict)  # requests answered, by kind

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

    def count(self, kind: str) -> None:
        self.served[kind] = self.served.get(kind, 0) + 1
