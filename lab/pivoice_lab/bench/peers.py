"""Side by side with what Home Assistant users run today: wyoming-faster-whisper, wyoming-piper.

Nothing is installed here. Where the peers are importable (by this interpreter, or in a
venv given with --peers-venv, or as executables on PATH) they are started on loopback on
the very model files our server uses, and both servers get the same requests:

- ASR: the same utterance audio (as the satellite would send it at the endpoint); the
  clock runs from `audio-stop` to the `transcript` event.
- TTS: the same three-sentence replies with a plain `synthesize`; the clock runs from the
  request to the first `audio-chunk`, and for the peer also to its `audio-stop` (a
  non-streaming client such as Home Assistant's plain TTS plays nothing before). Ours
  is also timed as our satellite asks for it (the first phrase on its own), since that
  is what the user hears first.

Requests alternate between the two servers so drift and warm-up hit both alike.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize

from wyoming_pivoice.audio import float_to_pcm16
from wyoming_pivoice.engines import AsrSettings
from wyoming_pivoice.models import EMBEDDED_VOICE, resolve_whisper
from wyoming_pivoice.text import split_all

from . import servers
from .corpus import RATE, Utterance

_LOGGER = logging.getLogger(__name__)

CHUNK_SAMPLES = 512  # what our satellite sends per audio-chunk

THREE_SENTENCE_REPLIES = (
    "The kitchen lights are on now. I set them to a warm white at eighty percent. "
    "Tell me if you want them brighter.",
    "It is twenty one degrees in the living room right now. The heating will switch off at "
    "ten tonight. Tomorrow should be a little warmer.",
    "Your timer for ten minutes has started. I will ring when it is done. You can ask me how "
    "much time is left at any moment.",
    "Paris is the capital city of France. It lies on the river Seine in the north of the "
    "country. About two million people live in the city itself.",
)


@dataclass(frozen=True)
class PeerCommand:
    name: str
    argv: list[str]  # how to start it, before our options
    where: str


def find_peer(module: str, executable: str, venv: Path | None) -> PeerCommand | None:
    """The peer's entry point: a --peers-venv, this interpreter, then PATH."""
    if venv is not None:
        python = venv / "bin" / "python"
        if (venv / "bin" / executable).is_file() and python.is_file():
            return PeerCommand(executable, [str(python), "-m", module], str(venv))
    if importlib.util.find_spec(module) is not None:
        return PeerCommand(executable, [sys.executable, "-m", module], sys.prefix)
    found = shutil.which(executable)
    if found:
        return PeerCommand(executable, [found], found)
    return None


def endpoint_audio(utterance: Utterance, prespeech_s: float = 0.3, pad_s: float = 0.1) -> bytes:
    """What our satellite sends for an utterance: the speech, a little before and after it."""
    samples = utterance.samples()
    start = max(0, int((utterance.speech_start_s - prespeech_s) * RATE))
    end = min(samples.size, int((utterance.speech_end_s + pad_s) * RATE))
    return float_to_pcm16(samples[start:end])


async def asr_latency(uri: str, pcm: bytes) -> tuple[float, str]:
    """Seconds from audio-stop to the transcript, and the transcript."""
    host, port = uri.removeprefix("tcp://").rsplit(":", 1)
    async with AsyncTcpClient(host, int(port)) as client:
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        step = CHUNK_SAMPLES * 2
        for offset in range(0, len(pcm), step):
            await client.write_event(
                AudioChunk(
                    rate=RATE, width=2, channels=1, audio=pcm[offset : offset + step]
                ).event()
            )
        await asyncio.sleep(0.1)  # let the server take the audio in: we time what follows the stop
        await client.write_event(AudioStop().event())
        start = time.monotonic()
        while True:
            event = await asyncio.wait_for(client.read_event(), 120)
            if event is None:
                raise ConnectionError("server closed before the transcript")
            if Error.is_type(event.type):
                raise RuntimeError(f"ASR error: {Error.from_event(event).text}")
            if Transcript.is_type(event.type):
                return time.monotonic() - start, Transcript.from_event(event).text


