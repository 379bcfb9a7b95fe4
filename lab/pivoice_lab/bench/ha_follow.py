"""`bench --ha-follow`: first sound of the same reply, standalone against Home Assistant mode.

Issue #21's target: in HA mode, with our server as the pipeline's agent and TTS, the first
played sample comes within 300 ms of standalone on the same reply. Each round says each
question once through three real satellite processes on one real server (faster-whisper,
SmolLM2-135M on llama.cpp, Piper: the server's embedded models), one after another:

- standalone: `satellite --server` (our VAD, the server's STT, the streamed reply, our TTS);
- HA, following: `satellite --uri … --server …` in HA mode, driven by a stand-in of HA
  2026.10's pipeline (`HaStandIn`: run-satellite, pings, our server's STT, `transcript` to
  the satellite, the turn with `context{satellite_id}`, `synthesize`, streaming TTS held as
  HA's ffmpeg holds it, 4.6 s, then unpaced), the satellite playing our streamed reply;
- HA, HA's own audio: the same without `--server` (what HA plays without the follow).

The clock is the satellite's own (--timing-log): our VAD's endpoint (the silence window is
the same in all three) to the first sample handed to the speaker (`--snd-wav --snd-realtime`).

The replies must be the same in all three, or the figure measures SmolLM2's whim: the server
runs greedy (--llm-temperature 0) and each mode asks in a conversation of its own (a new
standalone satellite, a conversation id per HA run) after a turn of other words (the same KV
cache for each: OTHER_WORDS), so the same transcript gets the same prompt and the same words.
The words are checked, not assumed: each turn keeps its transcript and reply, and the table
says in how many rounds the three modes got the same words (a transcript that differs, e.g.
speculative STT on a cut clip, would change them). The LLM's time is the real model's under
the machine's load, which the three modes of a round share: hence the per-round differences.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncClient, AsyncTcpClient
from wyoming.event import Event
from wyoming.handle import HandledStop
from wyoming.ping import Ping
from wyoming.satellite import RunSatellite
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop
from wyoming.vad import VoiceStarted, VoiceStopped

from wyoming_pivoice.compute_log import Compute

from ..ports import free_port, wait_for_port
from .servers import pivoice_server, stop, warm
from .tables import render_table

# What greedy SmolLM2-135M-Instruct Q4_1 says to whisper tiny.en's transcript of espeak-ng's
# question, with the default system prompt: "Paris is the capital of France and the largest
# city in Europe." and "The moon is a celestial body that orbits our planet. It's a breathtaking
# sight, with its own unique light and shadow. The moon has been in the sky for billions of
# years, shaping the tides on Earth." The run records what it says this time. (Questions the
# satellites' STT mishears are no use: "What is the weather like today?" came back as "What is
# not when they're like today?".)
QUESTIONS = {
    "one sentence": "Where is Paris?",
    "three sentences": "Tell me about the moon.",
}
# Asked before each timed turn so that every timed turn finds the same KV cache, the system
# prompt's. llama.cpp reuses the longest cached prefix: the same prompt twice in a row is
# reused whole, which flattered the second mode's first token (31 against 104 ms) and,
# evaluated in another batch, changed greedy SmolLM2's words ("orbits our planet" → "orbits
# Earth"). After other words the question's own tokens are evaluated afresh, as in a home.
OTHER_WORDS = "Hello."
SATELLITE_ID = "assist_satellite.kitchen_satellite"  # what HA calls "Kitchen satellite"
FFMPEG_HOLD_S = 4.6  # HA pipes a satellite's TTS through ffmpeg: nothing until this much
HA_CHUNK_BYTES = 2048
TURN_TIMEOUT_S = 120.0
MODES = ("standalone", "ha_following", "ha_own_audio")


# ---- speech and satellites -------------------------------------------------------------------


def make_question(path: Path, question: str) -> bytes:
    """The question, spoken by espeak-ng at 16 kHz (0.3 s before, 1.0 s after): raw PCM."""
    raw = path.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), question], check=True)
    subprocess.run(
        ["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(path), "pad", "0.3", "1.0"],
        check=True,
    )
    pcm = path.with_suffix(".raw")
    subprocess.run(["sox", str(path), "-t", "raw", str(pcm)], check=True)
    return pcm.read_bytes()


def mic_command(folder: Path) -> str:
    """A --mic-command: silence (3 VAD frames at a time), speech.raw once per cue file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gap.raw").write_bytes(bytes(3072))
    go = folder / "go"
    return (
        f"while :; do if [ -e {go} ]; then rm -f {go}; cat {folder}/speech.raw; "
        f"else cat {folder}/gap.raw; fi; done"
    )


