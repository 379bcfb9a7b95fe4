"""`bench --ha-follow`: first sound of the same reply, standalone against Home Assistant mode.

Issue #21's target: in HA mode, with our server as the pipeline's agent and TTS, the first
played sample comes within 300 ms of standalone on the same reply. Each round says each
question once through three real satellite processes on one real server (faster-whisper,
Piper), one after another:

- standalone: `satellite --server` (our VAD, the server's STT, the streamed reply, our TTS);
- HA, following: `satellite --uri … --server …` in HA mode, driven by a stand-in of HA
  2026.10's pipeline (`HaStandIn`: run-satellite, pings, our server's STT, `transcript` to
  the satellite, the turn with `context{satellite_id}`, `synthesize`, streaming TTS held as
  HA's ffmpeg holds it, 4.6 s, then unpaced), the satellite playing our streamed reply;
- HA, HA's own audio: the same without `--server` (what HA plays without the follow).

The clock is the satellite's own (--timing-log): our VAD's endpoint (the silence window is
the same in all three) to the first sample handed to the speaker (`--snd-wav --snd-realtime`).

The replies must be the same in all three, or the figure measures SmolLM2's whim: the server's
conversation runs on a fixed-reply engine (`FixedReply`, the OpenAI API on loopback, through
the server's own remote-LLM client: --llm-url), which streams the given reply a word at a time
at a stated pace. That engine is a stand-in for the LLM ONLY; STT and TTS are the real models,
and the LLM's time is the same in all three modes by construction, so the difference is the
pipeline's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncClient, AsyncTcpClient
from wyoming.event import Event
from wyoming.ping import Ping
from wyoming.satellite import RunSatellite
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop
from wyoming.vad import VoiceStarted, VoiceStopped

from ..ports import free_port, wait_for_port
from .servers import pivoice_server, stop, warm
from .tables import render_table

REPLIES = {
    "one sentence": "The kitchen lights are on now, and the front door is locked.",
    "three sentences": (
        "The kitchen lights are on now. The front door is locked, and the heating is set "
        "to twenty degrees. Have a good evening, and call me if you need anything else."
    ),
}
QUESTION = "Turn on the kitchen lights and lock the front door please."
FIRST_TOKEN_S = 0.15  # the fixed-reply engine's pace: SmolLM2-135M's first token here
WORD_S = 0.03  # … and a word (≈ 1.3 tokens at 22 ms a token, measured on this machine)
SATELLITE_ID = "assist_satellite.kitchen_satellite"  # what HA calls "Kitchen satellite"
FFMPEG_HOLD_S = 4.6  # HA pipes a satellite's TTS through ffmpeg: nothing until this much
HA_CHUNK_BYTES = 2048
TURN_TIMEOUT_S = 120.0
MODES = ("standalone", "ha_following", "ha_own_audio")


# ---- the fixed-reply engine (an LLM stand-in on the OpenAI API) ----------------------------


class FixedReply:
    """OpenAI-compatible chat completions on loopback that stream `reply` a word at a time."""

    def __init__(self) -> None:
        self.reply = next(iter(REPLIES.values()))
        self.port = free_port()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                return

            def _json(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._json({"object": "list", "data": [{"id": "fixed", "object": "model"}]})
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                # A client that leaves mid-reply (a warm-up, a cut turn) ends it here.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._complete()

            def _complete(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if not self.path.endswith("/chat/completions"):
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
                time.sleep(FIRST_TOKEN_S)  # the engine's pace, not synchronisation
                words = owner.reply.split(" ")
                for n, word in enumerate(words):
                    self._event({"content": word if n == 0 else " " + word}, None)
                    time.sleep(WORD_S)
                self._event({}, "stop")
                self.wfile.write(b"data: [DONE]\n\n")

            def _event(self, delta: dict[str, str], finish: str | None) -> None:
                chunk = {
                    "id": "fixed",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "fixed",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FixedReply:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---- speech and satellites -------------------------------------------------------------------


def make_question(path: Path) -> bytes:
    """The question, spoken by espeak-ng at 16 kHz (0.3 s before, 1.0 s after): raw PCM."""
    raw = path.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), QUESTION], check=True)
    subprocess.run(
        ["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(path), "pad", "0.3", "1.0"],
        check=True,
    )
    pcm = path.with_suffix(".raw")
    subprocess.run(["sox", str(path), "-t", "raw", str(pcm)], check=True)
    return pcm.read_bytes()


def mic_command(folder: Path, speech: bytes) -> str:
    """A --mic-command: silence (3 VAD frames at a time), the question once per cue file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "speech.raw").write_bytes(speech)
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
    endpoint → transcript, and the reply it logged."""
    lines = [json.loads(line) for line in timing.read_text().splitlines() if line.strip()]
    record = lines[turn - 1]
    stamps = record["stamps"]
    endpoint, played, heard = stamps["endpoint"], stamps["first_played"], stamps["transcript"]
    return {
        "first_sound_ms": None if played is None else round((played - endpoint) * 1000),
        "to_transcript_ms": None if heard is None else round((heard - endpoint) * 1000),
        "reply": record.get("reply") or "",
    }


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
    name: str, folder: Path, speech: bytes, server_uri: str, follow: bool, silence_ms: int
) -> Iterator[HaSatellite]:
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    argv = satellite_argv(
        "--uri", f"tcp://127.0.0.1:{port}", "--no-zeroconf", "--name", "Kitchen satellite",
        "--mic-command", mic_command(folder / "mic", speech), "--vad-silence-ms", str(silence_ms),
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


async def ha_turn(sat: HaSatellite, server_uri: str, round_id: str) -> dict[str, Any]:
    """One turn; with what the satellite played: its WAVs (one per playback) and log lines."""
    log_before = (sat.folder / "satellite.log").read_text()
    wavs_before = len(list(sat.folder.glob("reply-*.wav")))
    log_file = sat.folder / "satellite.log"
    async with HaStandIn(sat.port, server_uri) as ha:
        # Listening on this connection (each HA connection starts paused, then run-satellite).
        await until(
            lambda: log_file.read_text().count("paused → listening") > sat.turns, "listening"
        )
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


def run(rounds: int, workdir: Path | None, silence_ms: int) -> dict[str, Any]:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="pivoice-ha-follow-"))
    workdir.mkdir(parents=True, exist_ok=True)
    mic = workdir / "question.wav"
    speech = make_question(mic)
    turns: list[dict[str, Any]] = []
    began = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    with FixedReply() as llm:
        extra = ["--llm-url", llm.url, "--llm-remote-model", "fixed", "--llm-concurrency", "1"]
        with pivoice_server(workdir / "server.log", extra) as server:
            asyncio.run(warm(server.uri))
            with (
                ha_satellite("following", workdir / "ha-following", speech, server.uri, True,
                             silence_ms) as following,
                ha_satellite("own", workdir / "ha-own", speech, server.uri, False,
                             silence_ms) as own,
            ):  # fmt: skip
                for n in range(rounds):
                    for kind, reply in REPLIES.items():
                        llm.reply = reply
                        round_id = f"{n}-{kind.split()[0]}"
                        figures = {
                            "standalone": standalone_turn(
                                workdir / "standalone", mic, server.uri, silence_ms, len(turns)
                            ),
                            "ha_following": asyncio.run(ha_turn(following, server.uri, round_id)),
                            "ha_own_audio": asyncio.run(ha_turn(own, server.uri, round_id)),
                        }
                        for mode, got in figures.items():
                            turns.append(
                                {
                                    "round": n,
                                    "kind": kind,
                                    "mode": mode,
                                    **got,
                                    "same_reply": got["reply"].strip() == reply,
                                    "load_1min": round(os.getloadavg()[0], 2),
                                }
                            )
                        sys.stderr.write(
                            f"ha-follow round {n + 1}/{rounds} {kind}: "
                            + ", ".join(f"{m} {g['first_sound_ms']} ms" for m, g in figures.items())
                            + f" (load {os.getloadavg()[0]:.1f})\n"
                        )
    return {
        "section": "ha_follow",
        "meta": {
            "rounds": rounds,
            "silence_window_ms": silence_ms,
            "question": QUESTION,
            "replies": REPLIES,
            "llm": f"fixed reply (OpenAI API stand-in): first word {FIRST_TOKEN_S * 1000:.0f} ms, "
            f"then {WORD_S * 1000:.0f} ms a word",
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
    """Per reply: the median first sound of each mode, and the median of the per-round
    differences against standalone (the same round: the load they shared)."""
    out: dict[str, Any] = {}
    for kind in REPLIES:
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
        row["same_reply_all"] = all(t["same_reply"] for t in mine)
        follows = [t for t in mine if t["mode"] == "ha_following"]
        # Ours played and HA's copy dropped: one playback per turn, every turn.
        ok = sum(
            t["ours_played"] and t["has_copy_dropped"] and t["playbacks"] == 1 for t in follows
        )
        row["following_ok"] = f"{ok}/{len(follows)}"
        loads = [t["load_1min"] for t in mine]
        row["load_1min"] = [min(loads, default=0.0), max(loads, default=0.0)]
        row["to_transcript_ms"] = {
            mode: statistics.median(
                [t["to_transcript_ms"] for t in mine if t["mode"] == mode and t["to_transcript_ms"]]
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
        follow_diff = row["ha_following_minus_standalone_ms"]["median"]
        own_diff = row["ha_own_audio_minus_standalone_ms"]["median"]
        rows.append(
            [
                kind,
                _cell(row["standalone"]),
                _cell(row["ha_following"]),
                _cell(row["ha_own_audio"]),
                f"{follow_diff:+d} ms" if follow_diff is not None else "-",
                f"{own_diff:+d} ms" if own_diff is not None else "-",
                "yes" if row["same_reply_all"] else "NO",
                row["following_ok"],
                f"{row['load_1min'][0]:.1f}–{row['load_1min'][1]:.1f}",
            ]
        )
    lines.append(
        render_table(
            [
                "reply",
                "standalone",
                "HA, following",
                "HA, HA's own audio",
                "following − standalone (median per round)",
                "own audio − standalone",
                "same reply",
                "ours played, HA's dropped",
                "load",
            ],
            rows,
        )
    )
    return "\n".join(lines) + "\n"
