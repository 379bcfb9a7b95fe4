"""Faults under a running satellite: the server killed mid-turn and restarted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from .helpers import REPO, free_port, spawn_server
from .test_satellite_standalone import silence, spoken, words


def test_server_killed_mid_turn_is_reported_and_the_satellite_comes_back(tmp_path: Path) -> None:
    first = spoken("What time is it in Paris?", tmp_path / "first.wav")
    second = spoken("Turn on the garden lights.", tmp_path / "second.wav")
    (tmp_path / "first.raw").write_bytes(silence(0.3) + first + silence(1.0))
    # 3 VAD frames: however often it repeats, the second question meets the same frame grid
    (tmp_path / "gap.raw").write_bytes(silence(0.096))
    (tmp_path / "second.raw").write_bytes(second + silence(1.5))
    go = tmp_path / "go"
    # The mic: the first question, silence until the test says go, then the second.
    mic = (
        f"cat {tmp_path}/first.raw; while [ ! -f {go} ]; do cat {tmp_path}/gap.raw; done; "
        f"cat {tmp_path}/second.raw"
    )
    log = tmp_path / "turns.jsonl"
    port = free_port()
    server = spawn_server(port)
    sat = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wyoming_pivoice",
            "--log-level",
            "DEBUG",
            "satellite",
            "--server",
            f"tcp://127.0.0.1:{port}",
            "--mic-command",
            mic,
            "--snd-wav",
            str(tmp_path / "reply{n}.wav"),
            "--timing-log",
            str(log),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    endpoint = threading.Event()
    lines: list[str] = []

    def watch() -> None:
        assert sat.stderr is not None
        for line in sat.stderr:
            lines.append(line)
            if "Turn 1: endpoint" in line:
                endpoint.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        assert endpoint.wait(60), "".join(lines[-30:])
        server.kill()  # mid-turn: ASR or the LLM is running for turn 1
        server.wait()
        server = spawn_server(port)
        back = time.monotonic()
        go.touch()
        assert sat.wait(180) == 0, "".join(lines[-30:])
    finally:
        go.touch()
        sat.kill()
        server.terminate()
        server.wait(10)

    turns = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(turns) == 2, turns
    assert turns[0]["error"], "the interrupted turn must be reported"
    assert turns[1]["error"] is None
    heard = words(turns[1]["transcript"])
    assert "garden" in heard and heard & {"light", "lights"}, turns[1]["transcript"]
    assert turns[1]["reply"] and turns[1]["stamps"]["first_played"]
    # The second turn started with speech heard after the server came back.
    assert turns[1]["stamps"]["speech_start"] > back
