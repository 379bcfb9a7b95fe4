"""Chat history per conversation, bounded in conversations and turns, and prompts that fit.

A conversation is keyed by the client's address *and* its `conversation_id`: a client at
another address cannot read or extend it, whatever id it sends. An id shorter than
`MIN_ID_CHARS` is guessable (Home Assistant sends 26-character ULIDs, our satellite a
random 30-character id) and gets no memory: each such turn stands alone.

No address can exhaust another's memory (issue #22: 64 ids from any 4 addresses wiped every
other client's): one address holds at most `max_per_host` conversations and pushes out only
its own oldest; at most `max_hosts` addresses have memory at once, and a new one past that
gets none (its turns stand alone, with a log line) until an address has been idle for
`ttl_seconds`, never by forgetting anyone. The whole store is bounded by both. What is
stored has control-token spellings escaped (engines/control.py), so an engine's own
markers in a reply, or typed ones, go back into later prompts as text.

The prompt of a turn is fitted to the model's context in the model's own tokens
(`ChatEngine.count_tokens`, `context_size`), leaving room for the reply: the oldest history
goes first, then the start of the user's text (the end, where a question usually is, is
kept), with a note in the log. No input under the limits makes a later turn fail.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

from .engines import control
from .engines.llm import ChatEngine, Message

_LOGGER = logging.getLogger(__name__)

MIN_ID_CHARS = 16
# Tokens kept free beyond the reply cap: llama.cpp's decode fails when the context is
# filled to the last cell.
CONTEXT_MARGIN = 8

Exchange = tuple[str, str]  # (user, assistant)


@dataclass
class _History:
    turns: list[Exchange] = field(default_factory=list)
    touched: float = field(default_factory=time.monotonic)
    last_turn_id: str | None = None  # the client's id for the newest exchange, if it gave one


class Notes(Protocol):
    """Local knowledge (server/knowledge.py): the system prompt with the household's notes
    for this turn, fitted so the whole prompt stays within `budget` tokens."""

    def notes_prompt(
        self,
        engine: ChatEngine,
        system_prompt: str,
        history: list[Exchange],
        user_text: str,
        budget: int,
    ) -> str: ...


@dataclass(frozen=True)
class Fitted:
    """A turn's prompt fitted to the context, and how many of the newest exchanges it kept."""

    messages: list[Message]
    kept: int


class PromptTooLong(ValueError):
    """Even the system prompt and one word of the turn do not fit the context."""


