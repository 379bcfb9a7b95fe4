"""One clock per turn: monotonic stamps at each step, figures from them, one JSON line per turn.

Stages stamp a shared `TurnClock`; nobody adds stage times up by hand. The JSON keys
are read by `wyoming-pivoice bench`, so they are part of the interface.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

_LOGGER = logging.getLogger(__name__)

STAMPS = (
    "speech_start",  # first voiced frame
    "last_voiced",  # last voiced frame before the endpoint
    "speculation_start",  # ASR started early on the silence so far (null: not speculated)
    "endpoint",  # the silence window passed: end of speech declared
    "endpoint_heard",  # …and the turn loop got it (later than `endpoint` if the loop lags)
    "transcript",  # transcript received
    "llm_first_token",
    "llm_done",
    "tts_request",  # first phrase sent to TTS
    "tts_first_audio",
    "first_played",  # first sample of the reply went to the speaker
    "barge_in",  # the user's speech stopped the reply
    "playback_done",
)


# What the satellite logs and records per turn ("ms"): a subset of `stages`.
FIGURES = ("asr", "llm_first_token", "tts_first_audio", "e2e_from_last_voiced", "e2e_from_endpoint")


def ms(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start) * 1000.0, 1)


def stages(stamps: dict[str, float | None], speculation_used: bool) -> dict[str, float | None]:
    """The stage durations of one turn in ms, from its monotonic stamps (None: not reached).

    The ASR ran from the speculation start when that run was kept, else from the endpoint.
    """
    s = stamps
    asr_start = s.get("speculation_start") if speculation_used else s.get("endpoint")
    return {
        "endpoint_wait": ms(s.get("last_voiced"), s.get("endpoint")),
        "asr": ms(asr_start, s.get("transcript")),
        "asr_after_endpoint": ms(s.get("endpoint"), s.get("transcript")),
        "llm_first_token": ms(s.get("transcript"), s.get("llm_first_token")),
        "first_phrase": ms(s.get("llm_first_token"), s.get("tts_request")),
        "tts_first_audio": ms(s.get("tts_request"), s.get("tts_first_audio")),
        "play_start": ms(s.get("tts_first_audio"), s.get("first_played")),
        "e2e_from_endpoint": ms(s.get("endpoint"), s.get("first_played")),
        "e2e_from_last_voiced": ms(s.get("last_voiced"), s.get("first_played")),
    }


@dataclass
class TurnClock:
    turn: int
    mode: str = "streaming"
    silence_window_ms: int = 300
    speculate_ms: int = 0
    stamps: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(STAMPS))
    transcript: str = ""
    reply: str = ""
    speculation_used: bool = False
    speculation_cancelled: int = 0
    interrupted: bool = False  # a barge-in stopped the reply
    error: str | None = None
    # The mic while the reply played, before and after echo cancellation (None: no AEC).
    echo: dict[str, float | None] | None = None

    def mark(self, name: str, at: float | None = None) -> float:
        """Set a stamp (now, unless `at` is given); returns it."""
        if name not in self.stamps:
            raise KeyError(f"unknown stamp {name!r}")
        value = time.monotonic() if at is None else at
        self.stamps[name] = value
        return value

    def mark_once(self, name: str, at: float | None = None) -> None:
        """Set a stamp only the first time (e.g. the first token)."""
        if self.stamps.get(name) is None:
            self.mark(name, at)

    def fail(self, error: str) -> None:
        if self.error is None:
            self.error = error

    def figures(self) -> dict[str, float | None]:
        all_stages = stages(self.stamps, self.speculation_used)
        return {key: all_stages[key] for key in FIGURES}

    def record(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "mode": self.mode,
            "silence_window_ms": self.silence_window_ms,
            "speculate_ms": self.speculate_ms,
            "stamps": dict(self.stamps),
            "transcript": self.transcript,
            "reply": self.reply,
            "speculation": {"used": self.speculation_used, "cancelled": self.speculation_cancelled},
            "ms": self.figures(),
            "barged_in": self.interrupted,
            "echo": self.echo,
            "error": self.error,
        }

    def summary(self) -> str:
        figures = self.figures()
        parts = [f"{key}={value:.0f} ms" for key, value in figures.items() if value is not None]
        spec = "used" if self.speculation_used else "not used"
        extra = f", speculation {spec}, {self.speculation_cancelled} cancelled"
        error = f", error: {self.error}" if self.error else ""
        if self.interrupted:
            error += ", stopped by barge-in"
        if self.echo and self.echo.get("erle_db") is not None:
            extra += f", echo cancelled by {self.echo['erle_db']:.0f} dB"
        return f"Turn {self.turn} ({self.mode}): {', '.join(parts) or 'no figures'}{extra}{error}"


class TimingLog:
    """Appends one JSON line per turn to a file (and always logs the figures at info)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._file: TextIO | None = None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 — kept open

    def write(self, clock: TurnClock) -> None:
        _LOGGER.info("%s; transcript %r; reply %r", clock.summary(), clock.transcript, clock.reply)
        if self._file is None:
            return
        with self._lock:
            self._file.write(json.dumps(clock.record()) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