def satellite_argv(*args: str) -> list[str]:
    # DEBUG: the HA-mode satellite's log says when it listens (the cue waits for that).
    return [sys.executable, "-m", "wyoming_pivoice", "--log-level", "DEBUG", "satellite", *args]


def first_sound(timing: Path, turn: int) -> dict[str, Any]:
    """The satellite's clock for its `turn`-th timing line (1-based): endpoint → first played,
    endpoint → transcript, and the transcript and reply it logged."""
    lines = [json.loads(line) for line in timing.read_text().splitlines() if line.strip()]
    record = lines[turn - 1]
    stamps = record["stamps"]
    endpoint, played, heard = stamps["endpoint"], stamps["first_played"], stamps["transcript"]
    return {
        "first_sound_ms": None if played is None else round((played - endpoint) * 1000),
        "to_transcript_ms": None if heard is None else round((heard - endpoint) * 1000),
        "transcript": record.get("transcript") or "",
        "reply": record.get("reply") or "",
    }


def words(text: str) -> list[str]:
    """A reply's words, as the ear gets them: case and punctuation aside."""
    return re.findall(r"[\w']+", text.lower())


def sentences(text: str) -> int:
    return len([s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s])


async def until(condition: Any, what: str, timeout: float = TURN_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout:.0f} s")
        await asyncio.sleep(0.05)  # polling a file: no event to wait on
    return value


# ---- Home Assistant 2026.10's side of a satellite, on our server ----------------------------


