"""Speech to text with faster-whisper (CTranslate2)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..catalogue import names
from ..models import ModelStore, cached_whisper, resolve_whisper, whisper_name
from ..options import Addon, opt
from .protocols import EngineDescription
from .whisper_window import (
    FULL_WINDOW_S,
    KEEP_TAIL_S,
    TIGHT_TAIL_S,
    cut_quiet_tail,
    encoder_window,
    fitted_frames,
    quiet_tail_s,
)


@dataclass(frozen=True)
class AsrSettings:
    model: str = opt(
        "embedded",
        "--asr-model",
        help="'embedded' (Whisper tiny.en), a CTranslate2 model folder, or a faster-whisper "
        f"name ({', '.join(names('asr'))} …), downloaded once",
        addon=Addon("str"),
    )
    compute_type: str = opt("int8", "--asr-compute-type", help="int8, int8_float32, float32 …")
    beam_size: int = opt(1, "--asr-beam-size", addon=Addon("int(1,10)"))
    language: str | None = opt(
        "en",
        "--asr-language",
        help="language code, or 'auto' (default: --language, en)",
        cli_default=None,  # not given: the server's --language (server/cli.py)
        addon=Addon("str", default="en"),
    )
    initial_prompt: str | None = opt(None, "--asr-initial-prompt")
    threads: int = opt(
        0, "--asr-threads", help="0: CTranslate2's default", addon=Addon("int(0,64)?")
    )
    without_timestamps: bool = True  # for audio cut tightly (the fitted window) only
    # Shortest encoder window in seconds; the window fits the utterance above it, after a
    # long quiet tail is cut (see whisper_window). 30: always Whisper's window, audio as is.
    window_s: float = opt(
        10.0,
        "--asr-window",
        help="shortest Whisper encoder window in seconds; it grows to fit longer speech. "
        "30: Whisper's fixed window (≈ 3× slower on short commands)",
        addon=Addon("float(1,30)?"),
    )
    engine: str = "faster-whisper"  # its name in engines/registry.py
    store: ModelStore = field(default_factory=ModelStore)  # where named models download to
    # Audio whose quiet tail is longer than this is not cut tightly (math.inf: every tail
    # counts as tight, the fitted window for all audio as before #27).
    tight_tail_s: float = TIGHT_TAIL_S
    # Such audio (a WAV file, Home Assistant's stream up to its end of speech) has its quiet
    # tail cut to this, as the satellite's endpoint cuts it, and takes the fitted window too:
    # 175 clips × 3 seeded rounds, 220-223 errors of 1103 words against 257-262 in Whisper's
    # 30 s window (the session-7 rule, None here), ~5× less compute (docs/asr.md).
    keep_tail_s: float | None = KEEP_TAIL_S
    # faster-whisper's temperature fallback: a decode that fails its checks is sampled again
    # at rising temperatures (random: the same audio can give two transcripts).
    temperature_fallback: bool = True
    cap_tokens: bool = True  # decoding cap by audio length (max_tokens), fitted window only
    trim_repeats: bool = True  # collapse_repeats on each segment
    # Seeds the fallback's sampling: the same calls in the same order give the same words
    # (None: a random seed, as faster-whisper does). Used to score WER repeatably.
    seed: int | None = None


# Nobody speaks faster than ~4 words (≈6 tokens) a second; a segment decoding far more
# than that is tiny.en looping, and the cap bounds how long a loop can take.
TOKENS_PER_S = 8
# English-only Whisper vocabularies have 51864 tokens, multilingual ones 51865 or more.
_MULTILINGUAL_VOCAB = 51865
TOKENS_SLACK = 16


def max_tokens(audio_s: float) -> int:
    """Decoding cap per segment (a segment spans at most Whisper's 30 s)."""
    return TOKENS_SLACK + math.ceil(TOKENS_PER_S * min(audio_s, FULL_WINDOW_S))


def collapse_repeats(text: str, min_words: int = 6) -> str:
    """Keep one copy of a phrase the text ends by repeating (tiny.en can loop on a short
    command: "turn on the lights turn on the lights ..."). The repeated run must span at
    least `min_words`, so "no, no, no" stays as said. Its last word may be cut short: the
    decoding cap (max_tokens) ends a loop mid-word ("… at sunset turn on the por")."""
    words = text.split()
    key = [w.strip(",.!?;:").lower() for w in words]
    n = len(key)

    def same(i: int, unit: int) -> bool:
        later = key[i + unit]
        return later == key[i] or (i + unit == n - 1 and bool(later) and key[i].startswith(later))

    for start in range(n - min_words + 1):
        for unit in range(1, (n - start) // 2 + 1):
            if all(same(i, unit) for i in range(start, n - unit)):
                return " ".join(words[: start + unit]).rstrip(",;:")
    return text


class WhisperAsr:
    """Loads one Whisper model; `segments` is blocking and must run in a worker thread."""

    def __init__(self, settings: AsrSettings) -> None:
        from faster_whisper import WhisperModel  # heavy import, only when a model is loaded

        self.settings = settings
        self.model_path = resolve_whisper(settings.model, settings.store)
        if settings.seed is not None:
            # CTranslate2 draws from one generator per thread (`thread_local std::mt19937`),
            # seeded from the global seed when that thread first samples; a seed set later
            # changes nothing. The model's worker thread is made here, so the seed must be
            # set first (then two runs of the same calls agree word for word, docs/asr.md).
            import ctranslate2

            ctranslate2.set_random_seed(settings.seed)
        self.model = WhisperModel(
            self.model_path,
            device="cpu",
            compute_type=settings.compute_type,
            cpu_threads=settings.threads,
        )
        # English-only models (tiny.en …) cannot be asked for another language.
        self.english_only = not self.model.model.is_multilingual

    @property
    def name(self) -> str:
        return whisper_name(self.settings.model)

    @classmethod
    def describe(cls, settings: AsrSettings) -> EngineDescription:
        """Without loading: English-only models (`*.en`, or a vocabulary under 51865 tokens)
        serve "en"; a multilingual one the configured language, or all of Whisper's."""
        name = whisper_name(settings.model)
        folder = cached_whisper(settings.model, settings.store)
        english_only = name.endswith(".en")
        vocabulary = Path(folder) / "vocabulary.txt" if folder else None
        if vocabulary is not None and vocabulary.exists():
            with vocabulary.open(encoding="utf-8") as lines:
                english_only = sum(1 for _ in lines) < _MULTILINGUAL_VOCAB
        if english_only:
            languages: tuple[str, ...] = ("en",)
        elif settings.language:
            languages = (settings.language,)
        else:
            from faster_whisper.tokenizer import _LANGUAGE_CODES

            languages = tuple(_LANGUAGE_CODES)
        return EngineDescription(
            kind="asr",
            engine="faster-whisper",
            model=name,
            languages=languages,
            attribution="SYSTRAN / OpenAI",
            url="https://github.com/SYSTRAN/faster-whisper",
            description=f"Whisper {name}",
        )

    @property
    def languages(self) -> list[str]:
        if self.english_only:
            return ["en"]
        return list(self.model.supported_languages)

    def segments(
        self, audio: np.ndarray, language: str | None = None, cancel: threading.Event | None = None
    ) -> Iterator[str]:
        """Yield the text of each decoded segment of 16 kHz mono float32 audio."""
        if audio.size == 0:
            return
        lang = "en" if self.english_only else (language or self.settings.language)
        settings = self.settings
        if (
            settings.keep_tail_s is not None
            and settings.window_s < FULL_WINDOW_S
            and quiet_tail_s(audio) > settings.tight_tail_s
        ):
            audio = cut_quiet_tail(audio, settings.keep_tail_s)
        seconds = audio.size / 16000
        frames = fitted_frames(audio, settings.window_s, settings.tight_tail_s)
        options: dict = {}
        if not settings.temperature_fallback:
            options["temperature"] = 0.0
        # The cap guards the fitted window (where tiny.en loops); in the 30 s window it only
        # cut the fallback's sampled decodes short (69-76 errors with it, 60 without, plain
        # faster-whisper 65-69 on the 59-clip household corpus; docs/asr.md).
        if settings.cap_tokens and frames is not None:
            options["max_new_tokens"] = max_tokens(seconds)
        segments, _info = self.model.transcribe(
            audio,
            language=lang,
            beam_size=settings.beam_size,
            initial_prompt=settings.initial_prompt,
            # In Whisper's 30 s window (--asr-window 30, or keep_tail_s None) audio is
            # decoded as plain faster-whisper decodes it: timestamps, no cap (docs/asr.md).
            without_timestamps=settings.without_timestamps and frames is not None,
            condition_on_previous_text=False,
            vad_filter=False,  # the satellite already trims with Silero VAD
            **options,
        )
        with encoder_window(frames):
            for segment in segments:  # decoding happens lazily, segment by segment
                if cancel is not None and cancel.is_set():
                    return
                text = segment.text.strip()
                if settings.trim_repeats:
                    text = collapse_repeats(text)
                # Noise can decode to a lone "." — nothing was said.
                if any(ch.isalnum() for ch in text):
                    yield text

    def warm_up(self) -> None:
        """One short decode: the first request should not pay CTranslate2's first-run cost."""
        self.transcribe(np.zeros(16000, dtype=np.float32))

    def transcribe(self, audio: np.ndarray, language: str | None = None) -> str:
        return " ".join(self.segments(audio, language))
