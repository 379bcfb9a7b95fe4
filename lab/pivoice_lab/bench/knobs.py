"""The knobs, measured on the engines in this process with the corpus as input.

Each variant changes one thing against the defaults (AsrSettings, LlmSettings and a
preloaded Piper voice) and is timed on the same inputs, variants interleaved per input
so machine noise hits all of them alike. Accuracy is reported beside speed (the share of
utterances whose key words are in the transcript), so a faster setting that hears worse
shows it.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from wyoming_pivoice.engines import (
    AsrSettings,
    AudioFirst,
    LlamaChat,
    LlmSettings,
    PiperTts,
    TtsSettings,
    WhisperAsr,
)
from wyoming_pivoice.text import split_all

from .corpus import RATE, Utterance
from .peers import THREE_SENTENCE_REPLIES

Progress = Callable[[str], None]


def _ms(seconds: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(seconds) * 1000, 1),
        "p90": round(float(np.percentile(seconds, 90)) * 1000, 1),
        "n": len(seconds),
    }


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def first_sentence_audio(tts: PiperTts, text: str) -> bytes:
    """The first sentence's audio of `text` (what a streaming reply plays first)."""
    return next(iter(tts.sentences(text)))


def _first_audio_yielding(audio_first: AudioFirst, tts: PiperTts, text: str) -> bytes:
    """The same with the LLM told to pause while Piper speaks (engines/priority.py)."""
    return next(iter(audio_first.while_speaking(tts.sentences(text))))


def trimmed(utterance: Utterance, prespeech_s: float = 0.3, pad_s: float = 0.1) -> np.ndarray:
    """What our satellite sends at the endpoint: the speech, 300 ms before it, 100 ms after."""
    samples = utterance.samples()
    start = max(0, int((utterance.speech_start_s - prespeech_s) * RATE))
    end = min(samples.size, int((utterance.speech_end_s + pad_s) * RATE))
    return samples[start:end]


def untrimmed(utterance: Utterance, window_s: float = 0.3) -> np.ndarray:
    """What a pipeline without VAD trimming sends: the file from its start to the endpoint."""
    samples = utterance.samples()
    return samples[: min(samples.size, int((utterance.speech_end_s + window_s) * RATE))]


# ---- ASR ----------------------------------------------------------------------------------

ASR_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "float32": {"compute_type": "float32"},
    "beam 5": {"beam_size": 5},
    "with timestamps": {"without_timestamps": False},
    "untrimmed audio": {},  # same settings, the audio differs
    "window 30 s": {"window_s": 30.0},  # Whisper's fixed window
    "threads 1": {"threads": 1},
    "threads 2": {"threads": 2},
    "threads 4": {"threads": 4},
}


def _engine_key(settings: AsrSettings) -> tuple[object, ...]:
    """What makes one loaded Whisper engine differ from another (audio trimming does not)."""
    s = settings
    return (s.compute_type, s.beam_size, s.without_timestamps, s.threads, s.window_s)


def asr_knobs(
    utterances: list[Utterance], base: AsrSettings, reps: int, progress: Progress | None = None
) -> dict[str, Any]:
    engines: dict[tuple, tuple[WhisperAsr, float]] = {}
    for change in ASR_VARIANTS.values():
        settings = replace(base, **change)
        key = _engine_key(settings)
        if key not in engines:
            load_s, engine = _timed(partial(WhisperAsr, settings))
            engine.transcribe(trimmed(utterances[0]))  # warm-up
            engines[key] = (engine, load_s)
    times: dict[str, list[float]] = {name: [] for name in ASR_VARIANTS}
    heard: dict[str, list[bool]] = {name: [] for name in ASR_VARIANTS}
    names = list(ASR_VARIANTS)
    for rep in range(reps):
        for utterance in utterances:
            audio = {"trimmed": trimmed(utterance), "untrimmed": untrimmed(utterance)}
            order = names if rep % 2 == 0 else names[::-1]
            for name in order:
                engine, _ = engines[_engine_key(replace(base, **ASR_VARIANTS[name]))]
                samples = audio["untrimmed" if name == "untrimmed audio" else "trimmed"]
                seconds, text = _timed(partial(engine.transcribe, samples))
                times[name].append(seconds)
                heard[name].append(utterance.heard(text))
            if progress:
                progress(f"knobs asr {utterance.id}")
    base_median = statistics.median(times["default"])
    out = {}
    for name in names:
        settings = replace(base, **ASR_VARIANTS[name])
        _, load_s = engines[_engine_key(settings)]
        out[name] = {
            "ms": _ms(times[name]),
            "vs_default": round(statistics.median(times[name]) / base_median, 3),
            "heard": round(sum(heard[name]) / len(heard[name]), 3),
            "load_s": round(load_s, 2),
        }
    del engines
    gc.collect()
    return {
        "what": "transcribe() seconds per utterance (audio at the endpoint), in process",
        "defaults": _asr_dict(base),
        "variants": out,
    }


