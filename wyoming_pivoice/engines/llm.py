"""Conversation with llama.cpp (llama-cpp-python) on a GGUF model, streamed token by token."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..models import resolve_llm

Message = dict[str, str]


@dataclass(frozen=True)
class LlmSettings:
    model: str = "embedded"
    threads: int = 0  # 0: all cores
    context: int = 2048
    max_tokens: int = 256
    temperature: float = 0.2
    system_prompt: str = (
        "You are a helpful voice assistant running on a Raspberry Pi. "
        "Answer in one or two short spoken sentences, without lists or markup."
    )


class LlamaChat:
    """Loads one GGUF model; `stream` is blocking and must run in a worker thread.

    The chat template comes from the GGUF metadata (llama-cpp-python's default).
    llama.cpp keeps the KV cache of the previous prompt and re-evaluates only
    what differs, so a fixed system prompt is not recomputed every turn.
    """

    def __init__(self, settings: LlmSettings) -> None:
        from llama_cpp import Llama

        self.settings = settings
        self.model_path = resolve_llm(settings.model)
        self.llama = Llama(
            model_path=str(self.model_path),
            n_ctx=settings.context,
            n_threads=settings.threads or os.cpu_count() or 1,
            verbose=False,
        )

    @property
    def name(self) -> str:
        return self.model_path.stem

    def stream(
        self,
        messages: list[Message],
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        pause: Callable[[], None] | None = None,
    ) -> Iterator[str]:
        """Yield the reply's text pieces as llama.cpp produces them.

        `pause` runs before each next token (audio first: see engines/priority.py).
        """
        chunks = self.llama.create_chat_completion(
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens or self.settings.max_tokens,
            temperature=self.settings.temperature,
            stream=True,
        )
        try:
            for chunk in chunks:
                if cancel is not None and cancel.is_set():
                    return
                piece = chunk["choices"][0]["delta"].get("content")  # type: ignore[index]
                if piece:
                    yield piece
                if pause is not None:
                    pause()
        finally:
            chunks.close()  # type: ignore[union-attr]

    def warm_up(self) -> None:
        """Evaluate the system prompt once: its KV cache is then reused by the first turn."""
        messages = [
            {"role": "system", "content": self.settings.system_prompt},
            {"role": "user", "content": "Hi"},
        ]
        self.complete(messages, max_tokens=1)

    def complete(self, messages: list[Message], max_tokens: int | None = None) -> str:
        return "".join(self.stream(messages, max_tokens))
