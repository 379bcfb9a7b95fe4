"""Follow: in Home Assistant mode with --server, our server's reply to the satellite's HA turn
plays as it is written, and HA's copy of it is dropped. The join rule (server/follow.py) is
walked first with no I/O; then the real satellite, server and models, with the HA stand-in
doing what HA 2026.10's pipeline does (helpers.ha_turn), against the standalone satellite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from wyoming.audio import AudioFormat
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.handle import Handled, HandledChunk
from wyoming.satellite import RunSatellite

from pivoice_lab.bench.servers import warm
from wyoming_pivoice.conversation import ConversationStore
from wyoming_pivoice.satellite.ha import follow as satellite_follow
from wyoming_pivoice.satellite.protocols import AudioPiece
from wyoming_pivoice.server import follow
from wyoming_pivoice.server.follow import Follower, FollowHub
from wyoming_pivoice.server.services import Output

from .helpers import (
    FakeHomeAssistant,
    check_reply_audio,
    cue,
    exchange,
    ha_mode_satellite,
    ha_turn,
    make_speech,
    mic_on_cue,
    read_wav,
    run_satellite,
    stt,
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


class Scripted:
    """Services whose STT and LLM say what the test scripted (the control flow only: which
    turn gets which reply; the real models are in the tests below)."""

    def __init__(self, heard: str) -> None:
        self.heard = heard
        self.asked: list[tuple[list[Any], str]] = []
        self.stopped = 0
        self.release = asyncio.Event()  # the LLM's second piece waits for it
        self.conversations = ConversationStore("system")
        self.settings = SimpleNamespace(language="en")

    def transcribe(self, audio: Any, language: str | None) -> Output[str]:
        async def parts() -> AsyncIterator[str]:
            yield f" {self.heard}"

        output: Output[str] = Output()
        output.items = parts()
        return output

    def answer(self, key: str, earlier: list[Any], text: str, began: float) -> Output[str]:
        self.asked.append((list(earlier), text))

        async def pieces() -> AsyncIterator[str]:
            try:
                yield f"Reply to {text}"
                await self.release.wait()
                yield " (the end)."
            finally:
                self.stopped += 1

        output: Output[str] = Output()
        output.items = pieces()
        return output


async def _speculation(
    hub: FollowHub, f: Follower, services: Scripted, data: dict[str, Any] | None = None
) -> follow.Speculation:
    hub.speculate(f, b"\x01\x00" * 1600, services, "satellite-host", data)  # type: ignore[arg-type]
    spec = f.speculation
    assert spec is not None and spec.task is not None
    while not spec.pieces:  # the first piece is written; the second waits for `release`
        await spec.changed.wait()
        spec.changed.clear()
    return spec


async def _replay(spec: follow.Speculation) -> str:
    out = follow.speculated(spec)
    return "".join([piece async for piece in out])


async def test_a_speculation_answers_only_the_turn_with_its_very_prompt() -> None:
    """The speculative reply is used only when the turn's prompt is the speculation's: HA's
    transcript (of HA's own audio) is the same text, in the same history, for this satellite."""
    hub = FollowHub()
    kitchen, to_kitchen = follower(KITCHEN)
    hub.follow(kitchen, {"satellite_id": KITCHEN})
    services = Scripted("Where is Paris?")
    context = {"satellite_id": KITCHEN, "conversation_id": "ha-conversation"}

    spec = await _speculation(hub, kitchen, services)
    assert services.asked == [([], "Where is Paris?")]  # asked before HA's turn came
    # The satellite synthesizes it as it is written, but holds it: not played yet.
    assert [e.type for e in to_kitchen] == [follow.REPLY_START, "handled-chunk"]
    assert to_kitchen[0].data == {"text": "Where is Paris?", "speculated": True, "held": True}
    # The same words, the same (empty) history, this satellite: the turn takes it.
    claimed = hub.claim("Where is Paris?", context, [])
    assert claimed is spec and to_kitchen[-1].type == follow.REPLY_RELEASE
    tap = hub.turn("Where is Paris?", context, speculation=claimed)
    services.release.set()
    reply = await _replay(spec)
    assert reply == "Reply to Where is Paris? (the end)."
    for piece in spec.pieces:
        tap.piece(piece)
    tap.close(reply)
    assert len(services.asked) == 1  # one LLM run for the turn: the speculation's
    # The follower got the reply once, from the speculation, and HA's TTS of it waits for it.
    assert [e.type for e in to_kitchen] == [
        follow.REPLY_START, "handled-chunk", follow.REPLY_RELEASE, "handled-chunk", "handled",
    ]  # fmt: skip
    assert to_kitchen[-1].data["text"] == reply and hub._speaking[kitchen] is tap.turn

    # HA heard other words (other audio): the turn gets no speculation, and the speculation
    # is cancelled so that the turn's own run has the LLM.
    services.release.clear()
    spec = await _speculation(hub, kitchen, services)
    assert hub.claim("Where is London?", context, []) is None
    await asyncio.wait_for(asyncio.gather(spec.task, return_exceptions=True), 5)  # type: ignore[arg-type]
    assert spec.done and services.stopped == 2 and kitchen.speculation is None
    assert to_kitchen[-1].type == follow.REPLY_DROP  # its held audio never plays

    # The same words in another history: not the same prompt, not used.
    spec = await _speculation(hub, kitchen, services)
    assert hub.claim("Where is Paris?", context, [("Hello.", "Hi!")]) is None
    # Another satellite's turn with these words: not used either.
    spec = await _speculation(hub, kitchen, services)
    assert hub.claim("Where is Paris?", {"satellite_id": "assist_satellite.office"}, []) is None
    # HA's transcript came to the satellite with other words: cancelled before any turn.
    spec = await _speculation(hub, kitchen, services)
    hub.heard(kitchen, {"text": "where is london"})
    assert spec.done and kitchen.speculation is None
    # Speech resumed (the satellite's pivoice-void): cancelled.
    spec = await _speculation(hub, kitchen, services)
    hub.void(kitchen)
    assert spec.done and hub.claim("Where is Paris?", context, []) is None


async def test_the_next_speculation_guesses_the_conversation_ha_keeps() -> None:
    """HA keeps a satellite's conversation five minutes: the speculation is asked in the last
    joined turn's history, a new conversation's too; a client that started a conversation for
    each of three turns while the last one was kept gets an empty one, a user whose turns come
    minutes apart (a new HA conversation each) does not; nor does a new HA (`fresh`)."""
    hub = FollowHub()
    kitchen, _ = follower(KITCHEN)
    hub.follow(kitchen, {"satellite_id": KITCHEN})
    services = Scripted("And Berlin?")
    store = services.conversations

    async def joined_then_guessed(name: str, at: float, data: dict[str, Any] | None = None) -> Any:
        """A turn of conversation `name` at `at` joined; then what the next speculation is
        asked with."""
        key = store.key("ha-host", f"conversation-{name}")
        store.record(key, f"Turn {name}?", f"Reply {name}.")
        hub.heard(kitchen, {"text": f"turn {name}"}, now=at)
        hub.turn(f"Turn {name}?", {"satellite_id": KITCHEN}, now=at, key=key).close("Reply.")
        await _speculation(hub, kitchen, services, data)
        return services.asked[-1][0]

    assert await joined_then_guessed("one", 0.0) == [("Turn one?", "Reply one.")]
    # HA started a new conversation: the next turn is guessed in it.
    assert await joined_then_guessed("two", 10.0) == [("Turn two?", "Reply two.")]
    # Three joined turns in three conversations within HA's five minutes: a client that
    # starts one per turn.
    assert await joined_then_guessed("three", 20.0) == []
    # HA (re)connected to the satellite and no turn of it has come since (`fresh`): HA's entity
    # starts a new conversation (the real HA 2026.10, a new HA per test: the first turn missed
    # the speculation asked in the last conversation's history) …
    await _speculation(hub, kitchen, services, {"fresh": True})
    assert services.asked[-1][0] == []
    # … and its turn in a conversation of its own is no client's new one per turn.
    assert await joined_then_guessed("four", 30.0) == [("Turn four?", "Reply four.")]
    # A user's turns minutes apart: each a new HA conversation (HA's had expired), each one's
    # follow-up guessed in it (session 13's rule guessed an empty one from the third on).
    for n, at in (("five", 400.0), ("six", 800.0), ("seven", 1200.0)):
        assert await joined_then_guessed(n, at) == [(f"Turn {n}?", f"Reply {n}.")]
    hub.leave(kitchen)


class Voice:
    """A StreamingSynthesizer that 'speaks' each phrase as its UTF-8 bytes (control flow)."""

    def __init__(self, link: object) -> None:
        pass

    async def speak(self, phrases: Any, audio: Any, clock: object) -> None:
        while (phrase := await phrases.get()) is not None:
            audio.put_nowait(AudioPiece(phrase.encode(), AudioFormat(22050, 2, 1)))
        audio.put_nowait(None)


async def test_the_satellite_plays_a_held_reply_only_once_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A speculation's reply is synthesized at once but reaches the state machine (joined,
    audio, text, done) only at `pivoice-reply-release`; dropped, nothing of it does."""
    monkeypatch.setattr(satellite_follow, "StreamingSynthesizer", Voice)
    calls: list[str] = []
    f = satellite_follow.Follow(
        "tcp://127.0.0.1:1", KITCHEN, 10,
        on_joined=lambda: calls.append("joined") is None,
        on_audio=lambda piece: calls.append(piece.pcm.decode()),
        on_text=lambda text: calls.append(f"text {text}"),
        on_done=lambda: calls.append("done"),
        clock=lambda: None,
    )  # fmt: skip
    f.connected = True
    reply = "Paris is in France. It is big."
    for event in (
        Event(follow.REPLY_START, {"text": "Where is Paris?", "speculated": True, "held": True}),
        HandledChunk(text="Paris is in France. ").event(),
        HandledChunk(text="It is big.").event(),
        Handled(text=reply).event(),
    ):
        f._received(event)
    assert f._speaking is not None
    await f._speaking  # all synthesized: held, nothing handed on
    assert calls == [] and f._outbox.empty()
    f._received(Event(follow.REPLY_RELEASE, {}))
    assert calls == ["joined", "Paris is in France.", "It is big.", f"text {reply}", "done"]
    assert f._outbox.get_nowait().type == follow.SPOKEN  # HA's TTS of it may go now

    calls.clear()
    f._received(Event(follow.REPLY_START, {"text": "Hi", "speculated": True, "held": True}))
    f._received(HandledChunk(text="Hello there, friend.").event())
    task = f._speaking
    f._received(Event(follow.REPLY_DROP, {}))
    f._received(Event(follow.REPLY_RELEASE, {}))  # late: nothing is held any more
    assert task is not None and f._speaking is None
    with contextlib.suppress(asyncio.CancelledError):
        await task  # its synthesis is over, and hands nothing on
    assert calls == [] and f._outbox.empty()


async def test_the_satellite_says_when_no_turn_came_since_ha_connected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pivoice-speculate{fresh}` from HA's (re)connection until our server joins a turn of
    ours (held or not): the server then guesses a new conversation (server/follow.py)."""
    monkeypatch.setattr(satellite_follow, "StreamingSynthesizer", Voice)
    f = satellite_follow.Follow(
        "tcp://127.0.0.1:1", KITCHEN, 10, on_joined=lambda: False, on_audio=lambda piece: None,
        on_text=lambda text: None, on_done=lambda: None, clock=lambda: None,
    )  # fmt: skip
    f.connected = True

    def speculated() -> dict[str, Any]:
        while not f._outbox.empty():  # what a join said back (pivoice-spoken): not this test's
            f._outbox.get_nowait()
        f.speculate(b"\x00\x00" * 160)
        event = f._outbox.get_nowait()
        assert event.type == follow.SPECULATE and event.payload
        return dict(event.data)

    assert speculated() == {"fresh": True}  # a new satellite: HA has just connected
    f._received(Event(follow.REPLY_START, {"text": "Where is Paris?"}))  # a turn joined
    assert speculated() == {}
    f.ha_connected()
    assert speculated() == {"fresh": True}
    f._received(Event(follow.REPLY_START, {"text": "Hi", "speculated": True, "held": True}))
    assert speculated() == {"fresh": True}  # held: not yet a turn of ours
    f._received(Event(follow.REPLY_RELEASE, {}))  # not this run's (on_joined): discarded
    assert speculated() == {} and f._speaking is None