async def tts_timing(uri: str, texts: list[str]) -> tuple[float, float]:
    """Seconds from the first `synthesize` to the first audio-chunk, and to the last
    `audio-stop` (all the audio: when a non-streaming client can play it), one
    `synthesize` per text."""
    host, port = uri.removeprefix("tcp://").rsplit(":", 1)
    async with AsyncTcpClient(host, int(port)) as client:
        start = time.monotonic()
        for text in texts:
            await client.write_event(Synthesize(text=text).event())
        first: float | None = None
        stops = 0
        while stops < len(texts):
            event = await asyncio.wait_for(client.read_event(), 120)
            if event is None:
                raise ConnectionError("server closed before the audio ended")
            if Error.is_type(event.type):
                raise RuntimeError(f"TTS error: {Error.from_event(event).text}")
            if AudioChunk.is_type(event.type) and first is None:
                first = time.monotonic() - start
            elif AudioStop.is_type(event.type):
                stops += 1
        assert first is not None
        return first, time.monotonic() - start


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def _rss_mb(peer: servers.Child) -> float | None:
    sample = peer.sample()
    return round(sample.rss_mb, 1) if sample is not None else None


async def _alternate(rounds: int, calls: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    results: dict[str, list[Any]] = {name: [] for name in calls}
    names = list(calls)
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            results[name].append(await calls[name]())
    return results


def run(
    utterances: list[Utterance],
    pivoice_uri: str,
    workdir: Path,
    venv: Path | None,
    asr: AsrSettings,
    min_clause_chars: int,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Start whichever peers are installed and time them against our server."""
    report: dict[str, Any] = {}
    whisper = find_peer("wyoming_faster_whisper", "wyoming-faster-whisper", venv)
    piper = find_peer("wyoming_piper", "wyoming-piper", venv)
    threads = asr.threads or os.cpu_count() or 1
    if whisper is None:
        report["asr"] = {"status": "not installed: pip install wyoming-faster-whisper"}
    else:
        port = servers.free_port()
        argv = _whisper_argv(whisper, port, workdir, asr, threads)
        try:
            with servers.child(
                "wyoming-faster-whisper", argv, port, workdir / "faster-whisper.log"
            ) as peer:
                report["asr"] = asyncio.run(
                    _compare_asr(utterances, pivoice_uri, peer.uri, rounds, progress)
                )
                report["asr"].update(
                    peer=whisper.where,
                    argv=argv[len(whisper.argv) :],
                    peer_rss_mb=_rss_mb(peer),
                )
        except Exception as err:  # a peer that will not start is reported, not fatal
            _LOGGER.exception("wyoming-faster-whisper failed")
            report["asr"] = {"status": f"failed: {err}", "peer": whisper.where}
    if piper is None:
        report["tts"] = {"status": "not installed: pip install wyoming-piper"}
    else:
        port = servers.free_port()
        voice = EMBEDDED_VOICE.locate()
        argv = [
            *piper.argv,
            "--uri",
            f"tcp://127.0.0.1:{port}",
            "--voice",
            voice.stem,
            "--data-dir",
            str(voice.parent),
        ]
        try:
            with servers.child("wyoming-piper", argv, port, workdir / "piper.log") as peer:
                report["tts"] = asyncio.run(
                    _compare_tts(pivoice_uri, peer.uri, rounds, min_clause_chars, progress)
                )
                report["tts"].update(
                    peer=piper.where,
                    argv=argv[len(piper.argv) :],
                    peer_rss_mb=_rss_mb(peer),
                )
        except Exception as err:
            _LOGGER.exception("wyoming-piper failed")
            report["tts"] = {"status": f"failed: {err}", "peer": piper.where}
    return report


def _whisper_argv(
    whisper: PeerCommand, port: int, workdir: Path, asr: AsrSettings, threads: int
) -> list[str]:
    data_dir = Path(tempfile.mkdtemp(prefix="fw-data-", dir=workdir))
    return [
        *whisper.argv,
        "--uri",
        f"tcp://127.0.0.1:{port}",
        "--model",
        resolve_whisper(asr.model),
        "--data-dir",
        str(data_dir),
        "--local-files-only",
        "--language",
        asr.language or "en",
        "--beam-size",
        str(asr.beam_size),
        "--compute-type",
        asr.compute_type,
        "--cpu-threads",
        str(threads),
    ]


def whisper_transcripts(
    utterances: list[Utterance], workdir: Path, venv: Path | None, asr: AsrSettings
) -> dict[str, Any]:
    """wyoming-faster-whisper's transcript of each whole clip (for the WER section), or why
    there is none: {"status", "texts"}."""
    whisper = find_peer("wyoming_faster_whisper", "wyoming-faster-whisper", venv)
    if whisper is None:
        return {"status": "not installed: pip install wyoming-faster-whisper"}
    port = servers.free_port()
    argv = _whisper_argv(whisper, port, workdir, asr, asr.threads or os.cpu_count() or 1)
    try:
        with servers.child(
            "wyoming-faster-whisper", argv, port, workdir / "faster-whisper-wer.log"
        ) as peer:

            async def all_texts() -> dict[str, str]:
                return {u.id: (await asr_latency(peer.uri, u.pcm()))[1] for u in utterances}

            return {"status": "ok", "texts": asyncio.run(all_texts()), "peer": whisper.where}
    except Exception as err:  # a peer that will not start is reported, not fatal
        _LOGGER.exception("wyoming-faster-whisper failed")
        return {"status": f"failed: {err}", "peer": whisper.where}


async def _compare_asr(
    utterances: list[Utterance],
    ours: str,
    peer: str,
    rounds: int,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    # One warm-up each: first calls pay for lazy initialisation.
    warm = endpoint_audio(utterances[0])
    await asr_latency(ours, warm)
    await asr_latency(peer, warm)
    per_utterance: dict[str, Any] = {}
    ratios = []
    all_ours: list[float] = []
    all_peer: list[float] = []
    for utterance in utterances:
        pcm = endpoint_audio(utterance)
        results = await _alternate(
            rounds,
            {
                "pivoice": partial(asr_latency, ours, pcm),
                "peer": partial(asr_latency, peer, pcm),
            },
        )
        ours_s = [seconds for seconds, _ in results["pivoice"]]
        peer_s = [seconds for seconds, _ in results["peer"]]
        all_ours += ours_s
        all_peer += peer_s
        ratio = statistics.median(ours_s) / statistics.median(peer_s)
        ratios.append(ratio)
        per_utterance[utterance.id] = {
            "pivoice_ms": _median_ms(ours_s),
            "peer_ms": _median_ms(peer_s),
            "ratio": round(ratio, 3),
            "pivoice_text": results["pivoice"][0][1],
            "peer_text": results["peer"][0][1],
        }
        if progress:
            progress(f"peers asr {utterance.id}")
    return {
        "status": "ok",
        "what": "seconds from audio-stop to transcript, same audio, same model files",
        "pivoice_ms": {"median": _median_ms(all_ours), "p90": _p90_ms(all_ours)},
        "peer_ms": {"median": _median_ms(all_peer), "p90": _p90_ms(all_peer)},
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_of_medians": round(statistics.median(all_ours) / statistics.median(all_peer), 3),
        "per_utterance": per_utterance,
    }


async def _compare_tts(
    ours: str, peer: str, rounds: int, min_clause_chars: int, progress: Callable[[str], None] | None
) -> dict[str, Any]:
    await tts_timing(ours, ["Warming up."])
    await tts_timing(peer, ["Warming up."])
    rows = []
    for text in THREE_SENTENCE_REPLIES:
        first_phrase = split_all(text, min_clause_chars)[0]
        results = await _alternate(
            rounds,
            {
                "pivoice_plain": partial(tts_timing, ours, [text]),
                "pivoice_first_phrase": partial(tts_timing, ours, [first_phrase]),
                "peer": partial(tts_timing, peer, [text]),
            },
        )
        row: dict[str, Any] = {"text": text, "first_phrase": first_phrase}
        for name, timings in results.items():
            row[name] = [first for first, _all in timings]
        row["peer_complete"] = [complete for _first, complete in results["peer"]]
        rows.append(row)
        if progress:
            progress("peers tts")
    names = ("pivoice_plain", "pivoice_first_phrase", "peer", "peer_complete")
    out: dict[str, Any] = {
        "status": "ok",
        "what": "seconds from the request to the first audio-chunk of a three-sentence reply; "
        "peer: plain synthesize (it splits sentences itself); peer_complete: the same "
        "request to its audio-stop, when a non-streaming client (Home Assistant's plain "
        "TTS builds the whole WAV) can start playing; pivoice_plain: the same request to "
        "us; pivoice_first_phrase: what our satellite sends first (the first phrase, "
        f"clauses cut at >= {min_clause_chars} chars)",
    }
    for name in names:
        values = [v for row in rows for v in row[name]]
        out[f"{name}_ms"] = {"median": _median_ms(values), "p90": _p90_ms(values)}
    for versus, suffix in (("peer", ""), ("peer_complete", "_vs_complete")):
        base = statistics.median([v for row in rows for v in row[versus]])
        for name in ("pivoice_plain", "pivoice_first_phrase"):
            values = [v for row in rows for v in row[name]]
            out[f"ratio_{name}{suffix}"] = round(statistics.median(values) / base, 3)
    out["replies"] = [
        {
            "text": row["text"],
            "first_phrase": row["first_phrase"],
            **{f"{name}_ms": _median_ms(row[name]) for name in names},
        }
        for row in rows
    ]
    return out


def _p90_ms(values: list[float]) -> float:
    return round(float(np.percentile(values, 90)) * 1000, 1)
