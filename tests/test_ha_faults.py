"""Home Assistant mode under faults, through the real satellite process (issue #13).

Each test drives one freeze or abuse, then runs a normal pipeline on the same process:
the satellite streams real speech (its own VAD finds it), and plays a real spoken reply
through a `--snd-command` speaker, byte for byte, and says `played`. The microphone is a
shell command (as in the README) that speaks each time the test drops a `go` file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
import wave
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from wyoming.audio import AudioChunk, AudioStart
from wyoming.info import Describe
from wyoming.ping import Ping
from wyoming.satellite import RunSatellite
from wyoming.server import AsyncServer

from wyoming_pivoice.audio.mic import WavSource
from wyoming_pivoice.audio.speaker import PRIMER_SECONDS, NullSink
from wyoming_pivoice.satellite import ha_connection
from wyoming_pivoice.satellite.endpoint import Endpointer
from wyoming_pivoice.satellite.ha import HaSatellite
from wyoming_pivoice.satellite.settings import SatelliteSettings, VadSettings

from .helpers import (
    ALSA_VANISHING_MIC,
    FakeHomeAssistant,
    alsa_home,
    assert_all_gone,
    assert_covers_speech,
    cue,
    free_port,
    make_speech,
    mic_on_cue,
    read_wav,
    spawn_satellite,
    until,
    wait_for_port,
)


def as_played(reply: bytes, rate: int = 22050) -> bytes:
    """What a speaker command receives: 10 ms of silence first (the sink's primer), then it."""
    return bytes(round(rate * PRIMER_SECONDS) * 2) + reply


@dataclass
class Voice:
    """A spoken command for the mic, and a spoken reply for the speaker (22050 Hz)."""

    command: bytes
    reply: bytes


@pytest.fixture(scope="module")
def voice(tmp_path_factory: pytest.TempPathFactory) -> Voice:
    folder = tmp_path_factory.mktemp("voice")
    command = make_speech("Turn on the kitchen lights please.", folder / "command.wav")
    reply = make_speech(
        "The kitchen lights are on.", folder / "reply.wav", rate=22050, pad_before=0.1,
        pad_after=0.1,
    )  # fmt: skip
    return Voice(read_wav(command)[0], read_wav(reply)[0])


@dataclass
class Sat:
    proc: subprocess.Popen
    port: int
    log: Path
    folder: Path

    def speak(self) -> None:
        """The mic says the command once (it reads silence otherwise)."""
        cue(self.folder)

    def text(self) -> str:
        return self.log.read_text()

    def outputs(self) -> list[Path]:
        return sorted(self.folder.glob("out-*.raw"), key=lambda p: int(p.stem.split("-")[1]))

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)


def mic_command(folder: Path, voice: Voice, die_after: int = 0) -> str:
    """Silence, and the command each time `go` appears. With `die_after`, its first life
    writes that many bytes and dies (exit 3); the satellite restarts it."""
    loop = mic_on_cue(folder, voice.command)
    died = folder / "died"
    if not die_after:
        return loop
    noise = folder / "noise.raw"
    noise.write_bytes(os.urandom(die_after))
    return f"if [ ! -e {died} ]; then touch {died}; cat {noise}; exit 3; fi; {loop}"


def speaker_command(folder: Path, hang_first: int = 0) -> str:
    """Writes each reply to out-N.raw; the first `hang_first` replies it takes nothing and
    never ends (a stuck player), like the checker's speakers."""
    return f"if [ {{n}} -le {hang_first} ]; then exec sleep 1000; fi; cat > {folder}/out-{{n}}.raw"


@contextlib.contextmanager
def ha_satellite(
    tmp_path: Path,
    voice: Voice,
    *extra: str,
    hang_first: int = 0,
    mic_dies_after: int = 0,
    mic_device: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Sat]:
    mic = ["--mic-device", mic_device] if mic_device else []
    mic = mic or ["--mic-command", mic_command(tmp_path, voice, mic_dies_after)]
    port = free_port()
    log = tmp_path / "satellite.log"
    out = open(log, "w")  # noqa: SIM115
    proc = spawn_satellite(
        "--uri", f"tcp://127.0.0.1:{port}", "--no-zeroconf",
        *mic, "--snd-command", speaker_command(tmp_path, hang_first), *extra,
        stdout=out, env=env,
    )  # fmt: skip
    sat = Sat(proc, port, log, tmp_path)
    try:
        wait_for_port(port, proc=proc)
        yield sat
    finally:
        left = sat.descendants() if proc.poll() is None else []
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for child in left:
            with contextlib.suppress(psutil.Error):
                child.kill()
        out.close()


