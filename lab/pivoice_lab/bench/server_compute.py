"""Model compute of each turn as the server itself timed it, read from its compute log.

The server records, per request, how long the model took (compute_log.py), stamped with
time.monotonic(): the clock of the satellite's stamps, so each record falls inside the time
window of exactly one turn (turns run one at a time). The wall clock is not used: on a VM it
was seen to jump by seconds during a run.

Critical-path compute of a turn:
- streaming: ASR + LLM first token + (tokens of the first phrase − 1) × time per token
  + TTS first audio of the first phrase;
- sequential: ASR + the whole LLM reply + the whole TTS of the reply (nothing plays
  before all of its audio is in, as with Home Assistant's non-streaming TTS).
The time per token of a turn comes from its own LLM record: (total − first token) /
(reply tokens − 1), the reply's tokens as the server's model generated them. The first
phrase's share of them is taken by its share of the reply's characters (the bench has no
tokenizer of its own: the server may run any model).
"""

from __future__ import annotations

from typing import Any

from wyoming_pivoice.compute_log import Compute, Load
from wyoming_pivoice.text import split_all
from wyoming_pivoice.timing import ms


def attribute(
    turns: list[dict[str, Any]], records: list[Load | Compute], min_clause_chars: int
) -> int:
    """Add `server_compute_ms` and the `compute` / `overhead` stages to each turn it can.

    Returns how many turns got figures.
    """
    computed = [r for r in records if isinstance(r, Compute)]
    done = 0
    for turn in turns:
        stamps = turn.get("stamps") or {}
        begin = stamps.get("speech_start") or stamps.get("endpoint")
        end = stamps.get("playback_done")
        if turn.get("error") or begin is None or end is None or not turn.get("reply"):
            continue
        # Allow for the write after the last event.
        mine = [r for r in computed if begin - 0.002 <= r.at <= end + 0.25]
        transcript_at = stamps.get("transcript") or end
        asr = [r for r in mine if r.kind == "asr" and r.at <= transcript_at + 0.01]
        llm = [r for r in mine if r.kind == "llm"]
        tts = [r for r in mine if r.kind == "tts"]
        if not asr or not llm or not tts:
            continue
        asr_s = asr[-1].seconds  # the run that was kept (a cancelled speculation came earlier)
        answer = llm[-1]
        reply = turn["reply"]
        reply_tokens = answer.tokens_out
        first_token = answer.first or 0.0
        per_token = (
            (answer.seconds - first_token) / (reply_tokens - 1)
            if reply_tokens is not None and reply_tokens > 1
            else None
        )
        if turn["pipeline"] == "sequential":
            llm_s = answer.seconds
            phrase_tokens = reply_tokens
        else:
            phrase = (split_all(reply, min_clause_chars) or [reply])[0]
            share = min(1.0, len(phrase) / len(reply))
            if reply_tokens is None or per_token is None:  # not counted: by characters
                phrase_tokens = None
                llm_s = first_token + (answer.seconds - first_token) * share
            else:
                phrase_tokens = max(1, round(reply_tokens * share))
                llm_s = first_token + (phrase_tokens - 1) * per_token
        tts_s = tts[0].seconds if turn["pipeline"] == "sequential" else tts[0].first or 0.0
        compute_s = asr_s + llm_s + tts_s
        turn["server_compute_ms"] = {
            "asr": round(asr_s * 1000, 1),
            "llm_first_token": round(first_token * 1000, 1),
            "llm_per_token": None if per_token is None else round(per_token * 1000, 2),
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