class HaStandIn:
    """One HA connection to a satellite, doing what HA 2026.10's pipeline does per run."""

    def __init__(self, satellite_port: int, server_uri: str) -> None:
        self.client = AsyncTcpClient("127.0.0.1", satellite_port)
        self.server_uri = server_uri
        self._pinger: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HaStandIn:
        await self.client.connect()
        await self.client.write_event(RunSatellite().event())

        async def pinger() -> None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                while True:
                    await asyncio.sleep(2.0)  # HA's keepalive pace, not synchronisation
                    await self.client.write_event(Ping().event())

        self._pinger = asyncio.create_task(pinger())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
        with contextlib.suppress(ConnectionError):
            await self.client.disconnect()

    async def read_until(self, kind: str) -> Event:
        return await asyncio.wait_for(self._read_until(kind), TURN_TIMEOUT_S)

    async def _read_until(self, kind: str) -> Event:
        while True:
            event = await self.client.read_event()
            if event is None:
                raise ConnectionError(f"the satellite closed before {kind}")
            if event.type == "ping":
                await self.client.write_event(Event("pong", event.data))
            elif event.type == kind:
                return event

    async def _stream(self) -> bytes:
        """The satellite's audio of the run, to its audio-stop."""
        await self._read_until("audio-start")
        pcm = bytearray()
        while True:
            event = await self.client.read_event()
            if event is None:
                raise ConnectionError("the satellite closed mid-stream")
            if event.type == "ping":
                await self.client.write_event(Event("pong", event.data))
            elif AudioChunk.is_type(event.type):
                pcm += event.payload or b""
            elif AudioStop.is_type(event.type):
                return bytes(pcm)

    async def turn(self, conversation_id: str) -> str:
        """One run: the satellite's stream, STT, the turn, TTS to the satellite; its reply."""
        pcm = await asyncio.wait_for(self._stream(), TURN_TIMEOUT_S)
        text = await self._stt(pcm)
        for event in (
            Transcribe(language="en").event(),
            VoiceStarted(timestamp=300).event(),
            VoiceStopped(timestamp=2000).event(),
            Transcript(text=text).event(),
        ):
            await self.client.write_event(event)
        context = {
            "conversation_id": conversation_id,
            "satellite_id": SATELLITE_ID,
            "device_id": "bench-device",
        }
        reply = ""
        async with AsyncClient.from_uri(self.server_uri) as server:
            await server.write_event(Event("transcript", {"text": text, "context": context}))
            while (event := await server.read_event()) is not None:
                if event.type == "handled":
                    reply = str(event.data.get("text") or "")
                    break
        await self.client.write_event(Synthesize(text=reply).event())
        await self._tts(reply)
        await self.read_until("played")
        return reply

    async def _stt(self, pcm: bytes) -> str:
        async with AsyncClient.from_uri(self.server_uri) as server:
            await server.write_event(Transcribe(language="en").event())
            await server.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            for i in range(0, len(pcm), 8192):
                chunk = AudioChunk(rate=16000, width=2, channels=1, audio=pcm[i : i + 8192])
                await server.write_event(chunk.event())
            await server.write_event(AudioStop().event())
            while (event := await server.read_event()) is not None:
                if Transcript.is_type(event.type):
                    return str(event.data.get("text") or "")
        raise ConnectionError("the server closed before its transcript")

    async def _tts(self, reply: str) -> None:
        await asyncio.wait_for(self._tts_unbounded(reply), TURN_TIMEOUT_S)

    async def _tts_unbounded(self, reply: str) -> None:
        """HA's streaming TTS of the reply, through ffmpeg's hold, to the satellite unpaced."""
        held, rate, started = bytearray(), 22050, False
        async with AsyncClient.from_uri(self.server_uri) as server:
            for event in (
                SynthesizeStart().event(),
                SynthesizeChunk(text=reply).event(),
                Synthesize(text=reply).event(),
                SynthesizeStop().event(),
            ):
                await server.write_event(event)
            while (event := await server.read_event()) is not None:
                if AudioStart.is_type(event.type) and not started:
                    rate = AudioStart.from_event(event).rate
                elif AudioChunk.is_type(event.type):
                    held += event.payload or b""
                    if not started and len(held) >= FFMPEG_HOLD_S * rate * 2:
                        started = True
                        await self.client.write_event(
                            AudioStart(rate=rate, width=2, channels=1).event()
                        )
                    if started:
                        await self._send(held, rate)
                        held.clear()
                elif event.type == "synthesize-stopped":
                    break
        if not started:
            await self.client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
        await self._send(held, rate)
        await self.client.write_event(AudioStop().event())

    async def _send(self, pcm: bytes | bytearray, rate: int) -> None:
        for i in range(0, len(pcm), HA_CHUNK_BYTES):
            chunk = AudioChunk(
                rate=rate, width=2, channels=1, audio=bytes(pcm[i : i + HA_CHUNK_BYTES])
            )
            await self.client.write_event(chunk.event())


@dataclass
class HaSatellite:
    """A satellite in HA mode for the whole bench (its timing log gets a line per turn)."""

    name: str
    port: int
    proc: subprocess.Popen
    folder: Path
    turns: int = 0

    @property
    def timing(self) -> Path:
        return self.folder / "timing.jsonl"


@contextlib.contextmanager
def ha_satellite(
    name: str, folder: Path, server_uri: str, follow: bool, silence_ms: int
) -> Iterator[HaSatellite]:
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    argv = satellite_argv(
        "--uri", f"tcp://127.0.0.1:{port}", "--no-zeroconf", "--name", "Kitchen satellite",
        "--mic-command", mic_command(folder / "mic"), "--vad-silence-ms", str(silence_ms),
        "--snd-wav", str(folder / "reply-{n}.wav"), "--snd-realtime",
        "--timing-log", str(folder / "timing.jsonl"),
        *(("--server", server_uri) if follow else ()),
    )  # fmt: skip
    with open(folder / "satellite.log", "w") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        wait_for_port(port, proc, 120.0)
        yield HaSatellite(name, port, proc, folder)
    finally:
        stop(proc)


