"""The standalone satellite end to end: `wyoming-pivoice satellite --server …` on real speech,
against the real server on the embedded models."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from pivoice_lab.ports import refused_port

from .helpers import (
    ALSA_FILE_DEVICES,
    REPO,
    alsa_home,
    check_reply_audio,
    free_port,
    read_wav,
    run_satellite,
    satellite_argv,
    silence,
    spawn_satellite,
    spoken,
    words,
    write_wav,
)

FRAME = 0.032


def satellite(
    port: int, *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """A standalone satellite on the server at `port`, run to its end."""
    return run_satellite("--server", f"tcp://127.0.0.1:{port}", *args, env=env, timeout=timeout)


def turns(result: subprocess.CompletedProcess[str], log: Path) -> list[dict]:
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_one_turn_from_a_wav_at_real_time(
    server_port: int, kitchen_wav: Path, tmp_path: Path
) -> None:
    log, reply = tmp_path / "timing.jsonl", tmp_path / "reply.wav"
    result = satellite(
        server_port,
        "--mic-wav",
        str(kitchen_wav),
        "--snd-wav",
        str(reply),
        "--timing-log",
        str(log),
    )
    (turn,) = turns(result, log)
    assert {"kitchen", "lights"} <= words(turn["transcript"])
    assert turn["mode"] == "streaming" and turn["error"] is None and turn["reply"]
    # a pause inside the command may start (and cancel) a speculation; the one used
    # must still hold every word once: nothing lost, nothing duplicated
    assert turn["speculation"]["used"]
    assert turn["transcript"].lower().count("kitchen") == 1

    s = turn["stamps"]
    # the endpoint comes one silence window after the last voiced frame, within one VAD frame
    assert 0.300 <= s["endpoint"] - s["last_voiced"] < 0.300 + FRAME
    assert s["speech_start"] < s["last_voiced"] < s["speculation_start"] < s["endpoint"]
    assert s["transcript"] <= s["llm_first_token"] <= s["llm_done"]
    assert s["tts_request"] <= s["tts_first_audio"] <= s["first_played"] <= s["playback_done"]
    assert s["endpoint"] <= s["first_played"]  # nothing plays before the endpoint
    assert all(v is not None for v in turn["ms"].values())

    pcm, rate, width, channels = read_wav(reply)
    assert (rate, width, channels) == (22050, 2, 1)
    check_reply_audio(pcm, rate, turn["reply"])


def test_two_utterances_make_two_turns(server_port: int, tmp_path: Path) -> None:
    pcm = (
        silence(0.3)
        + spoken("Turn on the kitchen lights.", tmp_path / "a.wav")
        + silence(1.0)
        + spoken("What time is it?", tmp_path / "b.wav")
        + silence(1.0)
    )
    mic = write_wav(tmp_path / "two.wav", pcm)
    log = tmp_path / "timing.jsonl"
    result = satellite(
        server_port,
        "--mic-wav",
        str(mic),
        "--mic-pace",
        "none",
        "--snd-wav",
        str(tmp_path / "reply-{n}.wav"),
        "--timing-log",
        str(log),
    )
    first, second = turns(result, log)
    assert [first["turn"], second["turn"]] == [1, 2]
    assert "kitchen" in words(first["transcript"])
    assert {"time"} <= words(second["transcript"]) and "kitchen" not in words(second["transcript"])
    for n, turn in ((1, first), (2, second)):
        reply, rate, _, _ = read_wav(tmp_path / f"reply-{n}.wav")
        assert rate == 22050
        check_reply_audio(reply, rate, turn["reply"])
    # the second reply plays after the first
    assert first["stamps"]["playback_done"] <= second["stamps"]["first_played"]


def test_command_backends(server_port: int, kitchen_wav: Path, tmp_path: Path) -> None:
    raw = tmp_path / "mic.raw"
    raw.write_bytes(read_wav(kitchen_wav)[0])
    out, log = tmp_path / "out-{rate}.raw", tmp_path / "timing.jsonl"
    result = satellite(
        server_port,
        "--mic-command",
        f"cat {raw}",
        "--snd-command",
        f"cat > '{out!s}'",
        "--timing-log",
        str(log),
    )
    (turn,) = turns(result, log)
    assert {"kitchen", "lights"} <= words(turn["transcript"])
    # One continuous speaker stream: the reply with the silence written around it.
    samples = np.frombuffer((tmp_path / "out-22050.raw").read_bytes(), dtype="<i2")
    voiced = np.flatnonzero(samples)
    reply = samples[voiced[0] : voiced[-1] + 1].tobytes()
    check_reply_audio(reply, 22050, turn["reply"])


def test_speculation_cancelled_by_a_pause_gives_one_whole_turn(
    server_port: int, tmp_path: Path
) -> None:
    """A pause longer than --speculate-ms but shorter than the window: the speculation on the
    first half is cancelled, and the one turn hears both halves (and speculates again, and
    that speculation is the one used)."""
    pcm = (
        silence(0.3)
        + spoken("Turn on the kitchen lights", tmp_path / "a.wav")
        + silence(0.25)
        + spoken("and close the blinds.", tmp_path / "b.wav")
        + silence(1.0)
    )
    mic = write_wav(tmp_path / "pause.wav", pcm)
    log = tmp_path / "timing.jsonl"
    result = satellite(
        server_port,
        "--mic-wav",
        str(mic),
        "--speculate-ms",
        "100",
        "--vad-silence-ms",
        "500",
        "--snd-device",
        "null",
        "--timing-log",
        str(log),
    )
    (turn,) = turns(result, log)
    assert turn["speculation"]["cancelled"] >= 1, result.stderr[-3000:]
    assert turn["speculation"]["used"]
    assert {"kitchen", "lights", "close", "blinds"} <= words(turn["transcript"])
    assert turn["stamps"]["speculation_start"] - turn["stamps"]["last_voiced"] < 0.5
    assert turn["error"] is None and turn["stamps"]["first_played"] is not None


def test_sequential_pipeline(server_port: int, kitchen_wav: Path, tmp_path: Path) -> None:
    log, reply = tmp_path / "timing.jsonl", tmp_path / "reply.wav"
    result = satellite(
        server_port,
        "--pipeline",
        "sequential",
        "--mic-wav",
        str(kitchen_wav),
        "--mic-pace",
        "none",
        "--snd-wav",
        str(reply),
        "--timing-log",
        str(log),
    )
    (turn,) = turns(result, log)
    assert turn["mode"] == "sequential" and turn["speculate_ms"] == 0
    assert not turn["speculation"]["used"] and turn["stamps"]["speculation_start"] is None
    assert {"kitchen", "lights"} <= words(turn["transcript"])
    s = turn["stamps"]
    # the whole reply first, then one synthesis of all of it
    assert s["llm_done"] <= s["tts_request"] <= s["tts_first_audio"] <= s["first_played"]
    pcm, rate, _, _ = read_wav(reply)
    check_reply_audio(pcm, rate, turn["reply"])


def test_unreachable_server_is_reported_not_dropped(kitchen_wav: Path, tmp_path: Path) -> None:
    log = tmp_path / "timing.jsonl"
    with refused_port() as port:
        result = satellite(
            port, "--mic-wav", str(kitchen_wav), "--mic-pace", "none", "--snd-device", "null",
            "--server-retry-s", "1", "--timing-log", str(log),
        )  # fmt: skip
    (turn,) = turns(result, log)
    assert "unreachable" in turn["error"]
    assert turn["stamps"]["endpoint"] is not None and turn["stamps"]["first_played"] is None
    assert "Turn 1 failed" in result.stderr


def test_local_wake_word(server_port: int, tmp_path: Path) -> None:
    """With --wake-word only speech after the wake word makes a turn."""
    pcm = (
        silence(0.3)
        + spoken("What time is it?", tmp_path / "a.wav")
        + silence(1.0)
        + spoken("Okay Nabu.", tmp_path / "w.wav", speed=140)
        + silence(0.5)
        + spoken("Turn on the kitchen lights.", tmp_path / "b.wav")
        + silence(1.0)
    )
    mic = write_wav(tmp_path / "wake.wav", pcm)
    log = tmp_path / "timing.jsonl"
    result = satellite(
        server_port,
        "--mic-wav",
        str(mic),
        "--mic-pace",
        "none",
        "--wake-word",
        "okay_nabu",
        "--snd-device",
        "null",
        "--timing-log",
        str(log),
    )
    (turn,) = turns(result, log)
    assert "Wake word 'Okay Nabu' detected" in result.stderr
    assert "kitchen" in words(turn["transcript"]) and "time" not in words(turn["transcript"])


def test_unknown_wake_word_is_a_clear_error(tmp_path: Path, kitchen_wav: Path) -> None:
    result = satellite(free_port(), "--mic-wav", str(kitchen_wav), "--wake-word", "hey_bob")
    assert result.returncode == 2
    assert "unknown wake word 'hey_bob'" in result.stderr and "okay_nabu" in result.stderr


def test_pyaudio_mic_and_speaker(server_port: int, kitchen_wav: Path, tmp_path: Path) -> None:
    """PortAudio capture and playback, through ALSA `file` devices (this machine has no card)."""
    infile, outfile = tmp_path / "speech.raw", tmp_path / "played.raw"
    infile.write_bytes(read_wav(kitchen_wav)[0])
    log = tmp_path / "timing.jsonl"
    env = alsa_home(tmp_path, ALSA_FILE_DEVICES.format(infile=infile, outfile=outfile))
    result = satellite(
        server_port,
        "--mic-device",
        "pivoicemic",
        "--snd-device",
        "pivoicespk",
        "--max-turns",
        "1",
        "--timing-log",
        str(log),
        env=env,
    )
    (turn,) = turns(result, log)
    assert {"kitchen", "lights"} <= words(turn["transcript"])
    check_reply_audio(outfile.read_bytes(), 22050, turn["reply"])


async def test_a_dropped_connection_fails_one_turn_and_the_next_reconnects(
    server_port: int, tmp_path: Path
) -> None:
    """A server that goes away mid-request (here: a proxy that drops the first connection)
    costs that turn, which is reported with its error; the next turn connects again."""
    dropped = 0

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal dropped
        if dropped == 0:
            dropped += 1
            await reader.read(100)  # the request has started…
            writer.close()  # …and the server is gone
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", server_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        await asyncio.gather(
            pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True
        )

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pcm = (
        silence(0.3)
        + spoken("Turn on the kitchen lights.", tmp_path / "a.wav")
        + silence(1.0)
        + spoken("Open the garage door.", tmp_path / "b.wav")
        + silence(1.0)
    )
    mic = write_wav(tmp_path / "two.wav", pcm)
    log = tmp_path / "timing.jsonl"
    proc = await asyncio.create_subprocess_exec(
        *satellite_argv(
            "--server",
            f"tcp://127.0.0.1:{port}",
            "--mic-wav",
            str(mic),
            "--mic-pace",
            "none",
            "--snd-device",
            "null",
            "--timing-log",
            str(log),
        ),
        cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 180)
    server.close()
    assert proc.returncode == 0, stderr.decode()[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2
    failed = [r for r in records if r["error"]]
    good = [r for r in records if not r["error"]]
    assert len(failed) == 1 and len(good) == 1
    assert "connection" in failed[0]["error"] or "closed" in failed[0]["error"]
    assert good[0]["transcript"] and good[0]["stamps"]["first_played"] is not None


def test_sigterm_stops_the_satellite_and_its_mic_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "mic.pid"
    proc = spawn_satellite(
        "--server", f"tcp://127.0.0.1:{free_port()}",
        "--mic-command", f"echo $$ > {pidfile}; exec sleep 60", "--snd-device", "null",
        stdout=None, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    mic_pid = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr[-3000:]
    with pytest.raises(ProcessLookupError):
        os.kill(mic_pid, 0)