async def normal_pipeline(sat: Sat, voice: Voice, ha: FakeHomeAssistant) -> None:
    """A whole run on an HA connection that has sent run-satellite: speech streamed, the
    reply played exactly, `played` at its end."""
    before = len(sat.outputs())
    sat.speak()
    stream = await ha.receive_stream()
    padded = bytes(32000) + voice.command + bytes(32000)  # the mic's silence is zeros
    assert_covers_speech(stream.pcm, padded)
    await ha.pipeline_events("turn on the kitchen lights please")
    await ha.send_reply(voice.reply, 22050)
    await ha.read_until("played", timeout=30)
    outputs = sat.outputs()
    assert len(outputs) > before
    assert outputs[-1].read_bytes() == as_played(voice.reply)  # the newest reply, all of it


async def connect(sat: Sat) -> FakeHomeAssistant:
    ha = FakeHomeAssistant(sat.port)
    await ha.__aenter__()
    await ha.send(RunSatellite().event())
    ha.keep_pinging()
    return ha


@contextlib.asynccontextmanager
async def connected(sat: Sat) -> AsyncIterator[FakeHomeAssistant]:
    """Home Assistant on the satellite (run-satellite sent, pinging) for the block."""
    ha = await connect(sat)
    try:
        yield ha
    finally:
        await ha.__aexit__()


async def pipeline_on_a_new_connection(sat: Sat, voice: Voice) -> None:
    async with connected(sat) as ha:
        await normal_pipeline(sat, voice, ha)


# ---- freeze 1: HA leaves just as a reply starts; a speaker that hangs -------------------


async def test_ha_leaving_as_a_reply_starts_never_freezes_it(tmp_path: Path, voice: Voice) -> None:
    with ha_satellite(tmp_path, voice) as sat:
        for _ in range(3):
            ha = await connect(sat)
            sat.speak()
            await ha.receive_stream()
            await ha.pipeline_events("turn on the kitchen lights please")
            await ha.send(AudioStart(rate=22050, width=2, channels=1).event())
            await ha.send(
                AudioChunk(rate=22050, width=2, channels=1, audio=voice.reply[:2048]).event()
            )
            await ha.__aexit__()  # gone, mid-reply
        await pipeline_on_a_new_connection(sat, voice)
        assert sat.proc.poll() is None


async def test_a_speaker_that_hangs_is_killed_and_the_next_reply_plays(
    tmp_path: Path, voice: Voice
) -> None:
    with ha_satellite(tmp_path, voice, hang_first=1) as sat:
        async with connected(sat) as ha:
            sat.speak()
            await ha.receive_stream()
            await ha.pipeline_events("turn on the kitchen lights please")
            sent = time.monotonic()
            await ha.send_reply(voice.reply, 22050)
            # Meanwhile the satellite answers, and its clock runs: `played` comes once the
            # reply's length plus the speaker's margin (2 s) has passed, not never.
            await ha.send(Describe().event())
            await ha.read_until("info", timeout=2)
            await ha.read_until("played", timeout=30)
            waited = time.monotonic() - sent
            assert waited < len(voice.reply) / 44100 + 4.0, waited
            assert not [p for p in sat.descendants() if "sleep" in " ".join(p.cmdline())]
            await normal_pipeline(sat, voice, ha)
    # With a 4 KiB pipe the hung command stops taking audio before the reply is written.
    assert re.search(r"stopped taking audio|did not finish the reply in time", sat.text())


# ---- a mic command that dies mid-sample -------------------------------------------------


async def test_a_mic_command_dying_at_an_odd_byte_count_keeps_samples_aligned(
    tmp_path: Path, voice: Voice
) -> None:
    with ha_satellite(tmp_path, voice, mic_dies_after=1001) as sat:
        async with connected(sat) as ha:
            await wait_for_line(sat, "Microphone command exited with 3")
            # Shifted by a byte, speech is noise to the VAD: no run would ever start.
            await normal_pipeline(sat, voice, ha)
        assert "Microphone command ended mid-sample" in sat.text()