DROPPED = "Dropping Home Assistant's audio of the reply we followed"
OURS = "Playing our server's reply to this turn (followed)"
SPECULATED = "speaking its reply as it is written (its speculation)"


async def ha_turn(
    sat: HaSatellite, server_uri: str, round_id: str, speech: bytes
) -> dict[str, Any]:
    """One turn; with what the satellite played: its WAVs (one per playback) and log lines."""
    log_before = (sat.folder / "satellite.log").read_text()
    wavs_before = len(list(sat.folder.glob("reply-*.wav")))
    log_file = sat.folder / "satellite.log"
    async with HaStandIn(sat.port, server_uri) as ha:
        # Listening on this connection (each HA connection starts paused, then run-satellite).
        await until(
            lambda: log_file.read_text().count("paused → listening") > sat.turns, "listening"
        )
        # The mic command reads speech.raw only once "go" exists: replaced whole before that.
        staged = sat.folder / "mic" / "speech.next"
        staged.write_bytes(speech)
        staged.replace(sat.folder / "mic" / "speech.raw")
        (sat.folder / "mic" / "go").touch()
        reply = await ha.turn(f"bench-{sat.name}-{round_id}")
    sat.turns += 1
    await until(
        lambda: sat.timing.exists() and len(sat.timing.read_text().splitlines()) >= sat.turns,
        "the turn's timing line",
    )
    log = log_file.read_text()[len(log_before) :]
    return {
        **first_sound(sat.timing, sat.turns),
        "ha_reply": reply,
        "playbacks": len(list(sat.folder.glob("reply-*.wav"))) - wavs_before,
        "ours_played": OURS in log,
        "has_copy_dropped": DROPPED in log,
        # Our server answered HA's turn with the reply it began at our speculative endpoint.
        "speculated": SPECULATED in log,
    }


def standalone_turn(folder: Path, mic: Path, server_uri: str, silence_ms: int, n: int) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    timing = folder / f"standalone-{n}.jsonl"
    argv = satellite_argv(
        "--server", server_uri, "--mic-wav", str(mic), "--vad-silence-ms", str(silence_ms),
        "--snd-wav", str(folder / f"standalone-{n}-{{n}}.wav"), "--snd-realtime",
        "--timing-log", str(timing), "--max-turns", "1",
    )  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=TURN_TIMEOUT_S)
    if run.returncode != 0:
        raise RuntimeError(f"standalone satellite failed: {run.stderr[-2000:]}")
    return first_sound(timing, 1)


# ---- the section ---------------------------------------------------------------------------


async def other_turn(server_uri: str) -> None:
    """A turn of OTHER_WORDS, without memory, to its end."""
    async with AsyncClient.from_uri(server_uri) as server:
        await server.write_event(Transcript(text=OTHER_WORDS).event())
        while (event := await server.read_event()) is not None:
            if HandledStop.is_type(event.type) or event.type == "error":
                return
    raise ConnectionError("the server closed before its handled-stop")


def llm_first_token_ms(records: list[Any]) -> int | None:
    """The last conversation turn's first token among a server's new compute records (a
    speculative turn that speech made void comes before the one that played)."""
    turns = [r for r in records if isinstance(r, Compute) and r.kind == "llm"]
    first = turns[-1].first if turns else None
    return None if first is None else round(first * 1000)


