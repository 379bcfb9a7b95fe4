"""Conversation on an OpenAI-compatible engine elsewhere on the network (llama.cpp's
llama-server, Ollama, vLLM, LocalAI …), streamed through its chat-completions API with
the official `openai` client.

It offers what the local engine (llm.py) offers the handler — `stream(messages, …)`
yielding the reply's text pieces — but as an async iterator on the event loop, so
leaving the iteration (a cancelled turn, a client gone) closes the HTTP stream at once
and the engine stops generating.

Every wait is bounded by `timeout`: connecting, the first piece of the reply and each
gap between pieces. A failure ends the turn with a RemoteLlmError whose text says what
went wrong and where; `started` tells whether any of the reply had come (only a turn
that had not started can be answered by the local fallback instead).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .. import realtime
from .llm import LlmSettings, Message

if TYPE_CHECKING:
    from openai import AsyncOpenAI, AsyncStream
    from openai.types.chat import ChatCompletionChunk

_LOGGER = logging.getLogger(__name__)

FALLBACKS = ("none", "local")
# Connecting takes milliseconds on a LAN; a host that does not answer should not cost the
# whole timeout before the fallback can answer.
CONNECT_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 120.0
TEMPLATE_TOKENS = 8  # a chat template's markers around one message, generously


@dataclass(frozen=True)
class RemoteLlmSettings:
    url: str  # the API base, e.g. http://192.168.1.20:8080/v1
    api_key: str | None = None
    model: str | None = None  # None: the first model the engine lists
    timeout: float = 15.0  # connect, first piece, and each gap between pieces
    fallback: str = "none"  # "local": the local model answers while the remote cannot


class RemoteLlmError(Exception):
    """A turn the remote engine did not answer; the text says why, for the error event."""

    def __init__(self, text: str, started: bool) -> None:
        super().__init__(text)
        self.started = started  # some of the reply had already come


@dataclass(frozen=True)
class Probe:
    """What a short request found out about the engine (for start-up and `doctor`)."""

    models: list[str]
    model: str
    first_piece_s: float  # time to the first piece of a one-token reply
    seconds: float  # the whole probe


class RemoteChat:
    """One OpenAI-compatible endpoint. Calls need the event loop the server runs on."""

    def __init__(self, settings: RemoteLlmSettings, llm: LlmSettings) -> None:
        from openai import AsyncOpenAI, Timeout

        self.settings = settings
        self.llm = llm
        self.url = settings.url.rstrip("/")
        self.client: AsyncOpenAI = AsyncOpenAI(
            base_url=self.url,
            # Local engines take any key (llama-server and Ollama ignore it when unset).
            api_key=settings.api_key or "none",
            max_retries=0,  # a retry would double the wait; the next turn tries again
            timeout=Timeout(settings.timeout, connect=min(settings.timeout, CONNECT_TIMEOUT_S)),
        )
        self._model = settings.model
        # The HTTP library logs every request at INFO: one line per turn in the server's log.
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)

    @property
    def name(self) -> str:
        return self._model or "(the first model the engine lists)"

    @property
    def context_size(self) -> int:
        """The engine's context window as configured here (--llm-context): the API does not
        say it the same way on every engine."""
        return self.llm.context

    def count_tokens(self, messages: list[Message]) -> int:
        """An upper bound of the prompt's tokens, without the engine's tokenizer: a byte-level
        or byte-fallback tokenizer spends at most one token per UTF-8 byte, plus a few for
        each message's template markers. It overcounts English about fourfold, so a history
        fitted with it is trimmed early rather than overflowing the engine's context."""
        return sum(len(m["content"].encode("utf-8")) + TEMPLATE_TOKENS for m in messages) + 2

    async def models(self) -> list[str]:
        """The model ids the engine lists (GET /models)."""
        try:
            page = await self.client.models.list()
            return [model.id for model in page.data]
        except Exception as err:
            raise self._error(err, started=False, doing="listing its models") from err

    async def model(self) -> str:
        """The model to ask for: the configured one, or the first listed (looked up once)."""
        if self._model is None:
            listed = await self.models()
            if not listed:
                raise RemoteLlmError(f"remote LLM at {self.url} lists no model", started=False)
            self._model = listed[0]
            _LOGGER.info("Remote LLM at %s: using its model %r", self.url, self._model)
        return self._model

    async def stream(
        self,
        messages: list[Message],
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        pause: Callable[[], None] | None = None,
        *,
        timeout: float | None = None,
    ) -> AsyncGenerator[str, None]:
        """Yield the reply's text pieces as the engine streams them.

        `cancel` and `pause` are there for the local engine's signature: leaving this
        iteration is what cancels here, and the remote's compute does not compete with
        Piper for the Pi's cores, so there is nothing to pause for. `timeout` overrides
        the configured one (the warm-up probe waits longer).
        """
        wait_s = timeout or self.settings.timeout
        started = finished = False
        try:
            async with realtime.timeout(wait_s):
                # The union's other half is the non-streaming reply, never asked for here.
                stream = cast(
                    "AsyncStream[ChatCompletionChunk]",
                    await self.client.chat.completions.create(
                        model=await self.model(),
                        messages=messages,  # type: ignore[arg-type]
                        max_tokens=max_tokens or self.llm.max_tokens,
                        temperature=self.llm.temperature,
                        stream=True,
                    ),
                )
            # Leaving this block (the end, an error, a cancelled turn) closes the response,
            # and with it the connection the engine is writing to.
            async with stream:
                chunks = aiter(stream)
                while True:  # to the stream's end: the connection is then reused
                    # Only the engine's wait is timed, never the consumer's between pieces.
                    async with realtime.timeout(wait_s):
                        try:
                            chunk = await anext(chunks)
                        except StopAsyncIteration:
                            break
                    piece, done = _read_chunk(chunk)
                    finished = finished or done
                    if piece:
                        started = True
                        yield piece
        except RemoteLlmError:
            raise
        except Exception as err:
            raise self._error(err, started, timeout=wait_s) from err
        if not finished:
            # A body that ends without a finish reason was cut short, or was never a
            # chat-completions stream (a web page, another API).
            raise RemoteLlmError(
                f"remote LLM at {self.url}: the reply stream ended without finishing"
                + ("" if started else " (is this an OpenAI-compatible /v1 URL?)"),
                started,
            )

    async def probe(self) -> Probe:
        """List the models, then time a one-token reply (it also warms the engine's cache
        for the system prompt). It waits up to PROBE_TIMEOUT_S for the reply: an engine's
        first request may load the model (Ollama does) or run cold."""
        start = time.monotonic()
        models = await self.models()
        if self._model is None and models:
            self._model = models[0]
        messages: list[Message] = [
            {"role": "system", "content": self.llm.system_prompt},
            {"role": "user", "content": "Hi"},
        ]
        asked = time.monotonic()
        first: float | None = None
        timeout = max(self.settings.timeout, PROBE_TIMEOUT_S)
        async for _piece in self.stream(messages, max_tokens=1, timeout=timeout):
            first = first or time.monotonic() - asked
        end = time.monotonic()
        return Probe(models, await self.model(), first or end - asked, end - start)

    def _error(
        self, err: BaseException, started: bool, doing: str = "", timeout: float | None = None
    ) -> RemoteLlmError:
        """A clear sentence for what went wrong with the engine."""
        from openai import APIConnectionError, APIStatusError, APITimeoutError

        where = f"remote LLM at {self.url}"
        when = "mid-reply" if started else (doing or "before the first word of the reply")
        if isinstance(err, (TimeoutError, asyncio.TimeoutError, APITimeoutError)):
            text = f"{where} sent nothing for {timeout or self.settings.timeout:g} s ({when})"
        elif isinstance(err, APIStatusError):
            text = f"{where} answered HTTP {err.status_code} ({when}): {_short(err.message)}"
            if err.status_code == 404:
                text += " (most engines' API base ends in /v1; is the model name right?)"
        elif isinstance(err, APIConnectionError):
            cause = _root_cause(err)
            reason = _short(str(cause)) or type(cause).__name__
            if started:
                text = f"{where}: connection lost mid-reply ({reason})"
            else:
                text = f"{where} is unreachable ({reason})"
        elif isinstance(err, (ValueError, AttributeError, TypeError, IndexError, KeyError)):
            what = "something that is not a chat completion"
            text = f"{where} sent {what} ({when}): {_short(str(err))}"
        else:
            text = f"{where} failed ({when}): {type(err).__name__}: {_short(str(err))}"
        return RemoteLlmError(text, started)


def _read_chunk(chunk: Any) -> tuple[str, bool]:
    """(text piece, finished) of one chat.completion.chunk; raises on anything else."""
    if getattr(chunk, "object", "chat.completion.chunk") not in (None, "chat.completion.chunk"):
        raise ValueError(f"a {chunk.object!r} where a chat.completion.chunk belongs")
    choices = chunk.choices
    if not choices:
        return "", False  # e.g. a usage-only chunk
    choice = choices[0]
    delta = choice.delta
    content = getattr(delta, "content", None) if delta is not None else None
    if content is not None and not isinstance(content, str):
        raise TypeError(f"delta content is a {type(content).__name__}, not text")
    return content or "", choice.finish_reason is not None


def _root_cause(err: BaseException) -> BaseException:
    """The innermost error under the client's wrappers (e.g. the OSError 'Connection refused')."""
    seen = {id(err)}
    while (inner := err.__cause__ or err.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        err = inner
    return err


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
