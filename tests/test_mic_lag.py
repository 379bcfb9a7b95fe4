"""The microphone's timeline keeps no lag (issue #21 item 4): the satellite process is stopped
for 1.5 s (SIGSTOP/SIGCONT) while its microphone command keeps recording; the utterance two
seconds later must reach the turn loop on time, not 1.5 s late as it did when the pace's
timeline moved to "now" after each late read.

The real satellite process with its real VAD, its microphone a `--mic-command` in the room;
no server is needed (the turn's transcription fails fast and the turn is still recorded)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import numpy as np

from pivoice_lab.ports import refused_port
from pivoice_lab.room.acoustics import RoomAcoustics
from pivoice_lab.room.session import run_satellite_in_room
from pivoice_lab.room.simulator import Room, Say

from .helpers import make_speech, read_wav

STALL_S = 1.5
AFTER_S = 2.0
QUIET_ROOM = RoomAcoustics(echo_db=-20, delay_ms=20, tail_ms=0, noise_dbfs=-60, seed=3)


async def test_the_mic_catches_up_after_the_process_was_stopped(tmp_path: Path) -> None:
    wav = make_speech("Turn on the kitchen lights please.", tmp_path / "q.wav",
                      voice="en-us", speed=150, pad_before=0.0, pad_after=0.0)  # fmt: skip
    audio = np.frombuffer(read_wav(wav)[0], dtype="<i2").astype(np.float32) / 32768
    stall_at = 2.0
    say = Say("kitchen", audio, at=stall_at + STALL_S + AFTER_S)
    stopped: list[float] = []

    async def stall(room: Room, proc: asyncio.subprocess.Process) -> None:
        assert await room.wait_for(
            lambda: room.mic_opened is not None and room.now >= room.mic_opened + stall_at, 30
        )
        os.kill(proc.pid, signal.SIGSTOP)
        stopped.append(room.now)
        try:
            await room.wait_for(lambda: room.now >= stopped[0] + STALL_S, 10)
        finally:
            os.kill(proc.pid, signal.SIGCONT)

    with refused_port() as port:
        run = await run_satellite_in_room(
            f"tcp://127.0.0.1:{port}", [say], QUIET_ROOM, tmp_path, "--server-retry-s", "0.2",
            quiet_s=3.0, limit_s=40, during=stall,
        )  # fmt: skip
    assert stopped, run.log[-3000:]
    assert say.onset is not None
    turns = [t for t in run.turns if t["stamps"].get("endpoint_heard")]
    assert len(turns) == 1, run.log[-3000:]
    stamps = turns[0]["stamps"]
    speech_end = say.onset + say.seconds
    # The endpoint comes the silence window (300 ms) after the voice's last frame; the
    # turn loop hears it within a few frames of that, not STALL_S later.
    heard = stamps["endpoint_heard"] - speech_end
    assert heard < 0.3 + 0.3, (heard, run.log[-3000:])
    # The capture clock put the speech where the room said it: on time, not late.
    assert abs(stamps["speech_start"] - say.onset) < 0.3, (stamps, say.onset)
    print(f"endpoint heard {heard * 1000:.0f} ms after the voice ended (window 300 ms); "
          f"loop lag {(stamps['endpoint_heard'] - stamps['endpoint']) * 1000:.0f} ms")  # fmt: skip


async def test_a_line_waiting_on_a_reply_that_never_comes_ends_the_run(tmp_path: Path) -> None:
    """The bench's room (bench/room.py STUCK_S): a turn that makes no reply (here the server
    refuses) leaves the next line waiting; the run ends once the room has been quiet
    `stuck_s`, the line unsaid, instead of waiting out its limit."""
    wav = make_speech("Turn on the kitchen lights please.", tmp_path / "q.wav",
                      voice="en-us", speed=150, pad_before=0.0, pad_after=0.0)  # fmt: skip
    audio = np.frombuffer(read_wav(wav)[0], dtype="<i2").astype(np.float32) / 32768
    asked, over = Say("kitchen", audio, at=0.5), Say("again", audio, reply=1)
    with refused_port() as port:
        run = await run_satellite_in_room(
            f"tcp://127.0.0.1:{port}", [asked, over], QUIET_ROOM, tmp_path,
            "--server-retry-s", "0.2", quiet_s=60.0, limit_s=120, stuck_s=3.0,
        )  # fmt: skip
    assert run.settled and asked.onset is not None and over.onset is None, run.log[-3000:]
    assert [t for t in run.turns if t["stamps"].get("endpoint_heard")], run.log[-3000:]
    assert not run.room.replies
    assert run.room.mic_opened is not None
    assert run.room.now - run.room.mic_opened < 20, run.log[-3000:]