async def _followed(sat: AsyncTcpClient) -> tuple[list[str], Event]:
    """What the follower is sent up to the `handled` of the reply it is to play: released
    (our speculation's) or joined afresh; its event types, and that `handled`."""
    seen: list[str] = []
    async with asyncio.timeout(120):
        while (event := await sat.read_event()) is not None:
            held = event.type == follow.REPLY_START and event.data.get("held")
            seen.append(f"{event.type} (held)" if held else event.type)
            ours = follow.REPLY_RELEASE in seen or follow.REPLY_START in seen
            if ours and event.type == "handled":
                return seen, event
    raise ConnectionError("the server closed before the reply's handled")


async def test_the_real_server_uses_a_speculation_only_for_the_same_words(
    server_port: int, speech_dir: Path
) -> None:
    """On the real models: the satellite's speculative audio and HA's audio of the same words
    → the turn is answered by the speculation (and HA's transcript is its own STT's); HA's
    audio of other words → the speculation is dropped unplayed and the turn answered afresh.
    The follower plays the very reply HA gets."""
    paris = read_wav(make_speech("Where is Paris?", speech_dir / "spec-paris.wav"))[0]
    moon = read_wav(make_speech("Tell me about the moon.", speech_dir / "spec-moon.wav"))[0]
    context = {"conversation_id": f"spec-{os.getpid()}", "satellite_id": KITCHEN}
    held = f"{follow.REPLY_START} (held)"
    async with AsyncTcpClient("127.0.0.1", server_port) as sat:
        await sat.write_event(Event(follow.FOLLOW, {"satellite_id": KITCHEN}))
        for spoken, ha_audio, used in ((paris, paris, True), (paris, moon, False)):
            await sat.write_event(Event(follow.SPECULATE, {}, payload=spoken))
            text = await stt(server_port, ha_audio)  # HA's STT of HA's audio, as always
            assert ("paris" in text.lower()) == (ha_audio is paris), text
            await sat.write_event(Event(follow.HEARD, {"text": text}))
            turn = Event("transcript", {"text": text, "context": context})
            handled = (await exchange(server_port, [turn], until="handled"))[-1]
            seen, ours = await _followed(sat)
            assert seen[0] == held, seen  # synthesized before HA's turn came, held
            if used:
                assert follow.REPLY_RELEASE in seen and follow.REPLY_START not in seen, seen
            else:
                assert seen.index(follow.REPLY_DROP) < seen.index(follow.REPLY_START), seen
                assert follow.REPLY_RELEASE not in seen, seen
            assert ours.data["text"] == handled.data["text"] and handled.data["text"]
            await sat.write_event(Event(follow.SPOKEN, {}))


