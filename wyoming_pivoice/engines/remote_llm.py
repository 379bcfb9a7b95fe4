"""Conversation on an OpenAI-compatible engine elsewhere on the network (llama.cpp's
llama-server, Ollama, vLLM, LocalAI …), streamed through its chat-completions API with
the official `openai` client.

It offers what the local engine (llm.py) offers the handler — `stream(messages, …)`
yielding the reply's text pieces — but as an async iterator on the event loop, so
leaving the iteration (a cancelled turn, a client gone) closes the HTTP stream at once
and the engine stops generating.

Bounded like the local engine (issue #22: a never-ending stream ran past 60 s, 64 KiB
deltas streamed 367 MB into the server, one 50 MiB delta reached Home Assistant):
- `--max-tokens` is counted here, a piece a token, and the reply's text is capped at
  TOKEN_BYTES per token: past either the reply ends, as the local one does;
- the HTTP body is bounded before it is parsed (BoundedTransport): MAX_LINE_BYTES per
  line (one server-sent event: a piece in its JSON), MAX_RESPONSE_BYTES per answer;
- waits: connecting, the first piece and progress (a piece with text: empty deltas, what
  reasoning models send while they "think", are not progress) each within `timeout`, the
  whole reply within `turn_timeout` (past it a started reply ends, as at the token cap);
- `/models` is read bounded (MAX_MODELS_BYTES) and parsed off the event loop: a 43 MB
  list once held `describe` up for 35 s.
Message contents go out with every control-token spelling escaped (control.py), whatever
the engine's template. A failure ends the turn with a RemoteLlmError whose text says what
went wrong and where; `started` tells whether any of the reply had come (only a turn that
had not started can be retried or answered by the local fallback instead).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httpx2

from .. import realtime
from ..options import Addon, opt
from . import control
from .llm import LlmSettings, Message
from .protocols import EngineUnavailable

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
CONTEXT_MARGIN = 8  # as conversation.py leaves
TOKEN_BYTES = 16  # the most text one reply token may take (the reply's byte cap)
MAX_DELTA_BYTES = 8 * 1024  # one piece's text: a token is a few bytes
MAX_LINE_BYTES = 32 * 1024  # one line of a body (an event: a piece in its JSON envelope)
MAX_RESPONSE_BYTES = 8 * 1024 * 1024  # one HTTP answer (a stream of empty deltas too)
MAX_MODELS_BYTES = 1024 * 1024  # a list of a thousand models is ~100 KB
# Without the engine's tokenizer, tokens are estimated by kind of character, from SmolLM2's
# tokenizer (docs/hardening.md: English 4.6 bytes a token, German 2.9, French 2.8, emoji
# 2.1, Chinese 1.7, digits 1.0): a digit or an ASCII sign is a token, other ASCII (letters,
# spaces) ASCII_PER_TOKEN characters, anything else UTF8_PER_TOKEN bytes; times
# ESTIMATE_MARGIN. It overcounts English about 1.9 times and undercounts nothing measured.
ASCII_PER_TOKEN = 2.7
UTF8_PER_TOKEN = 1.6
ESTIMATE_MARGIN = 1.1
BYTES_PER_TOKEN = 2.5  # until the engine's tokenizer has measured its own ratio
# What a tokenizer-measured ratio is divided by before it is trusted for a new text (the
# exact count then checks the prompt before it is sent, `fit`).
RATIO_MARGIN = 1.15
# Engines that end a running stream when a new request arrives (llama-cpp-python's server
# by default) take one turn at a time; those that queue or batch (llama-server's slots,
# Ollama, vLLM) may take several.
QUEUEING_CONCURRENCY = 4


@dataclass(frozen=True)
class RemoteLlmSettings:
    url: str = opt(  # the API base; required: server/cli.py builds these only with it
        flag="--llm-url",
        help="API base of the engine, e.g. http://192.168.1.20:8080/v1; the conversation runs "
        "there (ASR and TTS stay here)",
        addon=Addon("url?"),
    )
    api_key: str | None = opt(  # the add-on passes it by environment, not on the command line
        None,
        "--llm-api-key",
        help="its API key, if it wants one; else $PIVOICE_LLM_API_KEY (which keeps the key "
        "out of the process list)",
    )
    model: str | None = opt(  # None: the first model the engine lists
        None,
        "--llm-remote-model",
        help="model to ask for; default: the first it lists",
        addon=Addon("str?"),
    )
    timeout: float = opt(  # connect, first piece, and progress between pieces
        15.0,
        "--llm-timeout",
        help="seconds to connect, to the first piece of a reply, and between pieces with text",
    )
    fallback: str = opt(  # "local": the local model answers while the remote cannot
        "none",
        "--llm-fallback",
        choices=FALLBACKS,
        help="local: the local model (--llm-model) answers while the engine cannot",
        addon=Addon(f"list({'|'.join(FALLBACKS)})?"),
    )
    turn_timeout: float = opt(  # a whole reply, from asking to its last piece
        120.0,
        "--llm-turn-timeout",
        help="seconds for a whole reply (a started one ends there, as at --max-tokens)",
        addon=Addon("float(1,3600)?"),
    )
    concurrency: int = opt(  # turns at once on the engine; 0: from what the engine is
        0,
        "--llm-concurrency",
        help="turns sent to the engine at once; 0: from the engine (1 for llama-cpp-python's "
        "server, which ends a running reply when a new request comes; llama-server's slots)",
        addon=Addon("int(0,64)?"),
    )


class RemoteLlmError(EngineUnavailable):
    """A turn the remote engine did not answer; the text says why, for the error event."""

    def __init__(
        self, text: str, started: bool, cut: bool = False, status: int | None = None
    ) -> None:
        super().__init__(text)
        self.started = started  # some of the reply had already come
        self.cut = cut  # the stream broke off (not a timeout or an error status): retry
        self.status = status  # the HTTP status the engine answered, if that was the fault


class TooLarge(Exception):
    """A body, a line of it or a piece over its byte limit."""


class BoundedTransport(httpx2.AsyncBaseTransport):
    """httpx's transport with each response body bounded while it is read, before the
    openai client parses it: a line of an event stream (one event) over MAX_LINE_BYTES or
    a body over MAX_RESPONSE_BYTES raises TooLarge, which closes the connection."""

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self.inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        # A line is an event in a stream; a JSON answer (a model list) is one long line.
        events = response.headers.get("content-type", "").startswith("text/event-stream")
        line_limit = MAX_LINE_BYTES if events else MAX_RESPONSE_BYTES
        stream = cast(httpx2.AsyncByteStream, response.stream)
        response.stream = _BoundedStream(stream, line_limit)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _BoundedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, line_limit: int) -> None:
        self.inner = inner
        self.line_limit = line_limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = line = 0
        async for chunk in self.inner:
            total += len(chunk)
            if total > MAX_RESPONSE_BYTES:
                raise TooLarge(f"an answer over {MAX_RESPONSE_BYTES} bytes")
            *ended, rest = chunk.split(b"\n")
            if ended:
                line += len(ended[0])
                longest = max([line, *(len(part) for part in ended[1:])])
                line = len(rest)
            else:
                longest = line = line + len(rest)
            if max(longest, line) > self.line_limit:
                raise TooLarge(f"a line over {self.line_limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass(frozen=True)
class Probe:
    """What a short request found out about the engine (for start-up and `doctor`)."""

    models: list[str]
    model: str
    first_piece_s: float  # time to the first piece of a one-token reply
    seconds: float  # the whole probe


class _Deadline(Exception):
    def __init__(self, total: bool) -> None:
        self.total = total


class RemoteChat:
    """One OpenAI-compatible endpoint. Calls need the event loop the server runs on."""

    def __init__(self, settings: RemoteLlmSettings, llm: LlmSettings) -> None:
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient, Timeout

        self.settings = settings
        self.llm = llm
        self.url = settings.url.rstrip("/")
        self.root = self.url.removesuffix("/v1")  # the engines' own endpoints live here
        self.timeout = Timeout(settings.timeout, connect=min(settings.timeout, CONNECT_TIMEOUT_S))
        self.http = DefaultAsyncHttpxClient(transport=BoundedTransport(), timeout=self.timeout)
        self.client: AsyncOpenAI = AsyncOpenAI(
            base_url=self.url,
            # Local engines take any key (llama-server and Ollama ignore it when unset).
            api_key=settings.api_key or "none",
            max_retries=0,  # a retry would double the wait; the slot retries a cut stream
            timeout=self.timeout,
            http_client=self.http,
        )
        self._model = settings.model
        self.kind = "unknown"  # what the model list says the engine is (see concurrency)
        # Tokenizer: None not yet asked, "" none offered, else the path to POST text to.
        self._tokenize: str | None = None
        self.bytes_per_token = BYTES_PER_TOKEN  # measured with the tokenizer when offered
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
        """The prompt's tokens, estimated from its UTF-8 bytes at `bytes_per_token` (the
        engine's tokenizer measures it where it offers one, `measure`; else a ratio that
        overcounts), plus each message's template markers."""
        texts = [control.escape(m["content"]) for m in messages]
        if self._tokenize:  # measured on this engine: its ratio
            tokens = sum(len(t.encode("utf-8")) for t in texts) / self.bytes_per_token
        else:
            tokens = sum(estimate_tokens(t) for t in texts)
        return math.ceil(tokens) + TEMPLATE_TOKENS * len(messages) + 2

    async def exact_tokens(self, messages: list[Message]) -> int | None:
        """The prompt's tokens by the engine's own tokenizer (its contents, plus each
        message's template markers), or None if it offers none. Measures the ratio the
        estimate uses from them."""
        text = "\n".join(control.escape(m["content"]) for m in messages)
        tokens = await self._count(text)
        if tokens is None:
            return None
        if tokens > 0:
            self.bytes_per_token = max(1.0, len(text.encode("utf-8")) / tokens / RATIO_MARGIN)
        return tokens + TEMPLATE_TOKENS * len(messages) + 2

    async def _count(self, text: str) -> int | None:
        """Tokens of `text` by llama.cpp's `/tokenize` or llama-cpp-python's
        `/extras/tokenize/count` (the first that answers is kept), else None."""
        if self._tokenize == "":
            return None
        paths = [self._tokenize] if self._tokenize else ["/tokenize", "/extras/tokenize/count"]
        answered = True  # every path answered (an error status): the engine has none
        for path in paths:
            body = {"content": text} if path == "/tokenize" else {"input": text}
            if self._model:
                body["model"] = self._model
            try:
                data = json.loads(await self._request("POST", self.root + path, body, 1 << 20))
                count = len(data["tokens"]) if path == "/tokenize" else int(data["count"])
            except RemoteLlmError as err:
                answered = answered and err.status is not None
                continue
            except (ValueError, KeyError, TypeError):
                continue
            if self._tokenize is None:
                _LOGGER.info("Remote LLM at %s: prompts counted by its %s", self.url, path)
            self._tokenize = path
            return count
        if self._tokenize is None and answered:  # (an engine down is asked again next time)
            _LOGGER.info("Remote LLM at %s offers no tokenizer: prompts are estimated", self.url)
            self._tokenize = ""
        return None

    async def _request(self, method: str, url: str, body: Any, limit: int) -> bytes:
        """One bounded request: the whole answer within `timeout`, at most `limit` bytes."""
        headers = {"Authorization": f"Bearer {self.settings.api_key or 'none'}"}
        received = bytearray()
        try:
            async with (
                realtime.timeout(self.settings.timeout),
                self.http.stream(method, url, json=body, headers=headers) as response,
            ):
                async for chunk in response.aiter_bytes():
                    received += chunk
                    if len(received) > limit:
                        raise TooLarge(f"an answer over {limit} bytes")
                if response.status_code >= 400:
                    raise RemoteLlmError(
                        f"remote LLM at {self.url} answered HTTP {response.status_code} "
                        f"to {method} {url}",
                        started=False,
                        status=response.status_code,
                    )
        except RemoteLlmError:
            raise
        except Exception as err:
            raise self._error(err, started=False, doing=f"{method} {url}") from err
        return bytes(received)

    async def models(self) -> list[str]:
        """The model ids the engine lists (GET /models), read bounded, parsed off the loop."""
        body = await self._request("GET", self.url + "/models", None, MAX_MODELS_BYTES)
        try:
            ids, self.kind = await asyncio.to_thread(_model_list, body)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise self._error(err, started=False, doing="listing its models") from err
        return ids

    async def model(self) -> str:
        """The model to ask for: the configured one, or the first listed (looked up once)."""
        if self._model is None:
            listed = await self.models()
            if not listed:
                raise RemoteLlmError(f"remote LLM at {self.url} lists no model", started=False)
            self._model = listed[0]
            _LOGGER.info("Remote LLM at %s: using its model %r", self.url, self._model)
        return self._model

    async def concurrency(self) -> int:
        """How many turns to send the engine at once: --llm-concurrency if set; else 1 for
        llama-cpp-python's server (it ends a running stream when a new request arrives,
        its default `--interrupt_requests`; its model list says `owned_by: "me"`), the
        slot count llama-server's `/props` gives, and QUEUEING_CONCURRENCY for the rest."""
        if self.settings.concurrency > 0:
            return self.settings.concurrency
        if self.kind == "llama-cpp-python":
            return 1
        if self.kind == "llama.cpp":
            try:
                props = json.loads(await self._request("GET", self.root + "/props", None, 1 << 20))
                return max(1, int(props.get("total_slots") or 1))
            except (RemoteLlmError, ValueError, TypeError, AttributeError):
                return 1
        return QUEUEING_CONCURRENCY if self.kind == "other" else 1

    async def stream(
        self,
        messages: list[Message],
        max_tokens: int | None = None,
        cancel: threading.Event | None = None,
        pause: Callable[[], None] | None = None,
        *,
        timeout: float | None = None,
    ) -> AsyncGenerator[str, None]:
        """Yield the reply's text pieces as the engine streams them, within the bounds above.

        `cancel` and `pause` are there for the local engine's signature: leaving this
        iteration is what cancels here, and the remote's compute does not compete with
        Piper for the Pi's cores, so there is nothing to pause for. `timeout` overrides
        the configured one (the warm-up probe waits longer).
        """
        wait_s = timeout or self.settings.timeout
        deadline = time.monotonic() + max(self.settings.turn_timeout, wait_s)
        cap = max_tokens or self.llm.max_tokens
        safe = [{**m, "content": control.escape(m["content"])} for m in messages]
        started = finished = False
        pieces = size = 0
        try:
            async with realtime.timeout(min(wait_s, deadline - time.monotonic())):
                safe = await self.fit(safe, cap)
            async with realtime.timeout(min(wait_s, deadline - time.monotonic())):
                # The union's other half is the non-streaming reply, never asked for here.
                stream = cast(
                    "AsyncStream[ChatCompletionChunk]",
                    await self.client.chat.completions.create(
                        model=await self.model(),
                        messages=safe,  # type: ignore[arg-type]
                        max_tokens=cap,
                        temperature=self.llm.temperature,
                        stream=True,
                    ),
                )
            # Leaving this block (the end, an error, a cap, a cancelled turn) closes the
            # response, and with it the connection the engine is writing to.
            async with stream:
                chunks = aiter(stream)
                progress = time.monotonic()
                while True:  # to the stream's end: the connection is then reused
                    total = deadline < progress + wait_s
                    wait = min(deadline, progress + wait_s) - time.monotonic()
                    # Only the engine's wait is timed, never the consumer's between pieces.
                    try:
                        if wait <= 0:
                            raise TimeoutError
                        async with realtime.timeout(wait):
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    except (TimeoutError, asyncio.TimeoutError):
                        raise _Deadline(total) from None
                    piece, done = _read_chunk(chunk)
                    finished = finished or done
                    if not piece:
                        continue
                    piece_bytes = len(piece.encode("utf-8"))
                    if piece_bytes > MAX_DELTA_BYTES:
                        raise TooLarge(f"a piece of {piece_bytes} bytes")
                    pieces += 1
                    size += piece_bytes
                    if pieces > cap or size > cap * TOKEN_BYTES:
                        _LOGGER.warning(
                            "Remote LLM at %s: reply cut at %d tokens (%d bytes), its cap",
                            self.url,
                            pieces - 1,
                            size - piece_bytes,
                        )
                        finished = True
                        break
                    started = True
                    yield piece
                    progress = time.monotonic()  # the consumer's time is not the engine's
        except _Deadline as late:
            if late.total and started:
                _LOGGER.warning(
                    "Remote LLM at %s: reply cut at its %g s deadline",
                    self.url,
                    self.settings.turn_timeout,
                )
                return
            raise self._late(late.total, started, wait_s) from None
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
                cut=True,
            )

    async def fit(self, messages: list[Message], reply_tokens: int) -> list[Message]:
        """`messages` (fitted by the estimate, conversation.py) checked with the engine's
        tokenizer where it offers one: still over the context, the oldest exchanges go,
        then the start of the user's text, each with a log line. Never a silent cut."""
        budget = self.context_size - reply_tokens - CONTEXT_MARGIN
        tokens = await self.exact_tokens(messages)
        while tokens is not None and tokens > budget and len(messages) > 2:
            messages = [messages[0], *messages[3:]]  # the oldest user + assistant pair
            _LOGGER.info(
                "Prompt of %d tokens over %d: left out the oldest exchange", tokens, budget
            )
            tokens = await self.exact_tokens(messages)
        if tokens is not None and tokens > budget:
            *head, last = messages
            text = last["content"]
            other = tokens - math.ceil(len(text.encode("utf-8")) / self.bytes_per_token)
            keep = max(1, int((budget - other) * self.bytes_per_token * 0.9))
            cut = text.encode("utf-8")[-keep:].decode("utf-8", errors="ignore")
            _LOGGER.info(
                "Turn of %d tokens over %d: kept its last %d of %d characters",
                tokens,
                budget,
                len(cut),
                len(text),
            )
            messages = [*head, {**last, "content": cut}]
        return messages

    def _late(self, total: bool, started: bool, wait_s: float) -> RemoteLlmError:
        where = f"remote LLM at {self.url}"
        if total:
            return RemoteLlmError(
                f"{where} did not answer within {self.settings.turn_timeout:g} s", started
            )
        when = "mid-reply" if started else "before the first word of the reply"
        return RemoteLlmError(f"{where} sent nothing for {wait_s:g} s ({when})", started)

    async def probe(self) -> Probe:
        """List the models, then time a one-token reply (it also warms the engine's cache
        for the system prompt). It waits up to PROBE_TIMEOUT_S for the reply: an engine's
        first request may load the model (Ollama does) or run cold."""
        start = time.monotonic()
        try:
            models = await self.models()
        except RemoteLlmError as err:
            if self._model is None:
                raise
            _LOGGER.warning("%s; asking for the configured model %r", err, self._model)
            models = []
        if self._model is None and models:
            self._model = models[0]
        messages: list[Message] = [
            {"role": "system", "content": self.llm.system_prompt},
            {"role": "user", "content": "Hi"},
        ]
        await self.exact_tokens(messages)  # finds the tokenizer, measures the ratio
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
        cut = False
        cause = _root_cause(err)
        if isinstance(cause, TooLarge):
            text = f"{where} sent {cause} ({when}): over our limit"
        elif isinstance(err, (TimeoutError, asyncio.TimeoutError, APITimeoutError)) or isinstance(
            cause, httpx2.TimeoutException
        ):
            text = f"{where} sent nothing for {timeout or self.settings.timeout:g} s ({when})"
        elif isinstance(err, APIStatusError):
            text = f"{where} answered HTTP {err.status_code} ({when}): {_short(err.message)}"
            if err.status_code == 404:
                text += " (most engines' API base ends in /v1; is the model name right?)"
        elif isinstance(err, (APIConnectionError, httpx2.TransportError)):
            reason = _short(str(cause)) or type(cause).__name__
            if started:
                text = f"{where}: connection lost mid-reply ({reason})"
            else:
                text = f"{where} is unreachable ({reason})"
            cut = isinstance(cause, (httpx2.RemoteProtocolError, httpx2.ReadError))
        elif isinstance(err, (ValueError, AttributeError, TypeError, IndexError, KeyError)):
            what = "something that is not a chat completion"
            text = f"{where} sent {what} ({when}): {_short(str(err))}"
        else:
            text = f"{where} failed ({when}): {type(err).__name__}: {_short(str(err))}"
        return RemoteLlmError(text, started, cut)


def estimate_tokens(text: str) -> float:
    """Tokens `text` takes on a tokenizer we cannot ask, by kind of character (above)."""
    signs = sum(1 for c in text if c.isascii() and not c.isalpha() and not c.isspace())
    other_ascii = sum(1 for c in text if c.isascii()) - signs
    wide = len(text.encode("utf-8")) - signs - other_ascii
    return (signs + other_ascii / ASCII_PER_TOKEN + wide / UTF8_PER_TOKEN) * ESTIMATE_MARGIN


def _model_list(body: bytes) -> tuple[list[str], str]:
    """The model ids in a `/models` answer, and what engine its entries say it is."""
    data = json.loads(body)["data"]
    ids = [str(model["id"]) for model in data]
    owners = {str(model.get("owned_by")) for model in data if isinstance(model, dict)}
    if "me" in owners:  # llama-cpp-python's server
        kind = "llama-cpp-python"
    elif "llamacpp" in owners:  # llama.cpp's llama-server
        kind = "llama.cpp"
    else:
        kind = "other"
    return ids, kind


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
