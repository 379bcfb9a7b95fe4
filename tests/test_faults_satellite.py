"""Faults under a running satellite: the server killed mid-turn and restarted."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from .helpers import (
    REPO,
    assert_all_gone,
    check_reply_audio,
    cue,
    free_port,
    mic_on_cue,
    silence,
    spawn_satellite,
    spawn_server,
    spoken,
    words,
)


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
    server_log = tmp_path / "server.log"
    with open(server_log, "w") as out:
        server = spawn_server(port, out=out)
    sat = spawn_satellite(
        "--server", f"tcp://127.0.0.1:{port}", "--mic-command", mic,
        "--snd-wav", str(tmp_path / "reply{n}.wav"), "--timing-log", str(log),
        stderr=subprocess.PIPE,
    )  # fmt: skip
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
        # Frozen, the server sends nothing more; turn 1 must still be under way: the
        # satellite has not ended it, and the server has not finished its answer (the
        # reply's text, let alone all of its speech).
        server.send_signal(signal.SIGSTOP)
        assert not log.exists() or not log.read_text(), "turn 1 ended before the server died"
        assert "Answered in" not in server_log.read_text(), "turn 1 was answered already"
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


# ---- issue #13: speakers that hang, stops, barge-in, through the standalone process ---------


@dataclass
class Standalone:
    proc: subprocess.Popen
    folder: Path
    log: Path  # stderr
    timing: Path

    def speak(self) -> None:
        cue(self.folder)

    def text(self) -> str:
        return self.log.read_text()

    def turns(self) -> list[dict]:
        if not self.timing.exists():
            return []
        return [json.loads(line) for line in self.timing.read_text().splitlines()]

    def wait_until(self, what: str, done: Callable[[], bool], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert self.proc.poll() is None, f"satellite exited\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what}\n{self.text()[-3000:]}"
            time.sleep(0.05)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def sigterm(self, sig: int = signal.SIGTERM) -> float:
        """SIGTERM (or `sig`); returns how long it took to exit, once it has exited cleanly
        with nothing of it left running."""
        children = self.descendants()
        started = time.monotonic()
        self.proc.send_signal(sig)
        code = self.proc.wait(10)
        took = time.monotonic() - started
        text = self.text()
        assert code == 0, text[-3000:]
        assert "Traceback" not in text and "Event loop is closed" not in text, text[-3000:]
        assert_all_gone(children)
        return took


@contextlib.contextmanager
def standalone(
    server_port: int,
    tmp_path: Path,
    speaker: str,
    question: str = "Turn on the garden lights.",
    *options: str,
) -> Iterator[Standalone]:
    """The satellite on the real server (with `options`); its mic (a shell loop, as in the
    README) reads silence and asks `question` each time `go` appears."""
    mic = mic_on_cue(tmp_path, spoken(question, tmp_path / "q.wav") + silence(1.0))
    log, timing = tmp_path / "satellite.log", tmp_path / "turns.jsonl"
    with open(log, "w") as err:
        proc = spawn_satellite(
            "--server", f"tcp://127.0.0.1:{server_port}",
            "--mic-command", mic, "--snd-command", speaker, "--timing-log", str(timing),
            *options, stderr=err,
        )  # fmt: skip
        sat = Standalone(proc, tmp_path, log, timing)
        try:
            sat.wait_until("microphone", lambda: "Microphone command started" in sat.text())
            yield sat
        finally:
            if proc.poll() is None:
                for child in sat.descendants():
                    with contextlib.suppress(psutil.Error):
                        child.kill()
                proc.kill()
                proc.wait()


def test_a_speaker_that_stops_reading_is_killed_and_the_next_reply_plays(
    server_port: int, tmp_path: Path
) -> None:
    # Replies 1 and 3 go to a player that takes nothing and never ends.
    speaker = f"case {{n}} in 1|3) exec sleep 1000;; esac; cat > {tmp_path}/out-{{n}}.raw"
    with standalone(server_port, tmp_path, speaker) as sat:
        sat.speak()
        sat.wait_until("turn 1", lambda: len(sat.turns()) == 1)
        first = sat.turns()[0]
        assert first["reply"]
        assert "the speaker command" in sat.text()  # stopped taking audio / did not finish
        sat.speak()
        sat.wait_until("turn 2", lambda: len(sat.turns()) == 2)
        second = sat.turns()[1]
        assert second["error"] is None and {"garden"} <= words(second["transcript"])
        check_reply_audio((tmp_path / "out-2.raw").read_bytes(), 22050, second["reply"])
        # A third reply hangs its player again; SIGTERM still stops everything, bounded.
        sat.speak()
        sat.wait_until("reply 3", lambda: sat.text().count("Speaker command started") == 3)
        took = sat.sigterm()
    print(f"SIGTERM with a stuck speaker: {took * 1000:.0f} ms")
    # 16 ms here as a rule; once in CI (session 13, idle but for CI) 1972 ms — close to the
    # 2 s a speaker command that reads nothing is waited for (COMMAND_START_TIMEOUT): a
    # shutdown that lands in that wait may sit it out. Cause not confirmed: the bound is the
    # contract (no hang, nothing left running), the 2 s case an open question.
    assert took < 3.0


@pytest.mark.parametrize("state", ["listening", "speaking", "playing", "sigint"])
def test_sigterm_stops_the_standalone_satellite_within_a_second(
    server_port: int, tmp_path: Path, state: str
) -> None:
    """The README's mic runs through /bin/sh; the speaker plays at real time."""
    speaker = realtime_speaker(tmp_path)
    with standalone(server_port, tmp_path, speaker) as sat:
        if state == "speaking":
            sat.speak()
            sat.wait_until("speech", lambda: "speech started" in sat.text())
        elif state == "playing":
            sat.speak()
            sat.wait_until("playback", lambda: "Speaker command started" in sat.text())
        took = sat.sigterm(signal.SIGINT if state == "sigint" else signal.SIGTERM)
    print(f"signal while {state}: {took * 1000:.0f} ms")
    assert took < 1.0


