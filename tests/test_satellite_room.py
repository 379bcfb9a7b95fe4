"""The standalone satellite in a room that echoes: the real satellite process, its speaker and
microphone commands joined by the room simulator, against the real server on the real models."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pivoice_lab.bench.room import reply_lags
from pivoice_lab.bench.servers import warm
from pivoice_lab.room.acoustics import RoomAcoustics
from pivoice_lab.room.session import RoomRun, run_satellite_in_room
from pivoice_lab.room.simulator import Say

from .helpers import FakeHomeAssistant, ha_mode_satellite, make_speech, read_wav, stt, tts, words

# Loud and late, with a room tail: the speaker's own voice reaches the mic 6 dB down.
ECHOING = RoomAcoustics(echo_db=-6, delay_ms=60, tail_ms=60, noise_dbfs=-60, seed=7)


def said(text: str, path: Path, **when: float | int) -> Say:
    make_speech(text, path, voice="en-us", speed=150, pad_before=0.0, pad_after=0.0)
    audio = np.frombuffer(read_wav(path)[0], dtype="<i2").astype(np.float32) / 32768
    return Say(text, audio, **when)  # type: ignore[arg-type]


def describe(run: RoomRun) -> str:
    """The turns, and the satellite's log: its events whole, the audio core's per-frame
    debug lines ("Over the reply …") only around the voice said over a reply and before
    each barge-in (a tail of them alone told nothing of why CI's voice made no turn)."""
    turns = [(t["transcript"], t["barged_in"], t["reply"][:60]) for t in run.turns]
    lines = run.log.splitlines()
    frames = [i for i, line in enumerate(lines) if "Over the reply" in line]
    is_frame = set(frames)
    keep = set(range(len(lines))) - is_frame
    voiced = [i for i in frames if " VAD 0.00," not in lines[i]]
    for i in voiced[:40]:  # the first voiced frames over a reply, and two before them
        keep.update(range(max(0, i - 2), i + 1))
    for i, line in enumerate(lines):  # and the frames that decided each barge-in
        if "Barge-in on the audio thread" in line:
            keep.update(j for j in range(max(0, i - 12), i) if j in is_frame)
    # A frame's line without its logger's prefix nor the linear filter's (off) fields.
    short = [line.split("core: ", 1)[-1].split("; linear VAD None")[0] for line in lines]
    log = "\n".join(short[i] if i in is_frame else lines[i] for i in sorted(keep))
    return f"turns: {turns}\n--- satellite log ---\n{log[-16000:]}"


async def room_run(
    server_port: int,
    tmp_path: Path,
    script: list[Say],
    *extra: str,
    limit_s: float = 60,
    record: bool = False,
) -> RoomRun:
    uri = f"tcp://127.0.0.1:{server_port}"
    await warm(uri)  # the room's clock does not wait for models still loading
    return await run_satellite_in_room(
        uri, script, ECHOING, tmp_path, *extra, limit_s=limit_s, record=record
    )


async def test_one_question_in_an_echoing_room_is_one_turn(server_port: int, tmp_path: Path):
    question = said("What is the capital of France?", tmp_path / "q.wav", at=0.5)
    dump = tmp_path / "aec.raw"
    run = await room_run(server_port, tmp_path, [question], "--aec-dump", str(dump), record=True)
    assert run.settled, describe(run)
    assert len(run.turns) == 1, describe(run)
    [turn] = run.turns
    assert "france" in words(turn["transcript"]), describe(run)
    assert not turn["barged_in"], describe(run)
    # The reply played to the end, and it was real speech of a plausible length.
    [reply] = run.room.replies
    assert reply.ended is not None and reply.seconds > 1.0
    assert len(turn["reply"]) / 30 < reply.seconds < len(turn["reply"]) / 5 + 1.5
    # The canceller took the reply's echo out of the microphone.
    assert turn["echo"]["erle_db"] > 10, turn["echo"]
    # What it compared (--aec-dump) against what the room played and heard: the reference
    # placed no later than it played (it is stamped when written), so AEC3 got it before its
    # echo, by the room's delay and a little more.
    lags = reply_lags(run, dump, ECHOING.delay_ms)
    [reference], [lag] = lags["reference_ms"], lags["lag_ms"]
    assert reference is not None and reference <= 1.0, lags
    assert lag is not None and ECHOING.delay_ms - 1.0 <= lag <= ECHOING.delay_ms + 60, lags


# A headset: the microphone does not hear the speaker at all.
HEADSET = RoomAcoustics(echo_db=-90, delay_ms=20, tail_ms=0, noise_dbfs=-60, seed=8)


async def test_under_load_talking_over_the_reply_stops_it_and_is_answered(
    server_port: int, tmp_path: Path
):
    """The echoing room with busy processes on every core twice over (issue #20): one
    question is one turn, and the words said over its reply stop it and are answered.

    The question asks for a story: SmolLM2-135M's replies to it run 950-1230 characters (8
    of 8 at the default temperature), where a joke was 15-87 ("A cat is a cat." once ended
    before the user spoke, so nothing could be barged in on: session 14's CI). Session 8
    (load 21) saw the second turn answered with the cats joke again, word for word: the
    server keeps the interrupted reply in the conversation's history and the tiny model
    repeats it; that is the model's, not the satellite's, so not asserted here."""
    from pivoice_lab.bench.room import busy_load

    question = said("Tell me a story about a cat and a dog.", tmp_path / "q.wav", at=0.5)
    over = said("Turn off the kitchen lights.", tmp_path / "over.wav", reply=1, after_ms=1000)
    uri = f"tcp://127.0.0.1:{server_port}"
    await warm(uri)
    dump = tmp_path / "aec.raw"
    with busy_load(2 * (os.cpu_count() or 1)):
        # A turn takes seconds longer under load (E2E 15 s at load 12): 30 s of quiet, not 4.
        run = await run_satellite_in_room(
            uri, [question, over], ECHOING, tmp_path, "--aec-dump", str(dump),
            quiet_s=30.0, limit_s=240, record=True,
        )  # fmt: skip
    assert run.settled, describe(run)
    check_barge_in(run, over, echo=True)
    assert run.room.replies[1].ended is not None, describe(run)
    # The answer plays through a new speaker command (the barge-in killed the first): its
    # reference stands against what played where the first reply's did, so the echo's delay
    # does not move under AEC3 (it moved up to 5.5 ms when the command's start was polled
    # every 5 ms: speaker.TAKING_POLL_S). The room may count the answer as two replies: a
    # phrase synthesized late under this load can leave a gap of 1.5 s in it (room.REPLY_GAP_S;
    # CI once: three replies, each placed -9.25 ms); each part must stand alike.
    placed = reply_lags(run, dump, ECHOING.delay_ms)["reference_ms"]
    values = [ms for ms in placed if ms is not None]
    assert len(placed) >= 2 and len(values) == len(placed), placed
    assert max(values) - min(values) <= 3.0, placed


async def test_a_headset_barges_in(server_port: int, tmp_path: Path):
    """No echo path: the voice over the reply stops it, and nothing is taken off the voice."""
    question = said("Tell me a story about a cat and a dog.", tmp_path / "q.wav", at=0.5)
    over = said("Turn off the kitchen lights.", tmp_path / "over.wav", reply=1, after_ms=1000)
    uri = f"tcp://127.0.0.1:{server_port}"
    await warm(uri)
    run = await run_satellite_in_room(uri, [question, over], HEADSET, tmp_path, limit_s=120)
    check_barge_in(run, over)


def check_barge_in(run: RoomRun, over: Say, echo: bool = False) -> None:
    """Two turns: the question, then what was said over its reply; the reply (a story, a
    minute long) stopped within a second of the voice's onset, and the second turn is not
    itself a barge-in. With `echo` (the echoing room under load) the answer stopped by its
    own echo is #20's open failure, an xfail: the bench counts it (0 self-made turns in 120
    echoing replies at load 4.4-4.8, session 19); CI met it once (session 19: the answer's
    phrase after a 0.3 s pause leaked through AEC3 at Silero 0.23-0.46, 22-27 dB over what
    the echo alone would leave, the plain rule's four frames)."""
    assert len(run.turns) >= 2, describe(run)
    first, second, *extra = run.turns
    reply = run.room.replies[0]
    assert over.onset is not None and reply.ended is not None, describe(run)
    assert first["barged_in"], describe(run)
    assert 0 < reply.ended - over.onset < 1.0, describe(run)
    if echo and extra and second["barged_in"]:
        assert "kitchen" in words(second["transcript"]), describe(run)
        pytest.xfail(f"the answer's own echo stopped it and made a turn (#20)\n{describe(run)}")
    assert len(run.turns) == 2, describe(run)
    assert not second["barged_in"], describe(run)
    if "kitchen" not in words(second["transcript"]):
        # Two turns and the reply stopped, but the words over it misheard: #20's target is
        # the key word >= 80 % of the time, so one run may miss it ("Turn off the kitchen
        # lights." heard as "I don't know if I can't even lie it." once in CI at load ~2).
        pytest.xfail(f"the words over the reply misheard (#20)\n{describe(run)}")


async def test_without_echo_cancellation_the_room_shows_the_self_talk_loop(
    server_port: int, tmp_path: Path
):
    """The check that the room can fail: the same question with --no-aec answers itself."""
    question = said("Tell me a joke about cats.", tmp_path / "q.wav", at=0.5)
    run = await room_run(server_port, tmp_path, [question], "--no-aec", "--max-turns", "3",
                         limit_s=45)  # fmt: skip
    assert len(run.turns) >= 2, describe(run)


async def test_home_assistant_hears_the_follow_up_and_not_the_reply(
    server_port: int, tmp_path: Path
):
    """HA mode in the same room: HA's reply plays through the speaker, the user asks again
    right after it, and the audio streamed to HA holds the question, not the reply's echo."""
    from wyoming.satellite import RunSatellite
    from wyoming.tts import Synthesize

    from pivoice_lab.room.simulator import Room

    reply_text = "Here is a joke. Why did the cat sit on the computer? To keep an eye on the mouse."
    reply_pcm, rate = await tts(server_port, reply_text)
    first = said("Tell me a joke.", tmp_path / "q1.wav", at=0.5)
    follow = said("Turn off the kitchen lights.", tmp_path / "q2.wav", reply=1, after_end=True,
                  after_ms=300)  # fmt: skip
    async with Room(ECHOING, [first, follow], record=True) as room:
        args = ("--mic-command", room.mic_command, "--snd-command", room.speaker_command)
        with ha_mode_satellite(tmp_path, *args) as sat:
            async with FakeHomeAssistant(sat.port) as ha:
                await ha.send(RunSatellite().event())
                ha.keep_pinging()
                one = await ha.receive_stream()
                assert "joke" in words(await stt(server_port, one.pcm))
                await ha.pipeline_events("tell me a joke")
                await ha.send(Synthesize(text=reply_text).event())
                await ha.send_reply(reply_pcm, rate)
                await ha.read_until("played", timeout=60)
                two = await ha.receive_stream()
                heard = words(await stt(server_port, two.pcm))
    assert room.replies[0].ended is not None and room.replies[0].seconds > 3.0
    assert {"kitchen"} <= heard, heard
    # None of the reply's words came back to HA ("joke" was the question's, so not "cat",
    # "computer", "mouse").
    assert not heard & {"cat", "computer", "mouse", "eye"}, heard
    # What was streamed before the user spoke (the pre-roll, right after the reply) is quiet.
    streamed = np.frombuffer(two.pcm, dtype="<i2").astype(np.float32) / 32768
    pre_roll = streamed[: 16000 * 15 // 100]
    assert 20 * np.log10(np.sqrt(np.mean(pre_roll**2)) + 1e-9) < -40
