"""Microphone sources and speaker sinks: files, commands, stdin, PortAudio (ALSA file plugin)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import psutil
import pytest
from wyoming.audio import AudioFormat

from wyoming_pivoice.audio.mic import (
    CHUNK_BYTES,
    CHUNK_SECONDS,
    CommandSource,
    WavSource,
    open_source,
    read_wav_16k,
)
from wyoming_pivoice.audio.speaker import PRIMER_SECONDS, CommandSink, NullSink, WavSink
from wyoming_pivoice.satellite.settings import MicSettings

from .helpers import ALSA_FILE_DEVICES, ALSA_VANISHING_MIC, REPO, alsa_home, until, write_wav


def tone(seconds: float, rate: int = 16000, freq: float = 440.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()


async def read_all(source) -> list[bytes]:
    await source.open()
    chunks = []
    try:
        while (chunk := await source.read()) is not None:
            chunks.append(chunk)
    finally:
        await source.close()
    return chunks


async def test_wav_source_chunks_and_pads(tmp_path: Path) -> None:
    pcm = tone(1.01)  # not a whole number of chunks
    chunks = await read_all(WavSource(write_wav(tmp_path / "a.wav", pcm), realtime=False))
    assert all(len(c) == CHUNK_BYTES for c in chunks)
    assert len(chunks) == -(-len(pcm) // CHUNK_BYTES)
    joined = b"".join(chunks)
    assert joined[: len(pcm)] == pcm and set(joined[len(pcm) :]) == {0}


async def test_wav_source_converts_other_formats(tmp_path: Path) -> None:
    stereo = np.repeat(np.frombuffer(tone(0.5, rate=22050), dtype="<i2"), 2).tobytes()
    path = write_wav(tmp_path / "b.wav", stereo, rate=22050, channels=2)
    pcm = read_wav_16k(path)
    assert abs(len(pcm) - 0.5 * 32000) <= 64


async def test_realtime_wav_source_stamps_a_fixed_timeline(tmp_path: Path) -> None:
    source = WavSource(write_wav(tmp_path / "c.wav", tone(0.2)), realtime=True)
    await source.open()
    times = []
    while await source.read() is not None:
        times.append(source.chunk_time)
    await source.close()
    assert len(times) == 7
    # chunk n is "captured" n × 32 ms after the first, whatever the reader's jitter
    assert np.allclose(np.diff(times), CHUNK_SECONDS)


async def test_command_source_reads_until_a_clean_exit(tmp_path: Path) -> None:
    pcm = tone(0.7)
    raw = tmp_path / "in.raw"
    raw.write_bytes(pcm)
    source = CommandSource(f"cat {raw}", max_lead=None)
    chunks = await read_all(source)
    assert b"".join(chunks)[: len(pcm)] == pcm
    assert source.restarts == 0


async def test_command_source_restarts_a_dying_command(tmp_path: Path) -> None:
    """A mic command that dies is restarted with backoff; its second life's audio comes through."""
    pcm = tone(0.3)
    raw = tmp_path / "in.raw"
    raw.write_bytes(pcm)
    marker = tmp_path / "died-once"
    command = f"if [ -e {marker} ]; then cat {raw}; else touch {marker}; exit 3; fi"
    source = CommandSource(command, max_lead=None)
    chunks = await read_all(source)
    assert source.restarts == 1
    assert b"".join(chunks)[: len(pcm)] == pcm


