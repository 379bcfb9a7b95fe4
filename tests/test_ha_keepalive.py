"""Home Assistant closes a satellite after 5 s with no event from it (assist_satellite.py's
`asyncio.timeout(_PING_TIMEOUT)` around each wait); it pings 2 s after each pong. While a
long reply plays, only pongs (and our own pings) go up: on a busy machine a late pong was
enough to be dropped mid-reply. Here the satellite plays a 20 s reply at the speaker's pace
beside processes that keep every core busy, is stopped for 3.5 s right as HA pings, and the
HA stand-in keeps HA's deadline: our own pings every 0.5 s keep the silence under 5 s."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from wyoming.satellite import RunSatellite

from .helpers import HA_PING_TIMEOUT, FakeHomeAssistant, ha_mode_satellite, until

pytestmark = pytest.mark.slow  # 20 s of real-time playback under load

BUSY = "while True: pass"
STALL_S = 3.5  # the late pong that dropped the satellite at load 28


def silence_wav(path: Path, seconds: float) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setframerate(16000)
        wav.setsampwidth(2)
        wav.setnchannels(1)
        wav.writeframes(bytes(int(seconds * 16000) * 2))
    return path


def reply(seconds: float, rate: int = 22050) -> bytes:
    """A tone that rises and falls like a voice, at HA's TTS rate."""
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * (220 + 40 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (tone * 32767).astype("<i2").tobytes()


async def stall_at_a_ping(ha: FakeHomeAssistant, pid: int) -> None:
    """The satellite gets no CPU for STALL_S from the moment HA sends a ping: with pongs
    alone HA would then hear nothing for 2 s + STALL_S (its ping goes 2 s after a pong)."""
    await until(lambda: len(ha.pong_waits) >= 2 and ha.ping_sent is not None, "an HA ping")
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(STALL_S)  # the stall itself, not synchronisation
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_long_reply_under_load_keeps_home_assistant_connected(tmp_path: Path) -> None:
    mic = silence_wav(tmp_path / "silence.wav", 40.0)
    busy = [
        subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2 * (os.cpu_count() or 2))
    ]
    try:
        with ha_mode_satellite(
            tmp_path, "--mic-wav", str(mic), "--snd-device", "null", "--snd-realtime",
        ) as sat:  # fmt: skip
            async with FakeHomeAssistant(sat.port, ping_timeout=HA_PING_TIMEOUT) as ha:
                await ha.send(RunSatellite().event())
                ha.keep_pinging()
                # An announcement: no run, 20 s of audio played at the speaker's pace.
                await ha.send_reply(reply(20.0), 22050)
                stall = asyncio.create_task(stall_at_a_ping(ha, sat.proc.pid))
                await ha.read_until("played", timeout=60)
                load = os.getloadavg()[0]
                await stall
        log = sat.log_text()
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    figures = {
        "load_1min": round(load, 1),
        "max_gap_s": round(ha.max_gap, 2),
        "satellite_pings": ha.satellite_pings,
        "pong_wait_max_s": round(max(ha.pong_waits, default=0.0), 2),
        "pongs": len(ha.pong_waits),
    }
    print(json.dumps(figures))
    assert ha.max_gap < HA_PING_TIMEOUT, (figures, log[-3000:])
    assert ha.satellite_pings >= 10, figures  # ours, each second of the 20 s
