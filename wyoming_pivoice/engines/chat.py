"""The one async ChatEngine (engines/protocols.py) over both kinds of chat engine: the local
llama.cpp engine, blocking, in its ModelSlot (a worker thread), and the remote
OpenAI-compatible engine, async, in RemoteLlmSlot (with the local model as its fallback).

Both engines take `stream(messages, max_tokens, cancel, pause)`; each slot drives what its
engine returns (an iterator in a thread, an async generator on the loop), so one adapter
serves both and the server holds one kind. The prompt is built where the engine is held,
with its tokenizer (conversation.py fits the history to the context there).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Protocol

from . import registry
from .llm import LlmSettings
from .protocols import ChatEngine, EngineDescription, Message, PromptBuilder
from .remote_llm import RemoteChat, RemoteLlmSettings
from .remote_slot import RemoteLlmSlot
from .runtime import ModelSlot


class _Streaming(Protocol):
    """A slot that streams fn(engine, cancel): ModelSlot or RemoteLlmSlot."""

    name: str

    @property
    def loaded(self) -> bool: ...

    def start_loading(self) -> Any: ...

    def stream(self, fn: Callable[[Any, threading.Event], Any]) -> AsyncGenerator[str, None]: ...


class SlotChat:
    """A ChatEngine over a slot of either kind."""

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

    @property
    def local(self) -> ModelSlot[Any] | None:
        """The local model's slot, if one runs here (the remote engine's fallback): what the
        start waits for before it says ready (server/app.py)."""
        if isinstance(self.slot, ModelSlot):
            return self.slot
        return getattr(self.slot, "fallback", None)

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


def engine(llm: LlmSettings, remote: RemoteLlmSettings | None = None) -> ChatEngine:
    """The local model, or with --llm-url the remote engine (the local model as its fallback)."""
    local = ModelSlot(f"LLM ({llm.engine})", lambda: registry.warmed("chat", llm), "llm")
    if remote is None:
        return SlotChat(local)
    fallback = local if remote.fallback == "local" else None
    return SlotChat(RemoteLlmSlot(RemoteChat(remote, llm), fallback))


def answering(chat: ChatEngine) -> Callable[[], str] | None:
    """Which engine takes the next turn, for `describe` (a remote engine with a fallback)."""
    slot = getattr(chat, "slot", None)
    if isinstance(slot, RemoteLlmSlot):
        return lambda: slot.answering
    return None


def describe(llm: LlmSettings, remote: RemoteLlmSettings | None = None) -> EngineDescription:
    local = registry.describe("chat", llm)
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
        program=local.program,  # one conversation agent in Home Assistant, whichever answers
    )