async def test_stdin_source(tmp_path: Path) -> None:
    pcm = tone(0.25)
    raw = tmp_path / "in.raw"
    raw.write_bytes(pcm)
    code = (
        "import asyncio, sys\n"
        "from wyoming_pivoice.audio.mic import StdinSource\n"
        "async def main():\n"
        "    s = StdinSource(max_lead=None); await s.open(); n = 0\n"
        "    while (c := await s.read()) is not None: n += len(c)\n"
        "    await s.close(); print(n)\n"
        "asyncio.run(main())\n"
    )
    expected = -(-len(pcm) // CHUNK_BYTES) * CHUNK_BYTES
    run = [sys.executable, "-c", code]
    # a file redirected in (no pipe transport) …
    with open(raw, "rb") as stdin:
        out = subprocess.run(run, stdin=stdin, capture_output=True, cwd=REPO, check=True)
    assert int(out.stdout) == expected
    # … and a pipe
    out = subprocess.run(run, input=pcm, capture_output=True, cwd=REPO, check=True)
    assert int(out.stdout) == expected


def test_open_source_picks_the_backend(tmp_path: Path) -> None:
    assert isinstance(open_source(MicSettings(wav="x.wav")), WavSource)
    assert not open_source(MicSettings(wav="x.wav", pace="none")).realtime
    assert isinstance(open_source(MicSettings(command="cat")), CommandSource)


async def test_wav_sink_keeps_replies_at_their_rate(tmp_path: Path) -> None:
    sink = WavSink(tmp_path / "out.wav")
    first, second = tone(0.5, 22050), tone(0.25, 22050)
    for part in (first[:1000], first[1000:]):
        await sink.play(part, AudioFormat(22050, 2, 1))
    await sink.drain()
    assert sink.first_sample_at is not None
    await sink.play(second, AudioFormat(22050, 2, 1))
    await sink.drain()
    await sink.play(tone(0.1, 16000), AudioFormat(16000, 2, 1))  # another format: another file
    await sink.drain()
    await sink.close()
    with wave.open(str(tmp_path / "out.wav")) as wav:
        assert wav.getframerate() == 22050
        assert wav.readframes(wav.getnframes()) == first + second
    assert [p.name for p in sink.paths] == ["out.wav", "out-2.wav"]


async def test_wav_sink_one_file_per_reply(tmp_path: Path) -> None:
    sink = WavSink(tmp_path / "reply-{n}.wav")
    for _ in range(2):
        await sink.play(tone(0.1, 22050), AudioFormat(22050, 2, 1))
        await sink.drain()
    await sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reply-1.wav", "reply-2.wav"]


async def test_command_sink_substitutes_the_format_and_waits_for_the_command(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out-{rate}-{channels}-{bits}.raw"
    sink = CommandSink(f"sleep 0.2; cat > '{out}'")
    pcm = tone(0.3, 22050)
    await sink.play(pcm, AudioFormat(22050, 2, 1))
    await sink.drain()  # returns only once the command has taken everything and exited
    # 10 ms of silence first: the reply's clock starts when the command has read it.
    primer = bytes(round(22050 * PRIMER_SECONDS) * 2)
    assert (tmp_path / "out-22050-1-16.raw").read_bytes() == primer + pcm
    await sink.close()


async def test_stop_drops_the_rest_of_a_reply(tmp_path: Path) -> None:
    sink = NullSink(realtime=True)
    await sink.play(tone(5.0, 22050), AudioFormat(22050, 2, 1))
    await until(lambda: sink.playing, "playback", 5.0)
    await asyncio.wait_for(sink.stop(), 1.0)  # far sooner than the 5 s the reply lasts
    assert not sink.playing
    assert sink.first_sample_at is not None

    played = tmp_path / "x.raw"
    command = CommandSink(f"cat > {played}; sleep 30")
    await command.play(tone(0.1, 22050), AudioFormat(22050, 2, 1))
    drain = asyncio.create_task(command.drain())
    await until(played.exists, "speaker command", 5.0)  # its shell has opened the file
    await asyncio.sleep(0)  # and the drain task waits on the reply
    await asyncio.wait_for(command.stop(), 5.0)  # kills the command: barge-in
    await asyncio.wait_for(drain, 5.0)  # and whoever waited for the reply is released


async def test_a_command_that_dies_mid_reply_drops_the_rest_of_that_reply_only(
    tmp_path: Path,
) -> None:
    """The rest of a failed reply is dropped, not played on a command opened for it: that
    command took the next reply's {n} (CI: reply 2 went to the player meant for reply 3)."""
    starts = tmp_path / "starts"
    # Reads 1000 bytes (the primer and a piece), then exits: the next write fails.
    sink = CommandSink(f"echo {{n}} >> {starts}; head -c 1000 > /dev/null")
    fmt = AudioFormat(22050, 2, 1)
    try:
        await sink.play(tone(0.5, 22050), fmt)
        await until(lambda: not sink.playing, "the command's failure", 10.0)
        await sink.play(tone(0.5, 22050), fmt)  # more of the same reply
        await asyncio.wait_for(sink.drain(), 10.0)
        assert starts.read_text().split() == ["1"]
        await sink.play(tone(0.1, 22050), fmt)  # the next reply opens a command of its own
        await asyncio.wait_for(sink.drain(), 10.0)
        assert starts.read_text().split() == ["1", "2"]
    finally:
        await sink.close()


def test_pyaudio_source_and_sink_through_alsa_file_devices(tmp_path: Path) -> None:
    pcm = tone(0.5)
    infile, outfile = tmp_path / "in.raw", tmp_path / "out.raw"
    infile.write_bytes(pcm)
    code = (
        "import asyncio\n"
        "from wyoming.audio import AudioFormat\n"
        "from wyoming_pivoice.audio.mic import PyAudioSource\n"
        "from wyoming_pivoice.audio.speaker import ContinuousSink, PyAudioDevice\n"
        "async def main():\n"
        "    s = PyAudioSource('pivoicemic'); await s.open()\n"
        "    data = b''.join([await s.read() for _ in range(15)]); await s.close()\n"
        "    k = ContinuousSink(PyAudioDevice('pivoicespk'))\n"
        "    await k.play(data, AudioFormat(22050, 2, 1)); await k.drain()\n"
        "    print(k.first_sample_at is not None); await k.close()\n"
        "asyncio.run(main())\n"
    )
    env = alsa_home(tmp_path, ALSA_FILE_DEVICES.format(infile=infile, outfile=outfile))
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("True")
    # 15 chunks of 512 samples went in from the capture device and out to the playback one
    # (a continuous stream: silence before and after them)
    played = outfile.read_bytes()
    assert pcm[: 15 * CHUNK_BYTES] in played
    assert not played.replace(pcm[: 15 * CHUNK_BYTES], b"").strip(b"\0")


async def test_command_source_realigns_after_a_command_dies_mid_sample(tmp_path: Path) -> None:
    """A command that dies after an odd byte count must not shift later audio by a byte."""
    pcm = tone(0.3)
    raw = tmp_path / "in.raw"
    raw.write_bytes(pcm)
    marker = tmp_path / "died-once"
    for first_life in (1001, 2049):  # less than a chunk, and two chunks and a byte
        marker.unlink(missing_ok=True)
        command = (
            f"if [ -e {marker} ]; then cat {raw}; "
            f"else touch {marker}; head -c {first_life} {raw}; exit 3; fi"
        )
        source = CommandSource(command, max_lead=None)
        joined = b"".join(await read_all(source))
        assert source.restarts == 1
        second = joined.find(pcm)
        assert second > 0 and second % 2 == 0, (first_life, second)
        samples = np.frombuffer(joined[: len(joined) // 2 * 2], dtype="<i2")
        assert np.abs(samples).max() <= 8000  # byte-swapped samples would be far louder


async def test_command_source_close_ends_the_whole_process_group(tmp_path: Path) -> None:
    """`sh -c` does not pass SIGTERM on: close must end the shell's children too."""
    pidfile = tmp_path / "child.pid"
    source = CommandSource(f"sleep 60 & echo $! > {pidfile}; cat /dev/zero", max_lead=None)
    await source.open()
    assert await source.read() is not None
    child = int(pidfile.read_text())
    started = time.monotonic()
    await source.close()
    assert time.monotonic() - started < 1.0
    deadline = time.monotonic() + 2.0  # SIGKILL is delivered, not yet necessarily acted on
    while True:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "the shell's child outlived close()"
                await asyncio.sleep(0.02)
                continue
        break


def python_with_alsa(
    tmp_path: Path, asoundrc: str, code: str, arg: Path, log: Path
) -> subprocess.Popen:
    """`python -c code arg` over the ALSA stand-in devices of `asoundrc`: its stdin and
    stdout are pipes (text), its stderr goes to `log`."""
    with open(log, "w") as err:
        return subprocess.Popen(
            [sys.executable, "-c", code, str(arg)],
            env=alsa_home(tmp_path, asoundrc), cwd=REPO, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip


PYAUDIO_UNTIL_BACK = """
import asyncio, sys
from wyoming_pivoice.audio.mic import PyAudioSource
first = open(sys.argv[1], "rb").read()[:1024]
async def main():
    source = PyAudioSource("pivoicemic")
    await source.open()
    restarts, steady, heard = 0, 0, False
    while True:
        chunk = await source.read()
        if source.restarts != restarts:
            restarts, steady, heard = source.restarts, 0, False
        steady += 1
        heard = heard or chunk == first
        if steady == 100 and restarts == 0:
            print("up", flush=True)
        if steady == 500 and restarts and heard:
            print("back", restarts, flush=True)
            break
    await source.close()
asyncio.run(main())
"""


@pytest.mark.slow  # a real-time device through ALSA, with its timeouts
def test_pyaudio_source_reopens_a_device_that_vanishes_and_comes_back(tmp_path: Path) -> None:
    """An ALSA stand-in capture device (the `file` plugin over `null`) that fails the way a
    pulled USB mic does: its data also goes to a pipe command, and while that command is
    gone every read fails with an I/O error. PortAudio reports it, the source reopens with
    backoff, and once the command stays up the device's audio (from its start) comes back."""
    infile, pidfile, present = tmp_path / "in.raw", tmp_path / "sink.pid", tmp_path / "present"
    infile.write_bytes(tone(2.0))
    present.touch()
    log = tmp_path / "stderr.log"
    asoundrc = ALSA_VANISHING_MIC.format(pidfile=pidfile, present=present, infile=infile)
    proc = python_with_alsa(tmp_path, asoundrc, PYAUDIO_UNTIL_BACK, infile, log)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up", log.read_text()[-2000:]
        present.unlink()  # unplugged
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 20
        while log.read_text().count("Microphone device failed") < 2:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        present.touch()  # plugged in again
        back = proc.stdout.readline().split()
        assert back[:1] == ["back"] and int(back[1]) >= 2, log.read_text()[-2000:]
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


STUCK_SPEAKER_ASOUNDRC = """
pcm.pivoicespk {{
    type file
    slave.pcm null
    file "|exec sh -c 'echo $$ > {pidfile}; test -e {stuck} && exec sleep 1000; exec cat > {out}'"
    format "raw"
}}
"""

PYAUDIO_TWO_REPLIES = """
import asyncio, logging, os, sys, time, traceback
import pyaudio
from wyoming.audio import AudioFormat
from wyoming_pivoice.audio.speaker import ContinuousSink, PyAudioDevice
logging.basicConfig()
async def main():
    pcm = open(sys.argv[1], "rb").read()
    sink = ContinuousSink(PyAudioDevice("pivoicespk"))
    for _ in range(2):
        started = time.monotonic()
        await sink.play(pcm, AudioFormat(22050, 2, 1))
        await sink.drain()
        print(round(time.monotonic() - started, 2), flush=True)
        sys.stdin.readline()  # the test's go-ahead
    await sink.close()
warm = pyaudio.PyAudio()  # PortAudio's start-up (devices listed once) is not the reply's
try:
    asyncio.run(main())
except BaseException:
    traceback.print_exc()
    os._exit(1)
os._exit(0)  # a thread left in a stuck device call would hold up a normal exit
"""


@pytest.mark.slow  # a real-time device through ALSA, with its timeouts
def test_the_pyaudio_speaker_gives_up_on_a_stuck_device_and_reopens_it(tmp_path: Path) -> None:
    """A playback device that stops taking audio (an ALSA stand-in whose data goes to a pipe
    command that reads nothing) costs that reply, 2 s after the device took its last piece
    and at most its length plus 2 s; the next reply opens the device again and plays whole."""
    pcm = tone(3.0, 22050)  # more than a pipe holds
    reply, out, pidfile, stuck = (tmp_path / n for n in ("reply.raw", "out.raw", "pid", "stuck"))
    reply.write_bytes(pcm)
    stuck.touch()
    log = tmp_path / "stderr.log"
    asoundrc = STUCK_SPEAKER_ASOUNDRC.format(pidfile=pidfile, stuck=stuck, out=out)
    proc = python_with_alsa(tmp_path, asoundrc, PYAUDIO_TWO_REPLIES, reply, log)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        first = float(proc.stdout.readline())
        # Fed at real time, the device stops taking it mid-reply: the margin runs from there.
        assert 2.0 <= first < 3.0 + 2.0 + 1.0, first
        stuck.unlink()
        os.kill(int(pidfile.read_text()), signal.SIGKILL)  # frees the abandoned thread
        proc.stdin.write("\n")
        proc.stdin.flush()
        second = float(proc.stdout.readline())
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert "the speaker device stopped taking audio" in log.read_text()
    assert second < 3.0 + 2.0  # played at real time, well inside its bound
    played = out.read_bytes()  # a continuous stream: silence before and after the reply
    assert pcm in played and not played.replace(pcm, b"").strip(b"\0")


async def test_the_speaker_stream_stays_open_across_replies(tmp_path: Path) -> None:
    """Continuous playout: one speaker command for every reply, silence written between
    them, and the echo canceller's reference is exactly what the command was given. A
    barge-in kills the command (what it holds would play on) and the next reply opens it
    anew."""
    from wyoming_pivoice.audio.speaker import CommandDevice, ContinuousSink

    sink = ContinuousSink(CommandDevice(f"exec cat > '{tmp_path}'/played-$$.raw"))
    taps: list[bytes] = []
    cuts: list[float] = []

    class Tap:
        def reference(self, pcm: bytes, fmt: AudioFormat, due: float) -> None:
            taps.append(pcm)

        def cut(self, at: float) -> None:
            cuts.append(at)

    sink.tap = Tap()
    fmt = AudioFormat(22050, 2, 1)
    first, second = tone(0.3, 22050), tone(0.2, 22050)
    await sink.play(first, fmt)
    await sink.drain()
    assert sink.first_sample_at is not None
    await sink.play(second, fmt)
    await sink.drain()
    assert not cuts  # replies that end by themselves leave the stream as it is
    long = tone(5.0, 22050)
    await sink.play(long, fmt)
    await until(lambda: sink.playing, "playback", 5.0)
    before_stop = b"".join(taps)
    await asyncio.wait_for(sink.stop(), 1.0)  # a barge-in: the rest of the reply is dropped
    assert len(cuts) == 1
    await sink.play(second, fmt)  # the next reply: a new command
    await sink.drain()
    await sink.close()
    assert sink.replies == 4
    files = sorted(tmp_path.glob("played-*.raw"), key=lambda f: f.read_bytes().find(first) < 0)
    assert len(files) == 2
    played, again = (f.read_bytes() for f in files)
    primer = bytes(round(22050 * PRIMER_SECONDS) * 2)
    # What the first command played is what the reference got, up to the kill (a killed
    # command's pipe is lost: it may have played less). Silence aside: when the speaker
    # thread comes late, the reference gets the underrun's silence, which a device plays
    # as time but `cat` never sees (seen at load 23).
    assert (primer + b"".join(taps)).replace(b"\0", b"").startswith(played.replace(b"\0", b""))
    assert len(played) >= len(primer) + len(before_stop) - 8192  # at most the pipe lost
    start = played.index(first)
    assert played.find(second, start + len(first) + 2) > start + len(first)  # silence between
    assert len(played) < len(first) + len(second) + len(long)  # the stop dropped audio
    assert again.startswith(primer) and second in again


async def test_a_barge_in_cuts_a_reply_once(tmp_path: Path) -> None:
    """The audio core's policy says INTERRUPT on every chunk of the voice until the loop has
    taken the utterance (a late loop: five calls for one barge-in at load ~40): only the
    first call cuts, so only it is logged and counted."""
    from wyoming_pivoice.audio.speaker import CommandDevice, ContinuousSink

    sink = ContinuousSink(CommandDevice("exec cat > /dev/null"))
    fmt = AudioFormat(22050, 2, 1)
    assert not sink.cut(hold=True)  # nothing plays yet
    await sink.play(tone(5.0, 22050), fmt)
    await until(lambda: sink.playing, "playback", 5.0)
    assert sink.cut(hold=True)
    assert not sink.cut(hold=True)
    assert sink.take_cut() is not None
    await asyncio.wait_for(sink.stop(), 1.0)
    await sink.close()


def counting(seconds: float, rate: int) -> bytes:
    """A reply whose every sample says where it is in the reply (1, 2, 3, …; never 0)."""
    return (np.arange(int(seconds * rate)) % 32000 + 1).astype("<i2").tobytes()


def positions(path: Path) -> np.ndarray:
    """The reply's sample positions a speaker command played, silence left out."""
    samples = np.frombuffer(path.read_bytes(), dtype="<i2")
    return samples[samples != 0].astype(np.int64) - 1


class HoldTap:
    """The echo canceller's part in a hold and a cut, as the sink calls it."""

    def __init__(self) -> None:
        self.holds: list[float] = []
        self.barge_ins = 0

    def reference(self, pcm: bytes, fmt: AudioFormat, due: float) -> None:
        pass

    def cut(self, at: float) -> None:
        raise AssertionError("a held reply's cut is the barge-in, not another cut")

    def hold(self, at: float) -> None:
        self.holds.append(at)

    def barge_in(self) -> None:
        self.barge_ins += 1


async def test_a_held_reply_plays_on_where_it_stopped(tmp_path: Path) -> None:
    """A hold (a voice over the reply, maybe) kills the speaker command — silence at once —
    and keeps the reply; its release opens the command anew and the rest plays: the second
    command starts no later in the reply than where the first stopped, and plays it out."""
    from wyoming_pivoice.audio.speaker import CommandDevice, ContinuousSink

    sink = ContinuousSink(CommandDevice(f"exec cat > '{tmp_path}'/played-$$.raw"))
    tap = sink.tap = HoldTap()
    fmt = AudioFormat(22050, 2, 1)
    reply = counting(1.4, 22050)  # < 32000 samples: every position once
    await sink.play(reply, fmt)
    await sink.play(b"", fmt)
    await until(lambda: len(sink._written) >= 10, "a fifth of a second written", 5.0)
    assert sink.hold()
    assert not sink.hold()  # held once
    assert tap.holds and sink.holds == 1
    sink.release()
    await asyncio.wait_for(sink.drain(), 10.0)
    await sink.close()
    first, second = sorted(tmp_path.glob("played-*.raw"), key=lambda p: p.stat().st_mtime)
    before, after = positions(first), positions(second)
    assert len(before) > 0 and len(after) > 0
    assert after[0] <= before[-1] + 1  # nothing skipped
    assert after[-1] == len(reply) // 2 - 1  # played out to the end
    assert np.all(np.diff(after) == 1)  # in order
    assert sink.take_cut() is None and tap.barge_ins == 0


async def test_a_held_reply_that_is_cut_stops_where_it_was_held(tmp_path: Path) -> None:
    """The voice that held the reply is the user's: the cut drops the rest, the barge-in
    counts from the hold (when the sound stopped), and the next reply plays whole."""
    from wyoming_pivoice.audio.speaker import CommandDevice, ContinuousSink

    sink = ContinuousSink(CommandDevice(f"exec cat > '{tmp_path}'/played-$$.raw"))
    tap = sink.tap = HoldTap()
    fmt = AudioFormat(22050, 2, 1)
    await sink.play(counting(3.0, 22050), fmt)
    await until(lambda: len(sink._written) >= 10, "a fifth of a second written", 5.0)
    assert sink.hold()
    held_at = sink.held_at
    assert sink.cut(hold=True)
    assert sink.take_cut() == held_at
    assert tap.barge_ins == 1
    await asyncio.wait_for(sink.stop(), 1.0)
    await asyncio.wait_for(sink.drain(), 1.0)
    nxt = counting(0.3, 22050)
    await sink.play(nxt, fmt)
    await asyncio.wait_for(sink.drain(), 5.0)
    await sink.close()
    files = sorted(tmp_path.glob("played-*.raw"), key=lambda p: p.stat().st_mtime)
    assert len(files) == 2
    assert len(positions(files[0])) < 22050  # well short of the 3 s reply
    assert nxt in files[1].read_bytes()


async def test_the_speaker_command_runs_at_the_speaker_threads_priority(tmp_path: Path) -> None:
    """The speaker command is the device's feeder: at normal priority it fell behind under load
    and its device ran dry (the room's speaker, load 4-6: 13-200 ms of silence at a time that
    the reference did not have, the echo's delay moving 286 → 405 ms in one stream). It is
    started on the speaker thread, after its priority is raised, and inherits it."""
    import threading

    from wyoming_pivoice.audio.pacing import raise_thread
    from wyoming_pivoice.audio.speaker import CommandDevice, ContinuousSink

    def priority() -> tuple[int, int]:
        return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)

    thread_got: list[tuple[int, int]] = []

    def audio_thread() -> None:  # what the speaker thread gets here (root: SCHED_RR)
        raise_thread("test")
        thread_got.append(priority())

    worker = threading.Thread(target=audio_thread)
    worker.start()
    worker.join()
    report = tmp_path / "priority"
    code = (
        "import os, sys; "
        f"open({str(report)!r}, 'w').write("
        "f'{os.sched_getscheduler(0)} {os.getpriority(os.PRIO_PROCESS, 0)}'); "
        "sys.stdin.buffer.read()"
    )
    sink = ContinuousSink(CommandDevice(f'exec {sys.executable} -c "{code}"'))
    await sink.play(tone(0.1, 22050), AudioFormat(22050, 2, 1))
    await sink.drain()
    await until(lambda: report.exists() and report.read_text(), "the command's report", 10.0)
    await sink.close()
    policy, nice = (int(x) for x in report.read_text().split())
    assert (policy, nice) == thread_got[0]
