"""The server's compute log: what each model load and each request cost, as JSON lines.

One object per line, stamped with `time.monotonic()` (the one clock every process on the
machine reads alike, and the clock of the satellite's turn stamps; the wall clock can be
stepped under a running process):

    {"at": ..., "event": "load", "kind": "asr"|"llm"|"tts"|"vad", "model": ..., "seconds": ...}
    {"at": ..., "event": "compute", "kind": "asr"|"llm"|"tts", "request": ..., "model": ...,
     "seconds": ..., "first": ..., "tokens_in": ..., "tokens_out": ..., "audio_seconds": ...}

    {"at": ..., "event": "knowledge", "passages": [...], "scores": [...], "tokens": ...,
     "found": ..., "seconds": ...}

`at` is when the load or request ended; `first` the seconds to the first token (LLM) or the
first audio (TTS). Token counts are the model's own: the prompt as its tokenizer reads it,
and the pieces it generated (one per token); null where the engine cannot count them
exactly (a remote engine). A knowledge record (--knowledge) is a turn's retrieval: the
passages put in its prompt (`file#heading`, never their text), their BM25 scores, the
prompt tokens they take and how many matched before fitting. The bench reads this file
(`read`), never the human log.

Like `logging`, there is one log per process: the server's `--compute-log PATH` opens it
(`open_log`), the code that times a model records into `current()`, and without a path
recording does nothing.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

KINDS = ("asr", "llm", "tts", "vad")


@dataclass(frozen=True)
class Load:
    at: float
    kind: str
    model: str
    seconds: float


@dataclass(frozen=True)
class Compute:
    at: float
    kind: str
    request: str
    model: str
    seconds: float
    first: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    audio_seconds: float | None = None


@dataclass(frozen=True)
class Knowledge:
    at: float
    passages: list[str]
    scores: list[float]
    tokens: int
    found: int
    seconds: float


class ComputeLog:
    """Appends records to `path` (flushed line by line); records nothing without a path.

    Loads are recorded from loader threads and requests from the event loop: writes are
    serialised by a lock.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._file: TextIO | None = None
        self._lock = threading.Lock()
        self._requests = itertools.count(1)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 — kept open

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def record_load(self, kind: str, model: str, seconds: float) -> None:
        self._write({"event": "load", "kind": kind, "model": model, "seconds": round(seconds, 4)})

    def record_compute(
        self,
        kind: str,
        model: str,
        seconds: float,
        first: float | None = None,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        audio_seconds: float | None = None,
    ) -> None:
        """One request's model time (`seconds` in all); its request id is numbered here."""
        if self._file is None:
            return
        self._write(
            {
                "event": "compute",
                "kind": kind,
                "request": str(next(self._requests)),
                "model": model,
                "seconds": round(seconds, 4),
                "first": None if first is None else round(first, 4),
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
                "audio_seconds": None if audio_seconds is None else round(audio_seconds, 3),
            }
        )

    def record_knowledge(
        self, passages: list[str], scores: list[float], tokens: int, seconds: float, found: int
    ) -> None:
        """One turn's retrieval from the household's notes (server/knowledge.py)."""
        self._write(
            {
                "event": "knowledge",
                "passages": passages,
                "scores": scores,
                "tokens": tokens,
                "found": found,
                "seconds": round(seconds, 5),
            }
        )

    def prompt_tokens(self, engine: Any, messages: list[dict[str, str]]) -> int | None:
        """The prompt's tokens by the engine's own tokenizer (None: not logging, or an engine
        that only estimates them). Runs where the engine is held (its worker thread)."""
        tokens = getattr(engine, "prompt_tokens", None)  # the local llama.cpp engine's
        if self._file is None or tokens is None:
            return None
        return len(tokens(messages))

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = json.dumps({"at": round(time.monotonic(), 6), **record})
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def model_name(engine: Any) -> str:
    """An engine's model name (`name`; a test's stand-in engine may have none)."""
    return str(getattr(engine, "name", type(engine).__name__))


_current = ComputeLog()


def open_log(path: str | Path | None) -> ComputeLog:
    """Make the process's compute log write to `path` (None: record nothing)."""
    global _current
    _current.close()
    _current = ComputeLog(path)
    return _current


def current() -> ComputeLog:
    """The process's compute log (a no-op until `open_log` gives it a path)."""
    return _current


def read(path: Path) -> list[Load | Compute]:
    """The load and compute records of a compute log; a line still being written (no newline
    yet) is left out."""
    records: list[Load | Compute] = []
    for event, data in _lines(path):
        if event == "load":
            records.append(Load(**data))
        elif event == "compute":
            records.append(Compute(**data))
    return records


def read_knowledge(path: Path) -> list[Knowledge]:
    """The knowledge records of a compute log (one per turn with --knowledge)."""
    return [Knowledge(**data) for event, data in _lines(path) if event == "knowledge"]


def _lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        data = json.loads(line)
        lines.append((data.pop("event"), data))
    return lines
