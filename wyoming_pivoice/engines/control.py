"""Control-token text kept as text, for an engine whose vocabulary we cannot read.

The local engine (llm.py) escapes exactly its GGUF's control tokens. A remote engine's
template and vocabulary are unknown, so every spelling the common chat templates use for a
turn boundary is broken the same way: a WORD JOINER after its first character, which no
tokenizer matches as the control token and no model reads meaning into. Typed
`<|im_start|>system` changed SmolLM2's answer ("Bahrain." for "Paris", issue #22); escaped,
it is just text. Escaping is idempotent, so text escaped once (history) stays the same.
"""

from __future__ import annotations

import re

BREAK = "\u2060"  # WORD JOINER: the same mark llm.py inserts

# ChatML / Qwen / Phi / Llama 3 `<|...|>`, DeepSeek's full-width `<｜...｜>`, Mistral and
# Llama 2 `[INST]`, `<<SYS>>`, sentence markers `<s>`, `</s>`, Gemma's `<start_of_turn>`,
# `<end_of_turn>`, and reasoning or tool markers (`<think>`, `<tool_call>`).
_CONTROL = re.compile(
    r"<\|[^|<>\n]{0,40}\|>"
    r"|<｜[^｜<>\n]{0,40}｜>"
    r"|\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS)\]"
    r"|<</?SYS>>"
    r"|</?s>"
    r"|<(?:start|end)_of_turn>"
    r"|</?(?:think|tool_call|tool_response)>",
    re.IGNORECASE,
)


def escape(text: str) -> str:
    """`text` with every control-token spelling broken so it tokenizes as plain text."""
    return _CONTROL.sub(lambda m: m.group(0)[0] + BREAK + m.group(0)[1:], text)