def run(rounds: int, workdir: Path | None, silence_ms: int) -> dict[str, Any]:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="pivoice-ha-follow-"))
    workdir.mkdir(parents=True, exist_ok=True)
    mics = {kind: workdir / f"question-{kind.split()[0]}.wav" for kind in QUESTIONS}
    speech = {kind: make_question(mics[kind], question) for kind, question in QUESTIONS.items()}
    turns: list[dict[str, Any]] = []
    began = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    # The embedded LLM, greedy: the same transcript gets the same words in every mode.
    with pivoice_server(workdir / "server.log", ["--llm-temperature", "0"]) as server:
        asyncio.run(warm(server.uri))
        model = next((r.model for r in server.compute() if getattr(r, "kind", "") == "llm"), "")
        with (
            ha_satellite("following", workdir / "ha-following", server.uri, True,
                         silence_ms) as following,
            ha_satellite("own", workdir / "ha-own", server.uri, False, silence_ms) as own,
        ):  # fmt: skip
            for n in range(rounds):
                for kind in QUESTIONS:
                    round_id = f"{n}-{kind.split()[0]}"
                    figures: dict[str, dict[str, Any]] = {}
                    for mode in MODES:
                        asyncio.run(other_turn(server.uri))
                        seen = len(server.compute())
                        if mode == "standalone":
                            got = standalone_turn(
                                workdir / "standalone", mics[kind], server.uri, silence_ms,
                                len(turns),
                            )  # fmt: skip
                        else:
                            sat = following if mode == "ha_following" else own
                            got = asyncio.run(ha_turn(sat, server.uri, round_id, speech[kind]))
                        got["llm_first_token_ms"] = llm_first_token_ms(server.compute()[seen:])
                        figures[mode] = got
                    said = {mode: words(got["reply"]) for mode, got in figures.items()}
                    same = len({tuple(w) for w in said.values()}) == 1
                    for mode, got in figures.items():
                        turns.append(
                            {
                                "round": n,
                                "kind": kind,
                                "mode": mode,
                                **got,
                                "sentences": sentences(got["reply"]),
                                "same_words": same,  # as the other two modes of this round
                                "load_1min": round(os.getloadavg()[0], 2),
                            }
                        )
                    sys.stderr.write(
                        f"ha-follow round {n + 1}/{rounds} {kind}: "
                        + ", ".join(f"{m} {g['first_sound_ms']} ms" for m, g in figures.items())
                        + ("" if same else " (NOT the same words)")
                        + f" (load {os.getloadavg()[0]:.1f})\n"
                    )
    return {
        "section": "ha_follow",
        "meta": {
            "rounds": rounds,
            "silence_window_ms": silence_ms,
            "questions": QUESTIONS,
            "llm": f"the server's embedded llama.cpp {model or 'model'}, greedy "
            "(--llm-temperature 0), the default system prompt",
            "ha": "stand-in of HA 2026.10's pipeline (our STT, the turn with satellite_id, "
            f"streaming TTS, ffmpeg's {FFMPEG_HOLD_S} s hold, unpaced audio)",
            "load_average_start": load_start,
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(time.monotonic() - began, 1),
            "workdir": str(workdir),
        },
        "turns": turns,
        "summary": summarize(turns),
    }


