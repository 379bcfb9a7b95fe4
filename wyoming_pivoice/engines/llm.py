"""Conversation with llama.cpp (llama-cpp-python) on a GGUF model, streamed token by token."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..catalogue import SYSTEM_PROMPTS, names
from ..models import ModelStore, llm_name, resolve_llm
from ..options import Addon, opt
from .protocols import EngineDescription, Message, TokenCounter

_LOGGER = logging.getLogger(__name__)

# conversation.py's older name for what it fits a prompt with (engines/protocols.py).
ChatEngine = TokenCounter


@dataclass(frozen=True)
class LlmSettings:
    model: str = opt(
        "embedded",
        "--llm-model",
        help="'embedded' (SmolLM2-135M-Instruct Q4_1), a path to a .gguf file, a catalogue "
        f"name ({', '.join(names('llm'))}) or owner/repo:file.gguf on Hugging Face, "
        "downloaded once",
        addon=Addon("str"),
    )
    threads: int = opt(
        0,
        "--llm-threads",
        help="at most this many threads (0: all cores); each reply uses only the cores other "
        "work leaves free, at least 1",
        addon=Addon("int(0,64)?"),
    )
    context: int = opt(2048, "--llm-context", addon=Addon("int(256,131072)"))
    max_tokens: int = opt(256, "--max-tokens", help="cap on one reply", addon=Addon("int(8,4096)"))
    temperature: float = opt(
        0.2,
        "--llm-temperature",
        help="sampling temperature (here or at --llm-url); 0: greedy, the same prompt always "
        "gets the same reply",
    )
    system_prompt: str = opt(
        SYSTEM_PROMPTS["en"],
        "--system-prompt",
        help="default: a short-answers prompt in --language",
        cli_default=None,  # not given: the prompt in --language (server/cli.py)
        addon=Addon("str"),
    )
    engine: str = "llama.cpp"  # its name in engines/registry.py
    store: ModelStore = field(default_factory=ModelStore)  # where named models download to
    adapt_threads: bool = True  # False: always `threads` (the bench's baseline)
    languages: tuple[str, ...] = opt(  # what it is asked to answer in
        ("en",),
        "--llm-language",
        append=True,
        cli_default=None,  # not given: the server's --language (server/cli.py)
        help="language the model answers in (repeatable; default: --language, en)",
    )


# llama.cpp's threads wait for each other at a spinning barrier in every token: one of them
# preempted by other work stalls them all. On this 2-core machine at load 13-18 (busy
# processes at the model's nice), SmolLM2 wrote 48 tokens in 30-250 s on 2 threads and in
# 0.9-2.7 s on 1 (Whisper and Piper, whose threads sleep, lost little with 2). So a reply
# starts on the cores no other runnable task wants and gives threads up, never takes them
# back, every RETHREAD_TOKENS while it decodes.
RETHREAD_TOKENS = 8
LOADAVG = Path("/proc/loadavg")


def free_threads(
    limit: int, running: int | None, ours: int, average: float | None = None, own: int = 0
) -> int:
    """How many threads a reply may use: `limit` at most, what other work leaves of the
    cores, at least 1. Other work is the `running` tasks the kernel counts now (None:
    unknown) besides `ours` (this process's own decoding threads among them), or the
    1-minute load `average` less `own` (our decoding's share of it), whichever is more: the
    count alone is one instant (a reply whose prompt was evaluated on 2 threads at load 20
    waited 29 s for its first token)."""
    if running is None:
        return limit
    others = float(max(0, running - ours))
    if average is not None:
        others = max(others, average - own)
    return max(1, min(limit, (os.cpu_count() or 1) - int(others + 0.5)))


def running_tasks() -> tuple[int, float] | tuple[None, None]:
    """The kernel's count of runnable tasks now and the 1-minute load average
    (/proc/loadavg: `avg1 avg5 avg15 running/all lastpid`)."""
    try:
        fields = LOADAVG.read_text().split()
        return int(fields[3].split("/")[0]), float(fields[0])
    except (OSError, ValueError, IndexError):
        return None, None


# ChatML, for a GGUF without a chat template of its own.
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Inserted after the first character of a control token's text found in user text, so the
# tokenizer reads it as plain text (it matches control tokens only as exact strings).
_BREAK = "\u2060"  # WORD JOINER: invisible, and no model reads meaning into it


class LlamaChat:
    """Loads one GGUF model; `stream` is blocking and must run in a worker thread.

    The prompt is built here with the GGUF's own chat template (as llama-cpp-python's chat
    completion does), after escaping every control token's text in the messages: typed
    `<|im_start|>` must stay text, not become a turn boundary. llama.cpp keeps the KV cache
    of the previous prompt and re-evaluates only what differs, so a fixed system prompt is
    not recomputed every turn.
    """

    def __init__(self, settings: LlmSettings) -> None:
        from llama_cpp import Llama, llama_chat_format

        self.settings = settings
        self.model_path = resolve_llm(settings.model, settings.store)
        self.max_threads = settings.threads or os.cpu_count() or 1
        self.llama = Llama(
            model_path=str(self.model_path),
            n_ctx=settings.context,
            n_threads=self.max_threads,
            # Not left to llama-cpp-python's default (every core): the prompt's evaluation on
            # 2 threads at load 16 made `--llm-threads 1` wait 20 s for its first token.
            n_threads_batch=self.max_threads,
            verbose=False,
        )
        self.threads = self.max_threads  # what the context decodes with now
        model = self.llama._model
        eos, bos = self.llama.token_eos(), self.llama.token_bos()
        self._formatter = llama_chat_format.Jinja2ChatFormatter(
            template=self.llama.metadata.get("tokenizer.chat_template") or _CHATML,
            eos_token=model.token_get_text(eos) if eos != -1 else "",
            bos_token=model.token_get_text(bos) if bos != -1 else "",
        )
        self.control_tokens = _control_tokens(self.llama)
        self._control = (
            re.compile("|".join(re.escape(t) for t in sorted(self.control_tokens, key=len)[::-1]))
            if self.control_tokens
            else None
        )

    @property
    def name(self) -> str:
        return self.model_path.stem

    @classmethod
    def describe(cls, settings: LlmSettings) -> EngineDescription:
        name = llm_name(settings.model)
        return EngineDescription(
            kind="chat",
            engine="llama.cpp",
            model=name,
            languages=settings.languages,
            attribution="llama.cpp",
            url="https://github.com/ggml-org/llama.cpp",
            description=f"GGUF {name}",
            program="pivoice-llama",
        )

    @property
    def context_size(self) -> int:
        return int(self.llama.n_ctx())

    def escape(self, text: str) -> str:
        """`text` with every control token's text broken so it tokenizes as plain text."""
        if self._control is None:
            return text
        return self._control.sub(lambda m: m.group(0)[0] + _BREAK + m.group(0)[1:], text)

    def prompt_tokens(self, messages: list[Message]) -> list[int]:
        """The token ids of the prompt for `messages` (contents escaped, template applied)."""
        safe = [{**m, "content": self.escape(m["content"])} for m in messages]
        result = self._formatter(messages=safe)  # type: ignore[arg-type]
        return self.llama.tokenize(
            result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True
        )

    def count_tokens(self, messages: list[Message]) -> int:
        return len(self.prompt_tokens(messages))

    def stream(
        self,
        messages: list[Message],
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        pause: Callable[[], None] | None = None,
    ) -> Iterator[str]:
        """Yield the reply's text pieces as llama.cpp produces them.

        `pause` runs before each next token (audio first: see engines/priority.py). The reply
        is cut to what the context has room for after the prompt.
        """
        tokens = self.prompt_tokens(messages)
        # The worker thread asking is the one running task of ours now; of the load average,
        # up to max_threads is our own earlier decoding.
        running, average = running_tasks() if self.settings.adapt_threads else (None, None)
        self._set_threads(free_threads(self.max_threads, running, 1, average, self.max_threads))
        room = self.context_size - len(tokens)
        if room < 1:
            raise ValueError(f"prompt of {len(tokens)} tokens leaves no room in the context")
        chunks = self.llama.create_completion(
            prompt=tokens,
            max_tokens=min(max_tokens or self.settings.max_tokens, room),
            temperature=self.settings.temperature,
            repeat_penalty=1.1,  # what llama-cpp-python's chat completion uses
            stop=[self._formatter.eos_token] if self._formatter.eos_token else [],
            stream=True,
        )
        try:
            for count, chunk in enumerate(chunks, 1):
                if cancel is not None and cancel.is_set():
                    return
                piece = chunk["choices"][0]["text"]  # type: ignore[index]
                if piece:
                    yield piece
                if pause is not None:
                    pause()
                adapt = self.settings.adapt_threads and self.threads > 1
                if adapt and count % RETHREAD_TOKENS == 0:
                    # Between tokens our own workers may still be polling: count them ours.
                    fewer = free_threads(self.threads, running_tasks()[0], self.threads)
                    if fewer < self.threads:
                        self._set_threads(fewer)
        finally:
            chunks.close()  # type: ignore[union-attr]

    def _set_threads(self, threads: int) -> None:
        if threads == self.threads:
            return
        import llama_cpp

        llama_cpp.llama_set_n_threads(self.llama._ctx.ctx, threads, threads)
        _LOGGER.debug("llama.cpp decodes on %d of %d threads", threads, self.max_threads)
        self.threads = threads

    def warm_up(self) -> None:
        """Evaluate the system prompt once: its KV cache is then reused by the first turn."""
        messages = [
            {"role": "system", "content": self.settings.system_prompt},
            {"role": "user", "content": "Hi"},
        ]
        self.complete(messages, max_tokens=1)

    def complete(self, messages: list[Message], max_tokens: int | None = None) -> str:
        return "".join(self.stream(messages, max_tokens))


def _control_tokens(llama: Any) -> set[str]:
    """The text of every control token in the model's vocabulary (`<|im_start|>` …)."""
    import llama_cpp

    model = llama._model
    texts = set()
    for token in range(llama.n_vocab()):
        if model.token_get_attr(token) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
            text = model.token_get_text(token)
            if len(text) > 1:
                texts.add(text)
    return texts