def _asr_dict(settings: AsrSettings) -> dict[str, Any]:
    return {
        "compute_type": settings.compute_type,
        "beam_size": settings.beam_size,
        "without_timestamps": settings.without_timestamps,
        "threads": settings.threads,
        "window_s": settings.window_s,
    }


# ---- LLM ----------------------------------------------------------------------------------


def _first_token(llm: LlamaChat, text: str, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to first piece, seconds to the end, pieces) for one user turn."""
    messages = [
        {"role": "system", "content": llm.settings.system_prompt},
        {"role": "user", "content": text},
    ]
    start = time.perf_counter()
    first = None
    pieces = 0
    for _piece in llm.stream(messages, max_tokens=max_tokens):
        if first is None:
            first = time.perf_counter() - start
        pieces += 1
    total = time.perf_counter() - start
    return (first if first is not None else total), total, pieces


def llm_knobs(
    utterances: list[Utterance], base: LlmSettings, reps: int, progress: Progress | None = None
) -> dict[str, Any]:
    prompts = [u.text for u in utterances]
    variants: dict[str, dict[str, Any]] = {
        "default": {},
        "threads 1": {"threads": 1},
        "threads 2": {"threads": 2},
        # Before session 12 every reply decoded on all its threads, however busy the cores.
        "threads 2, whatever the load": {"threads": 2, "adapt_threads": False},
    }
    out: dict[str, Any] = {}
    for name, change in variants.items():
        load_s, llm = _timed(partial(LlamaChat, replace(base, **change)))
        _first_token(llm, "Hello.", 8)  # warm-up
        ttft_reuse, ttft_cold, rates = [], [], []
        for _rep in range(reps):
            for prompt in prompts:
                # The system prompt is already in the KV cache from the previous turn.
                first, total, pieces = _first_token(llm, prompt, 48)
                ttft_reuse.append(first)
                if pieces > 1:
                    rates.append((pieces - 1) / max(total - first, 1e-6))
                if name == "default":
                    llm.llama.reset()  # forget the cache: the whole prompt is evaluated again
                    first, _total, _pieces = _first_token(llm, prompt, 1)
                    ttft_cold.append(first)
                if progress:
                    progress(f"knobs llm {name}")
        out[name] = {
            "load_s": round(load_s, 2),
            "first_token_ms": _ms(ttft_reuse),
            "tokens_per_s": round(statistics.median(rates), 1) if rates else None,
        }
        if ttft_cold:
            out["no KV reuse"] = {
                "first_token_ms": _ms(ttft_cold),
                "vs_default": round(
                    statistics.median(ttft_cold) / statistics.median(ttft_reuse), 3
                ),
                "prompt_tokens": len(llm.llama.tokenize(base.system_prompt.encode(), add_bos=True)),
            }
        del llm
        gc.collect()
    base_median = out["default"]["first_token_ms"]["median"]
    for name in variants:
        out[name]["vs_default"] = round(out[name]["first_token_ms"]["median"] / base_median, 3)
    return {
        "what": "seconds from the request to the first streamed piece, in process; "
        "'no KV reuse' resets llama.cpp's cache before each turn",
        "defaults": {"threads": base.threads, "context": base.context},
        "variants": out,
    }


# ---- TTS ----------------------------------------------------------------------------------


def tts_knobs(
    base: TtsSettings, min_clause_chars: int, reps: int, progress: Progress | None = None
) -> dict[str, Any]:
    phrases = [split_all(text, min_clause_chars)[0] for text in THREE_SENTENCE_REPLIES]

    def first_audio(tts: PiperTts, text: str) -> float:
        start = time.perf_counter()
        next(iter(tts.sentences(text)))
        return time.perf_counter() - start

    # The baseline of the sleeping pool (engines/tts.py): onnxruntime's own spinning one, timed
    # on the same phrases right after the default's, so both see the same load.
    spinning = PiperTts(replace(base, spin_threads=True))
    spinning.synthesize("Warming up.")
    cold, first_call, warm, warm_spinning = [], [], [], []
    for rep in range(reps):
        phrase = phrases[rep % len(phrases)]
        start = time.perf_counter()
        tts = PiperTts(base)
        load = time.perf_counter() - start
        first = first_audio(tts, phrase)
        cold.append(load + first)
        first_call.append(first)
        for other in phrases:
            warm.append(first_audio(tts, other))
            warm_spinning.append(first_audio(spinning, other))
        del tts
        gc.collect()
        if progress:
            progress("knobs tts")
    return {
        "what": "seconds to the first audio of a reply's first phrase, in process",
        "variants": {
            "preloaded, warm": {"ms": _ms(warm)},
            "preloaded, warm, onnxruntime's spinning threads": {"ms": _ms(warm_spinning)},
            "preloaded, first call": {"ms": _ms(first_call)},
            "not preloaded (load + first call)": {"ms": _ms(cold)},
        },
    }


# ---- LLM and TTS at once (what the streaming pipeline does) -------------------------------


def overlap_knobs(
    utterances: list[Utterance],
    base_llm: LlmSettings,
    base_tts: TtsSettings,
    min_clause_chars: int,
    reps: int,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """In the streaming pipeline the LLM writes phrase 2 while Piper speaks phrase 1, on the
    same cores. Measured per LLM thread count: LLM tokens/s while Piper synthesizes
    without pause, and Piper's first audio while the LLM generates without pause."""
    phrases = [split_all(text, min_clause_chars)[0] for text in THREE_SENTENCE_REPLIES]
    tts = PiperTts(base_tts)
    tts.synthesize("Warming up.")
    out: dict[str, Any] = {}
    out["TTS alone"] = {
        "tts_first_audio_ms": _ms(
            [
                _timed(partial(first_sentence_audio, tts, phrase))[0]
                for _rep in range(reps)
                for phrase in phrases
            ]
        )
    }
    for threads in (1, 2):
        llm = LlamaChat(replace(base_llm, threads=threads))
        _first_token(llm, "Hello.", 8)
        stop = threading.Event()

        def speak_forever(stop: threading.Event = stop) -> None:
            while not stop.is_set():
                tts.synthesize(THREE_SENTENCE_REPLIES[0])

        worker = threading.Thread(target=speak_forever, daemon=True)
        worker.start()
        rates = []
        for _rep in range(reps):
            for utterance in utterances[:6]:
                first, total, pieces = _first_token(llm, utterance.text, 48)
                if pieces > 1:
                    rates.append((pieces - 1) / max(total - first, 1e-6))
        stop.set()
        worker.join()

        stop = threading.Event()

        def think_forever(stop: threading.Event = stop, llm: LlamaChat = llm) -> None:
            while not stop.is_set():
                _first_token(llm, "Tell me a long story about a lighthouse.", 64)

        worker = threading.Thread(target=think_forever, daemon=True)
        worker.start()
        first_audio = []
        for _rep in range(reps):
            for phrase in phrases:
                first_audio.append(_timed(partial(first_sentence_audio, tts, phrase))[0])
        stop.set()
        worker.join()
        out[f"LLM threads {threads}"] = {
            "llm_tokens_per_s_while_tts": round(statistics.median(rates), 1) if rates else None,
            "tts_first_audio_while_llm_ms": _ms(first_audio),
        }
        if threads == 2:
            out["LLM threads 2, audio first"] = {
                "tts_first_audio_while_llm_ms": _ms(_audio_first_overlap(llm, tts, phrases, reps))
            }
        del llm
        gc.collect()
        if progress:
            progress(f"knobs overlap threads {threads}")
    return {
        "what": "LLM decode speed while Piper synthesizes, and Piper's first audio while the "
        "LLM decodes, per LLM thread count (in process)",
        "variants": out,
    }


