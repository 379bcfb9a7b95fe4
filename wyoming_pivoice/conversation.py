"""Chat history per conversation id, bounded in conversations and in turns."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from .engines.llm import Message


@dataclass
class _History:
    turns: list[tuple[str, str]] = field(default_factory=list)  # (user, assistant)
    touched: float = field(default_factory=time.monotonic)
    last_turn_id: str | None = None  # the client's id for the newest exchange, if it gave one


class ConversationStore:
    """Keeps the last `max_turns` exchanges of the `max_conversations` most recent ids.

    Home Assistant keeps a satellite's conversation_id for five minutes; we
    forget a conversation after `ttl_seconds` idle so memory stays bounded.
    """

    def __init__(
        self,
        system_prompt: str,
        max_turns: int = 6,
        max_conversations: int = 64,
        ttl_seconds: float = 300.0,
        max_history_chars: int = 3000,
    ) -> None:
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.max_conversations = max_conversations
        self.ttl_seconds = ttl_seconds
        # ~750 tokens: with a 4000-character turn and the reply cap it still fits a 2048 context,
        # so one long exchange cannot make every later turn of its conversation overflow.
        self.max_history_chars = max_history_chars
        self._histories: OrderedDict[str, _History] = OrderedDict()

    def messages(
        self, conversation_id: str | None, user_text: str, turn_id: str | None = None
    ) -> list[Message]:
        """The prompt for a new user turn: system prompt, kept history, the new text.

        A request with the `turn_id` of the newest exchange asks that exchange again (a
        satellite's speculative run was void and the whole utterance follows): the old
        exchange is left out here and replaced by `record`.
        """
        messages: list[Message] = [{"role": "system", "content": self.system_prompt}]
        history = self._get(conversation_id)
        if history is not None:
            kept: list[tuple[str, str]] = []
            budget = self.max_history_chars
            for user, assistant in reversed(self._earlier(history, turn_id)):  # newest first
                budget -= len(user) + len(assistant)
                if budget < 0:
                    break
                kept.append((user, assistant))
            for user, assistant in reversed(kept):
                messages.append({"role": "user", "content": user})
                messages.append({"role": "assistant", "content": assistant})
        messages.append({"role": "user", "content": user_text})
        return messages

    def record(
        self, conversation_id: str | None, user_text: str, reply: str, turn_id: str | None = None
    ) -> None:
        if not conversation_id:
            return  # no id, no memory: each turn stands alone
        history = self._get(conversation_id) or _History()
        history.turns = [*self._earlier(history, turn_id), (user_text, reply)]
        history.last_turn_id = turn_id
        del history.turns[: -self.max_turns]
        history.touched = time.monotonic()
        self._histories[conversation_id] = history
        self._histories.move_to_end(conversation_id)
        while len(self._histories) > self.max_conversations:
            self._histories.popitem(last=False)

    @staticmethod
    def _earlier(history: _History, turn_id: str | None) -> list[tuple[str, str]]:
        """The exchanges before this turn: all of them, or all but a superseded newest one."""
        if turn_id is not None and turn_id == history.last_turn_id:
            return history.turns[:-1]
        return history.turns

    def _get(self, conversation_id: str | None) -> _History | None:
        if not conversation_id:
            return None
        history = self._histories.get(conversation_id)
        if history is not None and time.monotonic() - history.touched > self.ttl_seconds:
            del self._histories[conversation_id]
            return None
        return history

    def __len__(self) -> int:
        return len(self._histories)
