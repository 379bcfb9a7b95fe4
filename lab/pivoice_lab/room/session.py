"""The real satellite process in a simulated room: used by the tests and `bench --room`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from .acoustics import RoomAcoustics
from .simulator import Room, Say


@dataclass
class RoomRun:
    room: Room
    turns: list[dict]  # the satellite's timing log, one record per turn
    log: str  # what the satellite printed
    settled: bool  # the room fell quiet (False: the time limit ended the run)


async def run_satellite_in_room(
    server: str,
    script: list[Say],
    acoustics: RoomAcoustics,
    workdir: Path,
    *extra: str,
    quiet_s: float = 4.0,
    limit_s: float = 60.0,
    stuck_s: float | None = None,
    log_level: str = "DEBUG",
    during: Callable[[Room, asyncio.subprocess.Process], Awaitable[None]] | None = None,
    record: bool = False,
) -> RoomRun:
    """Run `wyoming-pivoice satellite --server SERVER` with its speaker and microphone in the
    room, until the script has been said and no reply has played for `quiet_s` (or until
    `limit_s`, or until the room has been quiet `stuck_s` with the script waiting on a reply
    that never came: the satellite heard nothing in a turn); then stop it with SIGTERM.
    `during(room, process)` runs beside it (a test that stops the process for a while);
    `record` keeps the room's recordings (Room)."""
    workdir.mkdir(parents=True, exist_ok=True)
    timing = workdir / "timing.jsonl"
    timing.unlink(missing_ok=True)
    log_path = workdir / "satellite.log"
    async with Room(acoustics, script, record=record) as room:
        with open(log_path, "w") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "wyoming_pivoice", "--log-level", log_level, "satellite",
                "--server", server,
                "--mic-command", room.mic_command, "--snd-command", room.speaker_command,
                "--timing-log", str(timing), *extra,
                stdout=log, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
            try:

                def quiet() -> bool:
                    since = room.quiet_since
                    if since is None:
                        return False
                    if room.user_done():
                        return room.now - since >= quiet_s
                    return (
                        stuck_s is not None
                        and room.now - since >= stuck_s
                        # every line still to say waits on a reply (a timed one comes anyway)
                        and all(say.at is None for say in script if say.onset is None)
                    )

                side = asyncio.ensure_future(during(room, proc)) if during else None
                settled = await room.wait_for(quiet, limit_s)
                if side is not None:
                    await side
            finally:
                if proc.returncode is None:
                    proc.terminate()
                    try:
                        await asyncio.wait_for(proc.wait(), 10)
                    except asyncio.TimeoutError:
                        proc.kill()
                        await proc.wait()
    turns = (
        [json.loads(line) for line in timing.read_text().splitlines()] if timing.exists() else []
    )
    return RoomRun(room, turns, log_path.read_text(), settled)
