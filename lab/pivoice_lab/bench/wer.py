"""Word error rate: transcripts scored against the reference text, per utterance and overall.

Both sides go through Whisper's English normaliser (the `whisper-normalizer` package: case,
punctuation, spelled numbers → digits, "twenty one" ↔ "21", British spellings), after two
rules it lacks: "6:45" and "six forty five" both become "645", and "o'clock" stays one word.
jiwer aligns the words. The errors are substitutions + deletions + insertions; WER is the
errors over the reference words of all utterances together (not a mean of per-utterance
rates, so a short command weighs what its words weigh).

Both libraries are development dependencies: `bench` says how to install them if missing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

_CLOCK = re.compile(r"\b(\d{1,2}):(\d\d)\b")
MISSING = "WER needs the development dependencies: pip install jiwer whisper-normalizer"


class WerUnavailable(RuntimeError):
    """jiwer or whisper-normalizer is not installed."""


@cache
def _normaliser() -> Callable[[str], str]:
    try:
        from whisper_normalizer.english import EnglishTextNormalizer
    except ImportError as err:
        raise WerUnavailable(MISSING) from err
    return EnglishTextNormalizer()


def normalise(text: str) -> str:
    text = _CLOCK.sub(r"\1\2", text).replace("o'clock", "oclock").replace("o’clock", "oclock")
    return " ".join(_normaliser()(text).split())


@dataclass(frozen=True)
class Scored:
    id: str
    reference: str
    hypothesis: str
    errors: int
    words: int

    @property
    def wer(self) -> float:
        return self.errors / self.words if self.words else float(self.errors > 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "hypothesis": self.hypothesis,
            "errors": self.errors,
            "words": self.words,
            "wer": round(self.wer, 4),
        }


def score_one(ident: str, reference: str, hypothesis: str) -> Scored:
    try:
        import jiwer
    except ImportError as err:
        raise WerUnavailable(MISSING) from err
    ref, hyp = normalise(reference), normalise(hypothesis)
    words = len(ref.split())
    if not hyp:
        return Scored(ident, reference, hypothesis, words, words)
    if not ref:
        return Scored(ident, reference, hypothesis, len(hyp.split()), 0)
    out = jiwer.process_words(ref, hyp)
    return Scored(
        ident, reference, hypothesis, out.substitutions + out.deletions + out.insertions, words
    )


def total(scored: Iterable[Scored]) -> dict[str, Any]:
    items = list(scored)
    errors = sum(s.errors for s in items)
    words = sum(s.words for s in items)
    return {
        "wer": round(errors / words, 4) if words else None,
        "errors": errors,
        "words": words,
        "utterances": len(items),
        "exact": sum(1 for s in items if s.errors == 0),
    }


def score(triples: Iterable[tuple[str, str, str]]) -> dict[str, Any]:
    """(id, reference, hypothesis) … → the overall figures and one entry per utterance."""
    items = [score_one(*triple) for triple in triples]
    return {**total(items), "per_utterance": {s.id: s.as_dict() for s in items}}


# ---- the ablation: which part of our ASR path costs words ---------------------------------
#
# python -m pivoice_lab.bench.wer [--json FILE] [--limit N]
# Every candidate cause is switched on and off alone against the server as it was (the fitted
# 10 s window for all audio), on the same corpus (bench.corpus.HOUSEHOLD), beside plain
# faster-whisper on the whole clip and the server as it is now.


def satellite_audio(utterance: Any, vad: Any = None) -> bytes:
    """What the satellite sends the server for this utterance: Silero endpointing over the
    file at its default settings (pre-speech, trailing pad), the endpoint's audio (the
    speculation, when it is used, carries the very same audio)."""
    from wyoming_pivoice.audio import CHUNK_BYTES, CHUNK_SECONDS
    from wyoming_pivoice.satellite import (
        Endpointer,
        EndpointKind,
        VadSettings,
    )

    endpointer = Endpointer(vad or VadSettings())
    try:
        pcm = utterance.pcm() + bytes(CHUNK_BYTES * 40)  # the room stays quiet after it
        now = 0.0
        for offset in range(0, len(pcm) - CHUNK_BYTES + 1, CHUNK_BYTES):
            now += CHUNK_SECONDS
            for event in endpointer.feed_sync(pcm[offset : offset + CHUNK_BYTES], now):
                if event.kind is EndpointKind.ENDPOINT:
                    return event.audio
        return b""
    finally:
        endpointer.close()


@dataclass(frozen=True)
class Variant:
    name: str
    candidate: str
    settings: dict[str, Any]  # AsrSettings fields changed from the server's defaults
    clip: str = "whole"  # whole | satellite | satellite+pad (300 ms kept after the speech)
    plain: bool = False  # faster-whisper's own transcribe with its defaults (no patch)


BEFORE = {"tight_tail_s": math.inf}  # the server as it was: the fitted window for all audio

VARIANTS: tuple[Variant, ...] = (
    Variant("plain faster-whisper", "reference", {}, plain=True),
    Variant("plain faster-whisper, no fallback", "reference", {"temperature": 0.0}, plain=True),
    Variant("server before (10 s window for all audio)", "—", BEFORE),
    Variant("server now (30 s window after a quiet tail)", "the fix", {}),
    Variant("server now without decode cap", "decode cap", {"cap_tokens": False}),
    Variant("window 30 s (no pad_or_trim patch)", "encoder window", {"window_s": 30.0}),
    Variant("window 20 s", "encoder window", {**BEFORE, "window_s": 20.0}),
    Variant("no decode cap", "decode cap", {**BEFORE, "cap_tokens": False}),
    Variant("no repeat trimming", "repeat trimming", {**BEFORE, "trim_repeats": False}),
    Variant("timestamps on", "without_timestamps", {**BEFORE, "without_timestamps": False}),
    Variant(
        "no temperature fallback", "temperature fallback", {**BEFORE, "temperature_fallback": False}
    ),
    Variant("satellite audio (Silero endpoint)", "satellite audio", {}, clip="satellite"),
    Variant("satellite audio, 30 s window", "encoder window", {"window_s": 30.0}, "satellite"),
    Variant("satellite audio + 300 ms pad", "endpoint padding", BEFORE, clip="satellite+pad"),
)


def ablate(
    utterances: list[Any],
    base: Any,
    variants: Iterable[Variant] = VARIANTS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """WER and median ASR time of each variant over the same utterances (one process)."""
    import statistics
    import time
    from dataclasses import replace

    import numpy as np

    from wyoming_pivoice.engines import WhisperAsr
    from wyoming_pivoice.satellite import VadSettings

    clips: dict[str, dict[str, np.ndarray]] = {}
    padded = VadSettings(pad_ms=300, speculate_ms=0)
    for u in utterances:
        clips[u.id] = {
            "whole": u.samples(),
            "satellite": _float(satellite_audio(u)),
            "satellite+pad": _float(satellite_audio(u, padded)),
        }
    asr = WhisperAsr(base)  # one model: the variants change how it is called, not its weights
    asr.warm_up()
    rows = []
    for variant in variants:
        asr.settings = base if variant.plain else replace(base, **variant.settings)
        hyps, seconds = [], []
        for u in utterances:
            audio = clips[u.id][variant.clip]
            start = time.perf_counter()
            text = (
                plain_transcribe(asr, audio, **variant.settings)
                if variant.plain
                else (asr.transcribe(audio))
            )
            seconds.append(time.perf_counter() - start)
            hyps.append((u.id, u.text, text))
        scored = score(hyps)
        rows.append(
            {
                "variant": variant.name,
                "candidate": variant.candidate,
                "clip": variant.clip,
                **{k: scored[k] for k in ("wer", "errors", "words", "exact")},
                "median_ms": round(statistics.median(seconds) * 1000, 1),
                "per_utterance": {k: v["hypothesis"] for k, v in scored["per_utterance"].items()},
            }
        )
        if progress:
            progress(f"{variant.name}: WER {scored['wer']:.3f}")
    return {"rows": rows, "utterances": len(utterances)}


def plain_transcribe(asr: Any, audio: Any, **overrides: Any) -> str:
    """faster-whisper as wyoming-faster-whisper calls it: its defaults, our beam/language."""
    segments, _info = asr.model.transcribe(
        audio,
        language="en" if asr.english_only else asr.settings.language,
        beam_size=asr.settings.beam_size,
        initial_prompt=asr.settings.initial_prompt,
        **overrides,
    )
    return " ".join(segment.text.strip() for segment in segments).strip()


def _float(pcm: bytes) -> Any:
    import numpy as np

    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| variant | candidate | clip | WER | errors / words | exact | median ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['variant']} | {row['candidate']} | {row['clip']} | "
            f"{row['wer'] * 100:.1f} % | {row['errors']} / {row['words']} | "
            f"{row['exact']}/{result['utterances']} | {row['median_ms']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import os
    import sys
    import tempfile
    from pathlib import Path

    from wyoming_pivoice.engines import AsrSettings

    from . import corpus

    parser = argparse.ArgumentParser(prog="python -m pivoice_lab.bench.wer")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--corpus-dir", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None, help="the first N utterances")
    parser.add_argument("--only", default=None, help="comma-separated variant names")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    folder = args.corpus_dir or Path(tempfile.gettempdir()) / "pivoice-wer-corpus"
    utterances = corpus.build(folder, args.limit, corpus.HOUSEHOLD)
    chosen = VARIANTS
    if args.only:
        names = set(args.only.split(","))
        chosen = tuple(v for v in VARIANTS if v.name in names)
    load = [round(x, 2) for x in os.getloadavg()]
    result = ablate(
        utterances,
        AsrSettings(threads=args.threads),
        chosen,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    result["load_average"] = {"start": load, "end": [round(x, 2) for x in os.getloadavg()]}
    print(markdown(result))
    print(f"load average {load} → {result['load_average']['end']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---- the bench's WER section: the same corpus through every path ---------------------------

PATHS = {
    "satellite": "the standalone satellite (default settings, speculation on): the first "
    "turn's transcript, through the server",
    "server": "our server on the whole clip (Wyoming, as the file is)",
    "plain": "plain faster-whisper on the whole clip: the same weights and beam/compute type, "
    "its own defaults (30 s window, no patch), in the bench process",
    "wyoming-faster-whisper": "rhasspy's server on the whole clip, same model files",
}


async def server_transcripts(uri: str, utterances: list[Any]) -> dict[str, str]:
    from .peers import asr_latency

    out = {}
    for utterance in utterances:
        _seconds, text = await asr_latency(uri, utterance.pcm())
        out[utterance.id] = text
    return out


def plain_transcripts(utterances: list[Any], settings: Any) -> dict[str, str]:
    from wyoming_pivoice.engines import WhisperAsr

    asr = WhisperAsr(settings)
    return {u.id: plain_transcribe(asr, u.samples()) for u in utterances}


async def satellite_transcripts(
    uri: str,
    utterances: list[Any],
    silence_ms: int,
    speculate_ms: int,
    timeout: float,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, str], dict[str, int]]:
    """Each utterance said once to a real satellite: the transcript of the turn it started
    (what the assistant answers), and how many turns it became (a split loses words)."""
    from .rig import Config, Rig

    rig = Rig(Config("wer", "satellite", "streaming", speculate_ms), uri, silence_ms)
    await rig.start()
    texts, turns = {}, {}
    try:
        for utterance in utterances:
            outcome = await rig.turn(utterance.pcm(), timeout)
            texts[utterance.id] = outcome.records[0]["transcript"] if outcome.records else ""
            turns[utterance.id] = len(outcome.records)
            if progress:
                progress(f"wer satellite {utterance.id}")
    finally:
        await rig.stop()
    return texts, turns


def section(utterances: list[Any], transcripts: dict[str, dict[str, str]]) -> dict[str, Any]:
    """{path: score} over the same utterances, plus the per-utterance rows."""
    scores = {
        name: score((u.id, u.text, texts.get(u.id, "")) for u in utterances)
        for name, texts in transcripts.items()
    }
    out: dict[str, Any] = {
        "what": {name: PATHS.get(name, name) for name in transcripts},
        "normaliser": "whisper-normalizer EnglishTextNormalizer + H:MM and o'clock rules",
        "overall": {
            name: {k: v for k, v in s.items() if k != "per_utterance"} for name, s in scores.items()
        },
        "per_utterance": {
            u.id: {
                "text": u.text,
                "voice": u.voice,
                **{
                    name: {
                        "hypothesis": s["per_utterance"][u.id]["hypothesis"],
                        "errors": s["per_utterance"][u.id]["errors"],
                    }
                    for name, s in scores.items()
                },
                "words": len(normalise(u.text).split()),
            }
            for u in utterances
        },
    }
    return out


def render(wer: dict[str, Any]) -> list[str]:
    from .tables import render_table

    overall = wer["overall"]
    names = list(overall)
    out = [f"Word error rate ({wer['normaliser']}):"]
    rows = [
        [
            name,
            f"{s['wer'] * 100:.1f} %" if s["wer"] is not None else "–",
            f"{s['errors']} / {s['words']}",
            f"{s['exact']}/{s['utterances']}",
        ]
        for name, s in overall.items()
    ]
    out.append(render_table(["path", "WER", "errors / words", "exact"], rows))
    if "turns" in wer:
        split = sum(1 for n in wer["turns"].values() if n != 1)
        out.append(f"  satellite: {split} utterance(s) not heard as exactly one turn")
    rows = []
    for ident, row in wer["per_utterance"].items():
        if all(row[name]["errors"] == 0 for name in names):
            continue
        rows.append(
            [
                ident,
                str(row["words"]),
                *(f"{row[n]['errors']}: {row[n]['hypothesis']}" for n in names),
            ]
        )
    if rows:
        out.append("Utterances with an error on some path (errors: transcript):")
        out.append(render_table(["utterance", "words", *names], rows))
    out.append("")
    return out
