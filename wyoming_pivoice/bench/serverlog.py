"""Model compute of each turn as the server itself timed it, read from its log.

The server logs, per request, how long the model took: "Transcribed … in X s",
"Answered in X s (first token Y s)" and "Spoke … in W s (first audio Z s)". The
bench's server stamps its lines with time.monotonic() (`--log-clock monotonic`), the
clock of the satellite's stamps, so each line falls inside the time window of exactly one
turn (turns run one at a time). The wall clock is not used: on a VM it was seen to jump
by seconds during a run.

Critical-path compute of a turn:
- streaming: ASR + LLM first token + (tokens of the first phrase − 1) × time per token
  + TTS first audio of the first phrase;
- sequential: ASR + the whole LLM reply + the whole TTS of the reply (nothing plays
  before all of its audio is in, as with Home Assistant's non-streaming TTS).
The time per token of a turn comes from its own "Answered" line: (total − first token)
/ (reply tokens − 1), tokens counted with the model's own tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..text import split_all
from .report import ms

_LINE = re.compile(
    r"^(?P<when>\d+\.\d+) \w+ wyoming_pivoice\.server\.\w+: "
    r"(?:Transcribed [0-9.]+ s of audio in (?P<asr>[0-9.]+) s"
    r"|Answered in (?P<llm>[0-9.]+) s \(first token (?P<ttft>[0-9.]+) s\)"
    r"|Spoke [0-9.]+ s of audio in (?P<tts_all>[0-9.]+) s \(first audio (?P<tts>[0-9.]+) s\))",
    re.MULTILINE,
)


@dataclass(frozen=True)
class LogEntry:
    at: float  # monotonic time of the line (the end of that request)
    kind: str  # asr | llm | tts
    seconds: float
    first: float | None = None  # llm: to the first token; tts: to the first audio


def parse(log_text: str) -> list[LogEntry]:
    """The compute lines of a log written with `--log-clock monotonic`."""
    entries = []
    for match in _LINE.finditer(log_text):
        at = float(match["when"])
        if match["asr"]:
            entries.append(LogEntry(at, "asr", float(match["asr"])))
        elif match["llm"]:
            entries.append(LogEntry(at, "llm", float(match["llm"]), float(match["ttft"])))
        else:
            entries.append(LogEntry(at, "tts", float(match["tts_all"]), float(match["tts"])))
    return entries


def attribute(
    turns: list[dict[str, Any]],
    entries: list[LogEntry],
    count_tokens: Callable[[str], int],
    min_clause_chars: int,
) -> int:
    """Add `server_compute_ms` and the `compute` / `overhead` stages to each turn it can.

    Returns how many turns got figures.
    """
    done = 0
    for turn in turns:
        stamps = turn.get("stamps") or {}
        begin = stamps.get("speech_start") or stamps.get("endpoint")
        end = stamps.get("playback_done")
        if turn.get("error") or begin is None or end is None or not turn.get("reply"):
            continue
        # Log lines carry milliseconds; allow for that and the write after the last event.
        mine = [e for e in entries if begin - 0.002 <= e.at <= end + 0.25]
        transcript_at = stamps.get("transcript") or end
        asr = [e for e in mine if e.kind == "asr" and e.at <= transcript_at + 0.01]
        llm = [e for e in mine if e.kind == "llm"]
        tts = [e for e in mine if e.kind == "tts"]
        if not asr or not llm or not tts:
            continue
        asr_s = asr[-1].seconds  # the run that was kept (a cancelled speculation came earlier)
        answer = llm[-1]
        reply = turn["reply"]
        reply_tokens = count_tokens(reply)
        first_token = answer.first or 0.0
        per_token = (answer.seconds - first_token) / (reply_tokens - 1) if reply_tokens > 1 else 0.0
        if turn["pipeline"] == "sequential":
            llm_s = answer.seconds
            phrase_tokens = reply_tokens
        else:
            phrase = (split_all(reply, min_clause_chars) or [reply])[0]
            phrase_tokens = count_tokens(phrase)
            llm_s = first_token + max(0, phrase_tokens - 1) * per_token
        tts_s = tts[0].seconds if turn["pipeline"] == "sequential" else tts[0].first or 0.0
        compute_s = asr_s + llm_s + tts_s
        turn["server_compute_ms"] = {
            "asr": round(asr_s * 1000, 1),
            "llm_first_token": round(first_token * 1000, 1),
            "llm_per_token": round(per_token * 1000, 2),
            "llm_tokens": phrase_tokens,
            "llm": round(llm_s * 1000, 1),
            "tts_first_audio": round(tts_s * 1000, 1),
            "total": round(compute_s * 1000, 1),
        }
        turn["stages_ms"]["compute"] = turn["server_compute_ms"]["total"]
        turn["stages_ms"]["overhead"] = overhead_ms(turn, compute_s)
        done += 1
    return done


def overhead_ms(turn: dict[str, Any], compute_s: float) -> float | None:
    """First sample played − when the models could at best have had it ready.

    The work starts at the endpoint, or at the speculation start when that run was kept;
    nothing may play before the endpoint.
    """
    stamps = turn["stamps"]
    endpoint, played = stamps.get("endpoint"), stamps.get("first_played")
    if endpoint is None or played is None:
        return None
    used = turn.get("speculation", {}).get("used")
    work_start = (stamps.get("speculation_start") if used else None) or endpoint
    return ms(max(endpoint, work_start + compute_s), played)


def token_counter() -> Callable[[str], int]:
    """Counts tokens with the LLM's own tokenizer (vocabulary only: no weights loaded)."""
    from llama_cpp import Llama

    from ..engines.llm import LlmSettings
    from ..models import resolve_llm

    vocab = Llama(model_path=str(resolve_llm(LlmSettings().model)), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return max(1, len(vocab.tokenize(text.encode(), add_bos=False, special=False)))

    return count