# ---- the real thing: first sound in HA mode (following) against standalone ------------------

QUESTIONS = {
    "one": "Say hello in one short sentence.",
    "three": "Tell me a short story about a cat in three sentences.",
}


def _first_sound(timing: Path) -> tuple[float, str, float | None]:
    """First played sample after the endpoint (ms), the reply, and how much of that came
    before the transcript (ms): STT (standalone: speculated), and in HA mode HA's hop."""
    [turn] = [json.loads(line) for line in timing.read_text().splitlines()][:1]
    stamps = turn["stamps"]
    assert stamps["first_played"] is not None, turn
    heard = stamps.get("transcript")
    to_transcript = (heard - stamps["endpoint"]) * 1000 if heard is not None else None
    return (stamps["first_played"] - stamps["endpoint"]) * 1000, turn["reply"], to_transcript


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
    ms, _, to_transcript = _first_sound(timing)  # the timing line is written once the turn ends
    played = sorted(tmp_path.glob(f"ha-{follow_on}-*.wav"))
    assert len(played) == 1, (played, log[-3000:])  # HA's copy of the reply was not played
    pcm = read_wav(played[0])[0]
    dropped = "Dropping Home Assistant's audio of the reply we followed" in log
    assert dropped == follow_on, log[-3000:]
    check_reply_audio(pcm, 22050, reply)  # the whole reply, once
    return ms, reply, pcm, to_transcript


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


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
        standalone_ms, _, standalone_stt = _first_sound(standalone_timing)
        here = tmp_path / f"{kind}-{n}"
        (here / "follow").mkdir(parents=True)
        (here / "plain").mkdir()
        following_ms, reply, pcm, following_stt = await _ha_mode(
            server_port, mic, here / "follow", True
        )
        plain_ms, _, _, _ = await _ha_mode(server_port, mic, here / "plain", False)
        assert len(pcm) / (2 * 22050) > 0.5  # it spoke
        figures.append(
            {
                "reply": kind,
                "standalone_ms": round(standalone_ms),
                "ha_following_ms": round(following_ms),
                "ha_plain_ms": round(plain_ms),
                "standalone_to_transcript_ms": _round(standalone_stt),
                "ha_following_to_transcript_ms": _round(following_stt),
                "chars": len(reply),
                "sentences": reply.count(". ") + 1,
                "load_1min": round(os.getloadavg()[0], 1),
            }
        )
    print(json.dumps(figures))  # docs/home-assistant.md has them (speed is not asserted)