async def test_a_mic_device_that_vanishes_and_comes_back(tmp_path: Path, voice: Voice) -> None:
    """PortAudio through an ALSA stand-in device that fails like a pulled USB mic (see
    test_audio_io); the satellite reopens it and the device's speech runs a pipeline."""
    infile, pidfile, present = tmp_path / "in.raw", tmp_path / "sink.pid", tmp_path / "present"
    infile.write_bytes(bytes(32000) + voice.command + bytes(64000))
    present.touch()
    env = alsa_home(
        tmp_path, ALSA_VANISHING_MIC.format(pidfile=pidfile, present=present, infile=infile)
    )
    with ha_satellite(tmp_path, voice, mic_device="pivoicemic", env=env) as sat:
        async with connected(sat) as ha:
            stream = await ha.receive_stream()  # the device's speech, first time round
            assert_covers_speech(stream.pcm, infile.read_bytes())
            await ha.pipeline_events("turn on the kitchen lights please")
            await ha.send_reply(voice.reply, 22050)
            await ha.read_until("played")
            present.unlink()  # unplugged …
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            await wait_for_line(sat, "Microphone device failed", count=2)
            present.touch()  # … and back: its audio starts again from the beginning
            stream = await ha.receive_stream()
            assert_covers_speech(stream.pcm, infile.read_bytes())
            await ha.pipeline_events("turn on the kitchen lights please")
            await ha.send_reply(voice.reply, 22050)
            await ha.read_until("played")
        assert sat.outputs()[-1].read_bytes() == as_played(voice.reply)


# ---- abuse: huge frames, many connections, a peer that holds the satellite ---------------


async def test_a_huge_frame_is_refused_before_it_is_read(tmp_path: Path, voice: Voice) -> None:
    with ha_satellite(tmp_path, voice) as sat:
        await pipeline_on_a_new_connection(sat, voice)  # everything loaded and warm
        rss_before = psutil.Process(sat.proc.pid).memory_info().rss
        reader, writer = await asyncio.open_connection("127.0.0.1", sat.port)
        header = b'{"type": "audio-chunk", "payload_length": 1073741824}\n'
        writer.write(header + bytes(1 << 20))  # the first MiB of the "gigabyte"
        refused = await asyncio.wait_for(reader.readline(), 5)
        assert b'"error"' in refused
        body = await asyncio.wait_for(reader.read(4096), 5)
        assert b"frame-too-large" in body
        writer.close()
        rss_after = psutil.Process(sat.proc.pid).memory_info().rss
        print(f"RSS under a 1 GiB frame: {rss_before / 2**20:.0f} → {rss_after / 2**20:.0f} MiB")
        assert rss_after - rss_before < 16 * 2**20
        await pipeline_on_a_new_connection(sat, voice)


async def test_idle_connections_cannot_lock_home_assistant_out(
    tmp_path: Path, voice: Voice
) -> None:
    with ha_satellite(tmp_path, voice) as sat:
        idle = [await asyncio.open_connection("127.0.0.1", sat.port) for _ in range(300)]
        # Home Assistant's describe (it gives it one second) is answered …
        started = time.monotonic()
        ha = FakeHomeAssistant(sat.port)
        await ha.__aenter__()
        info = await asyncio.wait_for(ha.describe(), 1.0)
        assert info.satellite is not None
        print(f"describe behind 300 idle connections: {time.monotonic() - started:.3f} s")
        # … the satellite holds only a few sockets, and a pipeline runs.
        assert psutil.Process(sat.proc.pid).num_fds() < 60
        await ha.send(RunSatellite().event())
        ha.keep_pinging()
        try:
            await normal_pipeline(sat, voice, ha)
        finally:
            await ha.__aexit__()
        for _, writer in idle:
            writer.close()


async def test_a_peer_that_does_not_ping_loses_the_satellite_to_home_assistant(
    tmp_path: Path, voice: Voice
) -> None:
    with ha_satellite(tmp_path, voice) as sat:
        squatter = FakeHomeAssistant(sat.port)
        await squatter.__aenter__()
        await squatter.send(RunSatellite().event())  # and never a ping
        await squatter.describe()  # it has the satellite now
        started = time.monotonic()
        while True:  # HA retries its connection, as it does after a `busy`
            ha = FakeHomeAssistant(sat.port)
            await ha.__aenter__()
            await ha.send(Ping().event(), RunSatellite().event(), Describe().event())
            await ha.read_until("pong")
            answer = await ha.read()
            while answer is not None and answer.type not in ("info", "error"):
                answer = await ha.read()
            if answer is not None and answer.type == "info":
                break
            await ha.__aexit__()
            assert time.monotonic() - started < 15, "HA never got the satellite"
            await asyncio.sleep(1.0)  # HA's reconnect delay
        print(f"HA had the satellite after {time.monotonic() - started:.1f} s")
        ha.keep_pinging()
        try:
            await normal_pipeline(sat, voice, ha)
        finally:
            await ha.__aexit__()
            await squatter.__aexit__()
        assert re.search(r"takes over \(no ping", sat.text())


