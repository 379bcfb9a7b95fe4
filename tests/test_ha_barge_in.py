"""Barge-in in Home Assistant mode, in a room that echoes: the real satellite process with its
speaker and microphone commands joined by the room simulator, driven by the HA stand-in.

Speech over HA's reply (or an announcement, or a ringing timer) must stop it at once and
start HA's next run with that speech; `played` goes to HA before the new run-pipeline, so
HA's entity leaves "responding" first. The replies are espeak speech at HA's 22050 Hz, so no
model is needed: what was streamed is checked by its length against what the user said.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from wyoming.satellite import RunSatellite
from wyoming.timer import TimerFinished
from wyoming.tts import Synthesize

from pivoice_lab.room.acoustics import RoomAcoustics
from pivoice_lab.room.simulator import Room, Say

from .helpers import FakeHomeAssistant, ha_mode_satellite, make_speech, read_wav

pytestmark = pytest.mark.slow  # real time in a simulated room

# As test_satellite_room: the speaker's own voice reaches the mic 6 dB down, late, with a tail.
ECHOING = RoomAcoustics(echo_db=-6, delay_ms=60, tail_ms=60, noise_dbfs=-60, seed=7)
REPLY = (
    "Once upon a time there was a little robot who lived in a lighthouse by the sea. "
    "Every night it counted the ships, and every morning it polished the great lamp."
)


def said(text: str, path: Path, **when: float | int) -> Say:
    make_speech(text, path, voice="en-us", speed=150, pad_before=0.0, pad_after=0.0)
    audio = np.frombuffer(read_wav(path)[0], dtype="<i2").astype(np.float32) / 32768
    return Say(text, audio, **when)  # type: ignore[arg-type]


def reply_pcm(tmp_path: Path, text: str = REPLY) -> bytes:
    wav = make_speech(text, tmp_path / "reply.wav", rate=22050, pad_before=0.1, pad_after=0.1)
    return read_wav(wav)[0]


# Known failure on the merged main (session 7): both passed on branch ha-mode, against the room
# and endpointer before sat-core's audio core; merged, HA never gets the barge-in's run-pipeline
# (only pongs for 60 s). Issue #21 stays open for it; not strict, so a pass is reported too.
MERGE_REGRESSION = pytest.mark.xfail(
    reason="HA barge-in after the audio-core merge: no run-pipeline (issue #21)", strict=False
)


@MERGE_REGRESSION
async def test_speech_over_replies_stops_each_and_starts_the_next_run(tmp_path: Path) -> None:
    """Three barge-ins in a row, then a reply left to finish; figures go to the log."""
    pcm = reply_pcm(tmp_path)
    questions = ["Tell me a story.", "What time is it?", "How cold is it outside?", "Thanks."]
    script = [said(questions[0], tmp_path / "q0.wav", at=0.5)]
    for n, text in enumerate(questions[1:], start=1):
        script.append(said(text, tmp_path / f"q{n}.wav", reply=n, after_ms=1500 + 300 * n))
    figures = []
    async with Room(ECHOING, script, record=True) as room:
        args = ("--mic-command", room.mic_command, "--snd-command", room.speaker_command)
        with ha_mode_satellite(tmp_path, *args) as sat:
            async with FakeHomeAssistant(sat.port) as ha:
                await ha.send(RunSatellite().event())
                ha.keep_pinging()
                streams = [await ha.receive_stream()]
                for n in range(1, len(questions)):
                    await ha.pipeline_events(questions[n - 1])
                    await ha.send(Synthesize(text=REPLY).event())
                    await ha.send_reply(pcm, 22050)
                    await ha.read_until("played")
                    played_at = time.monotonic()
                    event, before = await ha.read_until("run-pipeline")
                    run_at = time.monotonic()
                    assert "played" not in {e.type for e in before}
                    over = script[n]
                    assert over.onset is not None, f"barge-in {n} was never spoken"
                    figures.append(
                        {
                            "barge_in": n,
                            "run_pipeline_after_onset_ms": round((run_at - over.onset) * 1000),
                            "played_after_onset_ms": round((played_at - over.onset) * 1000),
                        }
                    )
                    # The rest of the stream: what HA's STT would get.
                    streams.append(await ha.receive_stream(run=event))
                # The last reply is let to play out: `played` at its end, nothing more.
                await ha.pipeline_events(questions[-1])
                await ha.send_reply(pcm[: 22050 * 2], 22050)
                await ha.read_until("played")
        log = sat.log_text()
    print(json.dumps(figures))
    for n in range(1, len(questions)):
        reply, over = room.replies[n - 1], script[n]
        assert reply.closed is not None and over.onset is not None
        # Stopped while the user spoke, long before its ~9 s were out.
        assert reply.seconds < 1.5 + 0.3 * n + over.seconds + 1.0, (n, reply.seconds, log[-3000:])
        assert reply.closed - over.onset < 1.0, (n, reply.closed - over.onset)
        # The new run carries the barge-in's speech: about its length, with its start.
        assert over.seconds - 0.2 <= streams[n].seconds <= over.seconds + 2.0, (
            n, streams[n].seconds, over.seconds,
        )  # fmt: skip
        head = np.frombuffer(streams[n].pcm[:16000], dtype="<i2").astype(np.float32) / 32768
        assert np.sqrt(np.mean(head**2)) > 0.01, "the run did not start with the speech"
    for figure in figures:
        assert figure["played_after_onset_ms"] <= figure["run_pipeline_after_onset_ms"]
    assert room.replies[-1].closed is not None and not room.replies[-1].killed


@MERGE_REGRESSION
async def test_speech_over_a_ringing_timer_stops_it(tmp_path: Path) -> None:
    # A short word over the ring may not pass the echo rule (250 ms at 0.85): say a few.
    script = [said("Okay, stop that.", tmp_path / "stop.wav", reply=2, after_ms=300)]
    async with Room(ECHOING, script, record=True) as room:
        args = ("--mic-command", room.mic_command, "--snd-command", room.speaker_command)
        with ha_mode_satellite(tmp_path, *args) as sat:
            async with FakeHomeAssistant(sat.port) as ha:
                await ha.send(RunSatellite().event())
                ha.keep_pinging()
                await ha.send(TimerFinished(id="kitchen").event())
                event, before = await ha.read_until("run-pipeline")  # "stop" started a run
                assert "played" not in {e.type for e in before}  # a ring is no HA reply
                stream = await ha.receive_stream(run=event)
                assert stream.seconds > 0.3
                await ha.pipeline_events("Okay, stop that.")
                # HA answers the run; its "stop" transcript means that answer is not played.
                await ha.send_reply(reply_pcm(tmp_path, "Sorry, I did not understand."), 22050)
                await ha.read_until("played")
                rings = len(room.replies)
        log = sat.log_text()
    assert rings in (2, 3), (rings, log[-3000:])  # it rang until the word, then never again
    assert room.replies[-1].killed or room.replies[-1].closed is not None
    assert "this run's reply is dropped" in log