class ConversationStore:
    """Keeps at most the last `max_turns` exchanges (at least half of them once there were
    that many: the oldest half goes in one step) of at most `max_per_host` conversations for
    each of at most `max_hosts` client addresses (and `max_conversations` in all: past it
    the address with the most gives up its least recent one).

    Home Assistant keeps a satellite's conversation_id for five minutes; we
    forget a conversation after `ttl_seconds` idle so memory stays bounded.
    """

    def __init__(
        self,
        system_prompt: str,
        max_turns: int = 6,
        max_conversations: int = 512,
        ttl_seconds: float = 300.0,
        max_per_host: int = 16,
        max_hosts: int = 32,
    ) -> None:
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.max_conversations = max_conversations
        self.max_per_host = max_per_host
        self.max_hosts = max_hosts
        self.ttl_seconds = ttl_seconds
        self._histories: OrderedDict[Hashable, _History] = OrderedDict()
        self.notes: Notes | None = None  # --knowledge: set by the server (server/app.py)

    @staticmethod
    def key(host: str, conversation_id: str | None) -> Hashable | None:
        """Where a client's conversation lives; None: no memory for this turn."""
        if not conversation_id or len(conversation_id) < MIN_ID_CHARS:
            return None
        return (host, conversation_id)

    def earlier(self, key: Hashable | None, turn_id: str | None = None) -> list[Exchange]:
        """The exchanges before a new turn: all kept ones, except a newest one that this
        turn replaces (same `turn_id`: a satellite's speculative run that speech made void)."""
        history = self._get(key)
        if history is None:
            return []
        if turn_id is not None and turn_id == history.last_turn_id:
            return history.turns[:-1]
        return list(history.turns)

    def messages(
        self, key: Hashable | None, user_text: str, turn_id: str | None = None
    ) -> list[Message]:
        """The whole prompt for a new user turn, not fitted to any context."""
        return build(self.system_prompt, self.earlier(key, turn_id), user_text)

    def prompt(
        self, engine: ChatEngine, earlier: list[Exchange], user_text: str, reply_tokens: int
    ) -> list[Message]:
        """The prompt for a turn, fitted so it and a `reply_tokens` reply fit the context."""
        return self.fit(engine, earlier, user_text, reply_tokens).messages

    def fit(
        self, engine: ChatEngine, earlier: list[Exchange], user_text: str, reply_tokens: int
    ) -> Fitted:
        """The prompt for a turn, fitted so it and a `reply_tokens` reply fit the context, and
        how many of the `earlier` exchanges (the newest) it kept: `record` is told, so the
        next turn's prompt starts as this one did.

        Once the oldest history must go, it goes until the prompt fills at most half the room
        (as `record` drops half past `max_turns`). Left out one exchange a turn, every
        prompt's start changed, and llama.cpp (which re-uses its cache for an unchanged
        start) read the whole history again on every turn. Runs where the engine is loaded
        (its worker thread): counting uses its tokenizer.
        """
        budget = engine.context_size - reply_tokens - CONTEXT_MARGIN
        history = list(earlier)
        system = self.system_prompt
        if self.notes is not None:  # the notes come after the system prompt, trimmed first
            system = self.notes.notes_prompt(engine, system, history, user_text, budget)
        limit = budget
        while True:
            messages = build(system, history, user_text)
            tokens = engine.count_tokens(messages)
            if tokens <= limit:
                return Fitted(messages, len(history))
            if not history:
                if tokens <= budget:  # history all gone: the turn itself need only fit
                    return Fitted(messages, 0)
                break
            history.pop(0)
            limit = budget // 2
            _LOGGER.info("Prompt over %d tokens: left out the oldest exchange", budget)

        # The turn alone is too long: keep the longest end of it that fits.
        def fits(start: int) -> bool:
            return engine.count_tokens(build(system, [], user_text[start:])) <= budget

        if not fits(len(user_text) - 1):
            raise PromptTooLong(
                f"the system prompt leaves no room in a {engine.context_size}-token context"
            )
        low, high = 0, len(user_text) - 1  # fits(high) holds, fits(low) does not
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                high = middle
            else:
                low = middle
        _LOGGER.info(
            "Turn over %d tokens: kept its last %d of %d characters",
            budget,
            len(user_text) - high,
            len(user_text),
        )
        return Fitted(build(system, [], user_text[high:]), 0)

    def record(
        self,
        key: Hashable | None,
        user_text: str,
        reply: str,
        turn_id: str | None = None,
        kept: int | None = None,
    ) -> None:
        """Add an exchange. `kept`: how many of the earlier exchanges the turn's prompt held
        (`fit`); the older ones are forgotten, so the next prompt starts the same way."""
        if key is None:
            return  # no memory: each turn stands alone
        self._expire()
        host = _host(key)
        hosts = {_host(k) for k in self._histories}
        if host not in hosts and len(hosts) >= self.max_hosts:
            _LOGGER.info(
                "Conversation memory holds %d addresses: this one's turns stand alone until "
                "one has been idle %.0f s",
                len(hosts),
                self.ttl_seconds,
            )
            return
        history = self._get(key) or _History()
        earlier = self.earlier(key, turn_id)
        if kept is not None and kept < len(earlier):
            earlier = earlier[len(earlier) - kept :]
        exchange = (control.escape(user_text), control.escape(reply))
        turns = [*earlier, exchange]
        if len(turns) > self.max_turns:
            # Past the cap the oldest half goes at once, not one exchange a turn: llama.cpp
            # reuses its cache only for a prompt's unchanged start, so dropping the oldest
            # each turn made it evaluate the whole history again on every turn (SmolLM2's
            # first token 13-19 s against 0.1-2.8 s once the history was full, bench --room
            # at load 4.5-4.8).
            turns = turns[-max(1, self.max_turns - self.max_turns // 2) :]
        history.turns = turns
        history.last_turn_id = turn_id
        history.touched = time.monotonic()
        self._histories[key] = history
        self._histories.move_to_end(key)
        mine = [k for k in self._histories if _host(k) == host]
        for old in mine[: max(0, len(mine) - self.max_per_host)]:
            del self._histories[old]  # this client's own oldest, never anyone else's
        while len(self._histories) > self.max_conversations:
            # The address holding the most gives up its least recent: never a smaller one.
            counts = Counter(_host(k) for k in self._histories)
            most = max(counts.values())
            del self._histories[next(k for k in self._histories if counts[_host(k)] == most)]

    def heard_only(self, key: Hashable | None, heard: str) -> None:
        """The newest reply was cut by a barge-in after `heard`: keep only that (with a mark
        that it broke off), so the model neither repeats nor builds on what was never said."""
        history = self._get(key)
        if history is None or not history.turns:
            return
        user, reply = history.turns[-1]
        kept = control.escape(heard.strip())
        if len(kept) < len(reply):  # never longer than what was said
            history.turns[-1] = (user, f"{kept} …" if kept else "…")

    def _expire(self) -> None:
        now = time.monotonic()
        for old in [k for k, h in self._histories.items() if now - h.touched > self.ttl_seconds]:
            del self._histories[old]

    def _get(self, key: Hashable | None) -> _History | None:
        if key is None:
            return None
        history = self._histories.get(key)
        if history is not None and time.monotonic() - history.touched > self.ttl_seconds:
            del self._histories[key]
            return None
        return history

    def __len__(self) -> int:
        return len(self._histories)


def build(system_prompt: str, history: list[Exchange], user_text: str) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": system_prompt}]
    for user, assistant in history:
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": assistant})
    messages.append({"role": "user", "content": user_text})
    return messages


def _host(key: Hashable) -> object:
    return key[0] if isinstance(key, tuple) else None
