"""Follow: in Home Assistant mode with --server, our server's reply to the satellite's HA turn
plays as it is written, and HA's copy of it is dropped. The join rule (server/follow.py) is
walked first with no I/O; then the real satellite, server and models, with the HA stand-in
doing what HA 2026.10's pipeline does (helpers.ha_turn), against the standalone satellite.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from wyoming.event import Event
from wyoming.satellite import RunSatellite

from pivoice_lab.bench.servers import warm
from wyoming_pivoice.server import follow
from wyoming_pivoice.server.follow import Follower, FollowHub

from .helpers import (
    FakeHomeAssistant,
    check_reply_audio,
    cue,
    ha_mode_satellite,
    ha_turn,
    make_speech,
    mic_on_cue,
    read_wav,
    run_satellite,
    until,
)

KITCHEN = "assist_satellite.kitchen_satellite"


class Sent(list):
    async def __call__(self, event: Event) -> None:
        self.append(event)


def follower(satellite_id: str | None = None) -> tuple[Follower, list[Event]]:
    sent = Sent()
    f = Follower(sent, f"peer-{satellite_id}")
    hub_events: list[Event] = []
    f.send = hub_events.append  # type: ignore[method-assign]  # no task: collect in order
    return f, hub_events


def joined(events: list[Event]) -> bool:
    return any(e.type == follow.REPLY_START for e in events)


def test_a_turn_that_names_its_satellite_joins_only_that_satellite() -> None:
    hub = FollowHub()
    kitchen, to_kitchen = follower(KITCHEN)
    office, to_office = follower("assist_satellite.office")
    hub.follow(kitchen, {"satellite_id": KITCHEN})
    hub.follow(office, {"satellite_id": "assist_satellite.office"})
    # Both heard the same words at the same moment; the turn says whose it is.
    hub.heard(kitchen, {"text": "Tell me a joke."}, now=10.0)
    hub.heard(office, {"text": "tell me a joke"}, now=10.1)
    tap = hub.turn("Tell me a joke.", {"satellite_id": KITCHEN}, now=10.2)
    tap.piece("Why did ")
    tap.close("Why did the cat sit on the computer?")
    assert joined(to_kitchen) and not joined(to_office)
    assert [e.type for e in to_kitchen] == [follow.REPLY_START, "handled-chunk", "handled"]
    # A turn of a satellite that follows nothing here (a Voice PE) joins nobody.
    hub.heard(kitchen, {"text": "what time is it"}, now=20.0)
    hub.turn("What time is it?", {"satellite_id": "assist_satellite.voice_pe"}, now=20.1)
    assert sum(e.type == follow.REPLY_START for e in to_kitchen) == 1


def test_without_a_satellite_id_only_an_unambiguous_join() -> None:
    """HA before 2026.10 sends no satellite_id: the words and the moment must point at one."""
    hub = FollowHub()
    kitchen, to_kitchen = follower(KITCHEN)
    office, to_office = follower("assist_satellite.office")
    hub.follow(kitchen, {"satellite_id": KITCHEN})
    hub.follow(office, {"satellite_id": "assist_satellite.office"})
    hub.heard(kitchen, {"text": "turn on the fan"}, now=1.0)
    hub.turn("Turn on the fan.", None, now=1.2).close("Done.")
    assert joined(to_kitchen)
    # Two satellites asked the same at once: neither joins (both fall back to HA's audio).
    hub.heard(kitchen, {"text": "what is the weather"}, now=30.0)
    hub.heard(office, {"text": "what is the weather"}, now=30.1)
    hub.turn("What is the weather?", None, now=30.2)
    hub.turn("What is the weather?", None, now=30.3)
    assert sum(e.type == follow.REPLY_START for e in to_kitchen) == 1 and not joined(to_office)
    # Too far apart in time, or other words: no join.
    hub.heard(office, {"text": "play music"}, now=50.0)
    hub.turn("Play music.", None, now=50.0 + follow.WINDOW_S + 1)
    hub.heard(office, {"text": "play jazz"}, now=70.0)
    hub.turn("Play music.", None, now=70.1)
    assert not joined(to_office)


def test_heard_after_the_turn_started_joins_and_gets_what_was_written() -> None:
    hub = FollowHub()
    kitchen, to_kitchen = follower(KITCHEN)
    hub.follow(kitchen, {"satellite_id": KITCHEN})
    tap = hub.turn("Tell me a story.", {"satellite_id": KITCHEN}, now=5.0)
    tap.piece("Once ")
    tap.piece("upon a time.")
    hub.heard(kitchen, {"text": "tell me a story"}, now=5.3)
    tap.close("Once upon a time.")
    assert [e.type for e in to_kitchen] == [
        follow.REPLY_START, "handled-chunk", "handled-chunk", "handled",
    ]  # fmt: skip
    # One heard joins one turn: the same words again join nothing more.
    hub.turn("Tell me a story.", {"satellite_id": KITCHEN}, now=5.5)
    assert sum(e.type == follow.REPLY_START for e in to_kitchen) == 1
    # A failed reply says so; a follower that left is never joined.
    hub.heard(kitchen, {"text": "again"}, now=9.0)
    hub.turn("Again.", {"satellite_id": KITCHEN}, now=9.1).close(None)
    assert to_kitchen[-1].type == follow.REPLY_FAILED
    hub.leave(kitchen)
    hub.heard(kitchen, {"text": "hello"}, now=12.0)
    hub.turn("Hello.", {"satellite_id": KITCHEN}, now=12.1)
    assert to_kitchen[-1].type == follow.REPLY_FAILED


# ---- the real thing: first sound in HA mode (following) against standalone ------------------

QUESTIONS = {
    "one": "Say hello in one short sentence.",
    "three": "Tell me a short story about a cat in three sentences.",
}


def _first_sound_ms(timing: Path) -> tuple[float, str]:
    [turn] = [json.loads(line) for line in timing.read_text().splitlines()][:1]
    stamps = turn["stamps"]
    assert stamps["first_played"] is not None, turn
    return (stamps["first_played"] - stamps["endpoint"]) * 1000, turn["reply"]


async def _ha_mode(
    server_port: int, mic: Path, tmp_path: Path, follow_on: bool
) -> tuple[float, str, bytes, int]:
    timing = tmp_path / f"ha-{follow_on}.jsonl"
    out = tmp_path / f"ha-{follow_on}-{{n}}.wav"
    extra = ("--server", f"tcp://127.0.0.1:{server_port}") if follow_on else ()
    # A microphone that never ends (silence, the question once on cue): the satellite stays
    # for all of HA's audio, however long the reply.
    command = mic_on_cue(tmp_path, read_wav(mic)[0])
    with ha_mode_satellite(
        tmp_path, "--name", "Kitchen satellite", "--mic-command", command,
        "--snd-wav", str(out), "--snd-realtime", "--timing-log", str(timing), *extra,
    ) as sat:  # fmt: skip
        async with FakeHomeAssistant(sat.port) as ha:
            await ha.send(RunSatellite().event())
            ha.keep_pinging()
            await until(lambda: sat.proc.poll() is None and "Microphone" in sat.log_text(), "mic")
            cue(tmp_path)
            stream = await ha.receive_stream()
            # A new conversation each time: the same question gets a reply of its own kind.
            reply = await ha_turn(ha, server_port, stream, KITCHEN, f"ha-{tmp_path.name}")
            await ha.read_until("played", timeout=120)
        log = sat.log_text()
    ms, _ = _first_sound_ms(timing)  # the timing line is written once the turn ends
    played = sorted(tmp_path.glob(f"ha-{follow_on}-*.wav"))
    assert len(played) == 1, (played, log[-3000:])  # HA's copy of the reply was not played
    pcm = read_wav(played[0])[0]
    dropped = "Dropping Home Assistant's audio of the reply we followed" in log
    assert dropped == follow_on, log[-3000:]
    check_reply_audio(pcm, 22050, reply)  # the whole reply, once
    return ms, reply, pcm, len(log)


async def test_first_sound_in_home_assistant_mode_against_standalone(
    server_port: int, speech_dir: Path, tmp_path: Path
) -> None:
    await warm(f"tcp://127.0.0.1:{server_port}")  # no figure pays a model load
    figures = []
    rounds = int(os.environ.get("PIVOICE_FOLLOW_ROUNDS", "1"))  # the bench figures: 3
    for n, (kind, question) in enumerate(list(QUESTIONS.items()) * rounds):
        # Long enough that the satellite is still there for all of HA's audio.
        mic = make_speech(question, speech_dir / f"follow-{kind}.wav", pad_after=1.0)
        standalone_timing = tmp_path / f"standalone-{kind}-{n}.jsonl"
        run_satellite(
            "--server", f"tcp://127.0.0.1:{server_port}", "--mic-wav", str(mic),
            "--snd-wav", str(tmp_path / f"sa-{kind}-{n}-{{n}}.wav"), "--snd-realtime",
            "--timing-log", str(standalone_timing), "--max-turns", "1",
        )  # fmt: skip
        standalone_ms, _ = _first_sound_ms(standalone_timing)
        here = tmp_path / f"{kind}-{n}"
        (here / "follow").mkdir(parents=True)
        (here / "plain").mkdir()
        following_ms, reply, pcm, _ = await _ha_mode(server_port, mic, here / "follow", True)
        plain_ms, _, _, _ = await _ha_mode(server_port, mic, here / "plain", False)
        assert len(pcm) / (2 * 22050) > 0.5  # it spoke
        figures.append(
            {
                "reply": kind,
                "standalone_ms": round(standalone_ms),
                "ha_following_ms": round(following_ms),
                "ha_plain_ms": round(plain_ms),
                "chars": len(reply),
                "sentences": reply.count(". ") + 1,
                "load_1min": round(os.getloadavg()[0], 1),
            }
        )
    print(json.dumps(figures))  # docs/home-assistant.md has them (speed is not asserted)