def test_barge_in_silences_a_command_speaker_at_once(server_port: int, tmp_path: Path) -> None:
    """Speech during a reply stops it: the player (a stand-in that plays at real time with
    a 40 ms buffer, like a device) falls silent soon after the satellite decides."""
    speaker = realtime_speaker(tmp_path)
    first = tmp_path / "played-1"
    story = "Tell me a long story about a dragon."
    # --no-aec: this mic cannot hear the speaker, and AEC3 with no echo path to find takes
    # 10-15 dB off the user's voice for the whole reply (seen: no barge-in in 58 s). What is
    # measured here is how fast the speaker stops; echo and barge-in together are
    # test_satellite_room's subject.
    with standalone(server_port, tmp_path, speaker, story, "--no-aec") as sat:
        sat.speak()
        # Once the reply has played for a second, the user speaks again.
        sat.wait_until("a second of reply", lambda: played_seconds(first) > 1.0)
        sat.speak()
        sat.wait_until("barge-in", lambda: "Barge-in: stopping" in sat.text())
        sat.wait_until("turn 1", lambda: len(sat.turns()) >= 1)
        decided = sat.turns()[0]["stamps"]["barge_in"]  # the satellite's monotonic stamp
        silent_at = float(first.read_text().split()[-1])  # the end of the last block it got
        sat.sigterm()
    silence_ms = (silent_at - decided) * 1000
    print(f"barge-in: the speaker fell silent {silence_ms:.0f} ms after the decision")
    assert sat.turns()[0]["barged_in"]
    assert silence_ms < 150


def realtime_speaker(folder: Path) -> str:
    """--snd-command for tests/realtime_speaker.py; reply N's blocks go to folder/played-N."""
    return (
        f"{sys.executable} {REPO / 'tests' / 'realtime_speaker.py'} {{rate}} {folder}/played-{{n}}"
    )


def played_seconds(log: Path) -> float:
    """How much of a reply the stand-in speaker has played so far."""
    if not log.exists() or not (rows := log.read_text().split()):
        return 0.0
    return float(rows[-1]) - float(rows[0])