# ---- stopping: SIGTERM in each state, within 1 s, nothing left behind --------------------


STATES = ["idle", "listening", "streaming", "waiting", "responding", "stuck-speaker", "sigint"]


@pytest.mark.parametrize("state", STATES)
async def test_sigterm_stops_it_in_every_state(tmp_path: Path, voice: Voice, state: str) -> None:
    with ha_satellite(tmp_path, voice, hang_first=1 if state == "stuck-speaker" else 0) as sat:
        ha = None
        if state != "idle":
            ha = await connect(sat)
        if state in ("streaming", "waiting", "responding", "stuck-speaker"):
            sat.speak()
            await ha.read_until("audio-start")  # type: ignore[union-attr]
            if state == "streaming":
                await ha.read_until("audio-chunk")  # type: ignore[union-attr]
            else:
                await ha.read_until("audio-stop")  # type: ignore[union-attr]
        if state in ("responding", "stuck-speaker"):
            await ha.pipeline_events("turn on the kitchen lights please")  # type: ignore[union-attr]
            await ha.send_reply(voice.reply * 4, 22050)  # type: ignore[union-attr]
            await wait_for_line(sat, "Speaker command started")
        elif state in ("listening", "sigint"):
            await wait_for_line(sat, "Microphone command started")
        children = sat.descendants()
        started = time.monotonic()
        sat.proc.send_signal(signal.SIGINT if state == "sigint" else signal.SIGTERM)
        code = await asyncio.to_thread(sat.proc.wait, 10)
        took = time.monotonic() - started
        print(f"SIGTERM while {state}: stopped in {took * 1000:.0f} ms")
        if ha is not None:
            with contextlib.suppress(ConnectionError):
                await ha.__aexit__()
        assert code == 0, sat.text()[-3000:]
        assert took < 1.0, took
        text = sat.text()
        assert "Traceback" not in text and "Event loop is closed" not in text, text[-3000:]
        assert_all_gone(children)


async def wait_for_line(sat: Sat, needle: str, timeout: float = 20.0, count: int = 1) -> None:
    await until(lambda: sat.text().count(needle) >= count, f"{needle!r} in the log", timeout)


async def test_a_silent_connection_is_closed_at_its_idle_deadline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, voice: Voice
) -> None:
    """In process, with the 30 s deadline shortened: a connection that says nothing gets
    `idle` and is closed; HA's connection, which pings, is not."""
    monkeypatch.setattr(ha_connection, "IDLE_TIMEOUT", 0.5)
    port = free_port()
    uri = f"tcp://127.0.0.1:{port}"
    sat = HaSatellite(
        SatelliteSettings(uri=uri), WavSource(write_silence(tmp_path / "mic.wav")),
        NullSink(), Endpointer(VadSettings()),
    )  # fmt: skip
    serving = asyncio.create_task(sat.serve(AsyncServer.from_uri(uri)))
    try:
        await asyncio.to_thread(wait_for_port, port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        ha = FakeHomeAssistant(port)
        await ha.__aenter__()
        for _ in range(3):  # HA's describe-and-ping keeps it alive past the deadline
            await ha.send(Ping().event())
            await ha.read_until("pong")
            await asyncio.sleep(0.3)  # HA's pace: the pings span the idle deadline
        error = await asyncio.wait_for(reader.read(4096), 5)
        assert b'"error"' in error and b"idle" in error
        assert await asyncio.wait_for(reader.read(4096), 5) == b""  # closed
        await ha.describe()
        await ha.__aexit__()
        writer.close()
    finally:
        sat.stop()
        await serving


def write_silence(path: Path, seconds: float = 30.0) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setframerate(16000)
        wav.setsampwidth(2)
        wav.setnchannels(1)
        wav.writeframes(bytes(int(seconds * 16000) * 2))
    return path
