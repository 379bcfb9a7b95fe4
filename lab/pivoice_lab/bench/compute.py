"""Model compute of the very turns the bench ran, replayed on the engines in this process.

For each turn, with the server idle and nothing else running:
- ASR: `transcribe` of the exact audio the satellite sent;
- LLM: the same prompt (system prompt + transcript, the system prompt already in the
  cache as on the server); the time to the first token is measured, and the time the
  model needs for the turn's actual first phrase (or whole reply, sequential) is
  first-token time + (its token count − 1) × the time per token — sampling may word a
  replay differently, the token count of the real reply does not change;
- TTS: time to the first audio of the first phrase (streaming), or to all the audio of
  the whole reply (sequential: nothing plays before it is complete).

This is the models' cost in isolation (`--replay`); the bench's pipeline overhead comes
from the server's own timing of each turn (its compute log, server_compute.py) when the
bench started the server, and from this replay only when not (a server already running).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from wyoming_pivoice.engines import (
    AsrSettings,
    LlamaChat,
    LlmSettings,
    PiperTts,
    TtsSettings,
    WhisperAsr,
)
from wyoming_pivoice.text import split_all

from .knobs import first_sentence_audio
from .server_compute import overhead_ms


def replay(
    turns: list[dict[str, Any]],
    audio: dict[int, bytes],
    asr_settings: AsrSettings,
    llm_settings: LlmSettings,
    tts_settings: TtsSettings,
    min_clause_chars: int,
    reps: int = 2,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Add `replay_compute_ms` and the `compute_replay` stage to each turn (in place); also
    `compute` / `overhead` where the server's log gave none.

    `audio` maps a turn's index in `turns` to the PCM the satellite sent for it. Each
    measurement is taken `reps` times and the least kept: interference (another process,
    a page fault) only ever adds time, so the minimum is the model's own cost. The time
    per generated token is a property of the model and machine: its median over all
    turns is used for every turn.
    """
    asr = WhisperAsr(asr_settings)
    llm = LlamaChat(llm_settings)
    tts = PiperTts(tts_settings)
    asr.transcribe(np.zeros(16000, dtype=np.float32))  # warm-up, as the server had
    tts.synthesize("Hello.")
    measured: list[tuple[dict[str, Any], dict[str, Any]]] = []
    per_token: list[float] = []
    for index, turn in enumerate(turns):
        pcm = audio.get(index)
        if turn.get("error") or pcm is None or not turn.get("reply"):
            continue
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        reply = turn["reply"]
        sequential = turn["pipeline"] == "sequential"
        first_phrase = (split_all(reply, min_clause_chars) or [reply])[0]
        spoken_first = reply if sequential else first_phrase
        tokens_needed = _tokens(llm, spoken_first)
        asr_s, first_token_s, tts_s = [], [], []
        for _rep in range(reps):
            asr_s.append(_seconds(partial(asr.transcribe, samples)))
            first, rate = _llm_timing(llm, llm_settings, turn["transcript"], 16)
            first_token_s.append(first)
            if rate is not None:
                per_token.append(rate)
            if sequential:  # nothing plays before the whole reply's audio is in
                tts_s.append(_seconds(partial(tts.synthesize, reply)))
            else:
                tts_s.append(_seconds(partial(first_sentence_audio, tts, spoken_first)))
        figures = {
            "asr": min(asr_s),
            "llm_first_token": min(first_token_s),
            "llm_tokens": tokens_needed,
            "tts_first_audio": min(tts_s),
        }
        measured.append((turn, figures))
        if progress:
            progress(f"compute {turn['config']} {turn['utterance']}")
    token_s = statistics.median(per_token) if per_token else 0.0
    for turn, figures in measured:
        llm_s = figures["llm_first_token"] + max(0, figures["llm_tokens"] - 1) * token_s
        compute_s = figures["asr"] + llm_s + figures["tts_first_audio"]
        turn["replay_compute_ms"] = {
            "asr": round(figures["asr"] * 1000, 1),
            "llm_first_token": round(figures["llm_first_token"] * 1000, 1),
            "llm_per_token": round(token_s * 1000, 2),
            "llm_tokens": figures["llm_tokens"],
            "llm": round(llm_s * 1000, 1),
            "tts_first_audio": round(figures["tts_first_audio"] * 1000, 1),
            "total": round(compute_s * 1000, 1),
        }
        turn["stages_ms"]["compute_replay"] = turn["replay_compute_ms"]["total"]
        if "compute" not in turn["stages_ms"]:  # no compute log to read: use the replay
            turn["stages_ms"]["compute"] = turn["replay_compute_ms"]["total"]
            turn["stages_ms"]["overhead"] = overhead_ms(turn, compute_s)
            turn["compute_source"] = "replay"


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _tokens(llm: LlamaChat, text: str) -> int:
    return max(1, len(llm.llama.tokenize(text.encode(), add_bos=False, special=False)))


def _llm_timing(
    llm: LlamaChat, settings: LlmSettings, text: str, max_tokens: int
) -> tuple[float, float | None]:
    """(seconds to the first token, seconds per further token) for this prompt.

    First the cache is put where the server's is at the start of a turn: holding the
    system prompt and another turn's text, so only the system prompt is reused.
    """
    system = {"role": "system", "content": settings.system_prompt}
    llm.complete([system, {"role": "user", "content": "Hello there."}], max_tokens=1)
    messages = [system, {"role": "user", "content": text}]
    start = time.perf_counter()
    first: float | None = None
    last = start
    pieces = 0
    for _piece in llm.stream(messages, max_tokens=max_tokens):
        last = time.perf_counter()
        if first is None:
            first = last - start
        pieces += 1
    if first is None:
        return last - start, None
    return first, ((last - start - first) / (pieces - 1) if pieces > 2 else None)