def summarize(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Per question: the median first sound of each mode, the median of the per-round
    differences against standalone (the same round: the load they shared), whether the modes
    got the same words, and the follow's outcome."""
    out: dict[str, Any] = {}
    for kind in QUESTIONS:
        mine = [t for t in turns if t["kind"] == kind]
        row: dict[str, Any] = {}
        for mode in MODES:
            values = [t["first_sound_ms"] for t in mine if t["mode"] == mode]
            values = [v for v in values if v is not None]
            row[mode] = {
                "median_ms": round(statistics.median(values)) if values else None,
                "min_ms": min(values, default=None),
                "max_ms": max(values, default=None),
                "n": len(values),
            }
        by_round: dict[int, dict[str, int | None]] = {}
        for t in mine:
            by_round.setdefault(t["round"], {})[t["mode"]] = t["first_sound_ms"]
        for mode in MODES[1:]:
            diffs = [
                r[mode] - r["standalone"]  # type: ignore[operator]
                for r in by_round.values()
                if r.get(mode) is not None and r.get("standalone") is not None
            ]
            row[f"{mode}_minus_standalone_ms"] = {
                "median": round(statistics.median(diffs)) if diffs else None,
                "per_round": diffs,
            }
        same = {t["round"] for t in mine if t["same_words"]}
        row["same_words_rounds"] = f"{len(same)}/{len(by_round)}"
        # Every reply heard, with the turns that said it: one entry when all agree.
        said: dict[str, list[str]] = {}
        for t in mine:
            said.setdefault(t["reply"].strip(), []).append(f"{t['mode']} {t['round'] + 1}")
        row["replies"] = said
        row["transcripts"] = sorted({t["transcript"] for t in mine})
        row["sentences"] = sorted({t["sentences"] for t in mine})
        follows = [t for t in mine if t["mode"] == "ha_following"]
        # Ours played and HA's copy dropped: one playback per turn, every turn.
        ok = sum(
            t["ours_played"] and t["has_copy_dropped"] and t["playbacks"] == 1 for t in follows
        )
        row["following_ok"] = f"{ok}/{len(follows)}"
        row["speculated"] = f"{sum(bool(t.get('speculated')) for t in follows)}/{len(follows)}"
        loads = [t["load_1min"] for t in mine]
        row["load_1min"] = [min(loads, default=0.0), max(loads, default=0.0)]
        row["to_transcript_ms"] = {
            mode: statistics.median(
                [t["to_transcript_ms"] for t in mine if t["mode"] == mode and t["to_transcript_ms"]]
                or [0]
            )
            for mode in MODES
        }
        row["llm_first_token_ms"] = {
            mode: statistics.median(
                [
                    t["llm_first_token_ms"]
                    for t in mine
                    if t["mode"] == mode and t.get("llm_first_token_ms") is not None
                ]
                or [0]
            )
            for mode in MODES
        }
        out[kind] = row
    return out


def _cell(summary: dict[str, Any]) -> str:
    return f"{summary['median_ms']} ms ({summary['min_ms']}–{summary['max_ms']}, n={summary['n']})"


def render(result: dict[str, Any]) -> str:
    meta, summary = result["meta"], result["summary"]
    lines = [
        f"wyoming-pivoice bench --ha-follow — {meta['rounds']} rounds; silence window "
        f"{meta['silence_window_ms']} ms; load {meta['load_average_start'][0]} → "
        f"{meta['load_average_end'][0]}; took {meta['seconds']:.0f} s",
        f"LLM: {meta['llm']}; HA: {meta['ha']}",
        "First sound: the satellite's VAD endpoint → first played sample (medians, min–max).",
        "",
    ]
    rows = []
    for kind, row in summary.items():
        follow = row["ha_following_minus_standalone_ms"]
        own_diff = row["ha_own_audio_minus_standalone_ms"]["median"]
        rows.append(
            [
                kind,
                _cell(row["standalone"]),
                _cell(row["ha_following"]),
                _cell(row["ha_own_audio"]),
                f"{follow['median']:+d} ms" if follow["median"] is not None else "-",
                ", ".join(f"{d:+d}" for d in follow["per_round"]),
                f"{own_diff:+d} ms" if own_diff is not None else "-",
                row["same_words_rounds"],
                row["following_ok"],
                row.get("speculated", "-"),
                f"{row['load_1min'][0]:.1f}–{row['load_1min'][1]:.1f}",
            ]
        )
    lines.append(
        render_table(
            [
                "question",
                "standalone",
                "HA, following",
                "HA, HA's own audio",
                "following − standalone (median per round)",
                "per round",
                "own audio − standalone",
                "same words, 3 modes (rounds)",
                "ours played, HA's dropped",
                "answered by our speculation",
                "load",
            ],
            rows,
        )
    )
    lines.append("")
    for kind, row in summary.items():
        question = meta.get("questions", {}).get(kind, kind)
        llm = ", ".join(f"{m} {v:.0f}" for m, v in row["llm_first_token_ms"].items())
        lines.append(
            f"{kind}: asked {question!r}, heard {' / '.join(map(repr, row['transcripts']))}; "
            f"LLM first token (median ms): {llm}"
        )
        replies = row["replies"]
        if len(replies) == 1:
            [reply] = replies
            count = "/".join(map(str, row["sentences"]))
            noun = "sentence" if row["sentences"] == [1] else "sentences"
            lines.append(f"  every turn said ({count} {noun}, {len(reply)} chars): {reply!r}")
        else:  # said, not hidden: the figure then compares different replies
            lines.append(f"  NOT the same reply in every turn ({len(replies)} different):")
            for reply, where in replies.items():
                lines.append(f"    {', '.join(where)}: {reply!r}")
    return "\n".join(lines) + "\n"
