"""What a bench run measures and how: the options `wyoming-pivoice bench` parses into."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from wyoming_pivoice.satellite import SatelliteSettings, VadSettings


@dataclass
class BenchOptions:
    rounds: int = 3
    utterances: int | None = None  # first N of the corpus
    corpus_dir: Path | None = None
    workdir: Path | None = None
    silence_ms: int = VadSettings.silence_ms
    speculate_ms: int = VadSettings.speculate_ms
    pipelines: tuple[str, ...] = ("streaming", "sequential")
    speculation_baseline: bool = True  # also streaming with speculate-ms 0
    min_clause_chars: int = SatelliteSettings.min_clause_chars
    replay: bool = False  # also replay each turn's model compute in this process
    compute_reps: int = 2  # each replayed measurement is taken this often; the least is kept
    latency: bool = True
    peers: bool = False
    peers_venv: Path | None = None
    peer_rounds: int = 3
    knobs: bool = False
    knob_reps: int = 2
    knob_parts: tuple[str, ...] = ("asr", "llm", "tts", "overlap")
    soak: int = 0
    soak_every: int = 10
    server_args: list[str] = field(default_factory=list)
    satellite_args: list[str] = field(default_factory=list)  # the room's satellite (--room)
    server_uri: str | None = None  # a server already running, instead of starting one
    warmup: bool = True  # one untimed turn per pipeline first
    realtime_playback: bool = False
    turn_timeout: float = 120.0
    room: bool = False  # the satellite process in simulated echoing rooms
    # targets (issue #20's rooms) | grid | shared-clock | wide | chained | all
    room_cases: str = "targets"
    room_rounds: int = 1  # each room's script this often (5 replies, 2 barge-ins a round)
    load: int = 0  # busy processes beside the room runs and the knobs
    wer: bool = False  # word error rate of every ASR path on the household corpus