def _audio_first_overlap(
    llm: LlamaChat, tts: PiperTts, phrases: list[str], reps: int
) -> list[float]:
    """Piper's first audio while the LLM decodes flat out but yields to it (the server's
    default, engines/priority.py)."""
    audio_first = AudioFirst()
    stop = threading.Event()
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]

    def think_forever() -> None:
        while not stop.is_set():
            for _piece in llm.stream(messages, max_tokens=64, pause=audio_first.pause):
                if stop.is_set():
                    break

    worker = threading.Thread(target=think_forever, daemon=True)
    worker.start()
    try:
        return [
            _timed(partial(_first_audio_yielding, audio_first, tts, phrase))[0]
            for _rep in range(reps)
            for phrase in phrases
        ]
    finally:
        stop.set()
        worker.join()


PARTS = ("asr", "llm", "tts", "overlap")


def run(
    utterances: list[Utterance],
    asr: AsrSettings,
    llm: LlmSettings,
    tts: TtsSettings,
    min_clause_chars: int,
    reps: int = 2,
    progress: Progress | None = None,
    parts: tuple[str, ...] = PARTS,
) -> dict[str, Any]:
    measure: dict[str, Callable[[], dict[str, Any]]] = {
        "asr": lambda: asr_knobs(utterances, asr, reps, progress),
        "llm": lambda: llm_knobs(utterances, llm, reps, progress),
        "tts": lambda: tts_knobs(tts, min_clause_chars, max(reps, 3), progress),
        "overlap": lambda: overlap_knobs(utterances, llm, tts, min_clause_chars, reps, progress),
    }
    return {part: measure[part]() for part in PARTS if part in parts}
