"""Server-side faults: an LLM or a TTS that fails ends the request with an `error` event and
the in-band end its client waits for (`not-handled`, `audio-stop`, `synthesize-stopped`), and
the next request, on the same connection and on a new one, works.

The engines are the real ones; only the failing part is a stand-in (a wrapper that raises
when the text asks it to), since a real model cannot be made to fail on cue.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any, cast

import pytest
import pytest_asyncio
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from wyoming_pivoice.engines.chat import SlotChat
from wyoming_pivoice.engines.llm import LlamaChat
from wyoming_pivoice.engines.runtime import ModelSlot
from wyoming_pivoice.engines.tts import PiperTts
from wyoming_pivoice.server.converse import SLOW_REPLY
from wyoming_pivoice.server.services import Services
from wyoming_pivoice.settings import ServerSettings
from wyoming_pivoice.wire.errors import ErrorCode

from .helpers import exchange, in_process_server, read_until, turn_event

FAIL = "explode"  # a text with this word makes the stand-in fail
STALL = "stall"  # and with this one it writes two pieces, then nothing until cancelled


class EngineFailure(RuntimeError):
    """What a crashing engine raises."""


class FailingLlm:
    """The real LLM, except that a turn asking to explode fails after a few pieces."""

    def __init__(self, real: LlamaChat) -> None:
        self.real = real
        self.stalled: threading.Event | None = None  # the cancel of the stalled reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def stream(self, messages, max_tokens=None, cancel=None, pause=None) -> Iterator[str]:
        if STALL in messages[-1]["content"]:  # a model that stops writing (a starved one)
            if "at once" not in messages[-1]["content"]:
                yield from ["Let me ", "think"]
            self.stalled = cancel
            assert cancel is not None
            cancel.wait(60)  # bounded: a missed cut fails the test, never hangs it
            yield " some more."
            return
        failing = FAIL in messages[-1]["content"]
        if failing and "at once" in messages[-1]["content"]:
            raise EngineFailure("llama.cpp failed before the first token")
        for i, piece in enumerate(self.real.stream(messages, max_tokens, cancel, pause)):
            if failing and i == 3:
                break
            yield piece
        if failing:
            raise EngineFailure("llama.cpp failed mid-reply")


class FailingTts:
    """The real voice, except that a text asking to explode fails on its second piece (or
    its only one)."""

    def __init__(self, real: PiperTts) -> None:
        self.real = real
        self.failing: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def pieces(self, text: str) -> list[str]:
        pieces = self.real.pieces(text)
        if FAIL in text:
            self.failing.add(pieces[min(1, len(pieces) - 1)])
        return pieces

    def speak(self, piece: str, speaker=None, cancel=None) -> Iterator[bytes]:
        if piece in self.failing:
            raise EngineFailure("piper failed")
        yield from self.real.speak(piece, speaker, cancel)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def faulty() -> AsyncIterator[tuple[int, Services]]:
    """An in-process server on the real LLM and voice, each wrapped to fail on cue."""
    settings = ServerSettings()
    real = Services.from_settings(settings)
    services = Services.from_settings(settings)
    services.llm = SlotChat(ModelSlot("failing llm", lambda: FailingLlm(LlamaChat(settings.llm))))
    services.tts = ModelSlot("failing tts", lambda: FailingTts(PiperTts(settings.tts)))
    services.asr = real.asr  # loaded only if a test transcribes (none does)
    services.llm.start_loading()
    services.tts.start_loading()
    async with in_process_server(services) as port:
        yield port, services


def audio_seconds(replies: list[Event]) -> float:
    pcm = b"".join(e.payload or b"" for e in replies if e.type == "audio-chunk")
    return len(pcm) / (2 * 22050)


async def nothing_more(client: AsyncTcpClient) -> None:
    """Nothing else comes for the failed request (ping, then the very next event is pong)."""
    await client.write_event(Event("ping", {"text": "after"}))
    event = await client.read_event()
    assert event is not None and event.type == "pong", event


@pytest.mark.parametrize("said", [True, False])
async def test_a_reply_that_stops_coming_ends_at_the_reply_timeout(
    faulty: tuple[int, Services], monkeypatch: pytest.MonkeyPatch, said: bool
) -> None:
    port, services = faulty
    limits = replace(services.settings.limits, reply_timeout=3.0)
    monkeypatch.setattr(services, "settings", replace(services.settings, limits=limits))
    engine = await cast(Any, services.llm).slot.get()  # the FailingLlm
    async with AsyncTcpClient("127.0.0.1", port) as client:
        text = f"Please {STALL} now." if said else f"Please {STALL} at once."
        await client.write_event(turn_event(text, f"stalled-{said}"))
        replies = await read_until(client, "handled-stop", "not-handled", timeout=60)
        types = [e.type for e in replies]
        # What Home Assistant waits for, in time, with what the model wrote by then.
        assert types[0] == "handled-start" and types[-2:] == ["handled", "handled-stop"], types
        assert replies[-2].data["text"] == ("Let me think" if said else SLOW_REPLY)
        assert "".join(e.data["text"] for e in replies[1:-2]) == replies[-2].data["text"]
        await nothing_more(client)
        # The stalled generation was told to stop, and the model serves the next turn.
        assert engine.stalled is not None and engine.stalled.is_set()
        await good_turn(client)


async def good_turn(client: AsyncTcpClient, conversation_id: str | None = None) -> str:
    await client.write_event(turn_event("What is the capital of France?", conversation_id))
    replies = await read_until(client, "handled-stop", "error")
    assert [e.type for e in replies][-2:] == ["handled", "handled-stop"], replies[-1]
    text = replies[-2].data["text"]
    assert text and text == "".join(e.data["text"] for e in replies[1:-2]).strip()
    return text


@pytest.mark.parametrize("when", ["mid-reply", "at once"])
async def test_llm_failure_ends_the_turn_with_an_error(
    faulty: tuple[int, Services], when: str
) -> None:
    port, services = faulty
    conversation = f"faulty-conversation-{when}"
    async with AsyncTcpClient("127.0.0.1", port) as client:
        text = f"Please {FAIL} now." if when == "mid-reply" else f"Please {FAIL} at once."
        await client.write_event(turn_event(text, conversation))
        replies = await read_until(client, "handled-stop", "handled")
        types = [e.type for e in replies]
        # `error`, then what Home Assistant waits for (it ignores `error`), then the run's end.
        assert types[0] == "handled-start", types
        assert types[-3:] == ["error", "not-handled", "handled-stop"], types
        assert replies[-2].data["text"]  # a short text HA can say
        if when == "mid-reply":
            assert 1 <= types.count("handled-chunk") <= 3  # what was said before the failure
        error = replies[-3].data
        assert error["code"] == ErrorCode.INTERNAL and "llama.cpp failed" in error["text"]
        await nothing_more(client)
        # The same connection, the same conversation: the next turn is answered, and the
        # failed turn was not kept in the conversation's history.
        await good_turn(client, conversation)
    store = services.conversations
    history = store.messages(store.key("127.0.0.1", conversation), "next")
    assert not any(FAIL in m["content"] for m in history)
    assert len(history) == 4  # system, the good turn and its answer, the next text
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await good_turn(client)


async def test_tts_failure_ends_the_synthesis_with_an_error(faulty: tuple[int, Services]) -> None:
    port, _ = faulty
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(
            Synthesize(text=f"The first sentence is fine. This one will {FAIL}.").event()
        )
        replies = await read_until(client, "audio-stop")
        types = [e.type for e in replies]
        # The error, then the audio run's end: HA's plain TTS waits for audio-stop.
        assert types[0] == "audio-start" and types[-2:] == ["error", "audio-stop"], types
        assert audio_seconds(replies) > 0.5  # the first sentence was spoken before the failure
        assert replies[-2].data["code"] == ErrorCode.INTERNAL
        assert "piper failed" in replies[-2].data["text"]
        await nothing_more(client)
        await client.write_event(Synthesize(text="The kitchen lights are on.").event())
        replies = await read_until(client, "audio-stop", "error")
        assert replies[-1].type == "audio-stop" and audio_seconds(replies) > 0.8
    replies = await exchange(port, [Synthesize(text="All good.").event()], "audio-stop")
    assert audio_seconds(replies) > 0.3


async def test_tts_failure_in_a_stream_still_ends_the_stream(
    faulty: tuple[int, Services],
) -> None:
    """A failed sentence is reported; the other sentences are spoken; `synthesize-stopped`
    still comes (streaming clients such as Home Assistant wait for it)."""
    port, _ = faulty
    async with AsyncTcpClient("127.0.0.1", port) as client:
        # The failing sentence is the last: it is spoken by the job that also ends the stream.
        pieces = ["Good morning. ", "The heating is on. ", f"Now {FAIL} please."]
        for event in (
            SynthesizeStart().event(),
            *[SynthesizeChunk(text=p).event() for p in pieces],
            SynthesizeStop().event(),
        ):
            await client.write_event(event)
        replies = await read_until(client, "synthesize-stopped")
        types = [e.type for e in replies]
        assert types.count("error") == 1 and types[-1] == "synthesize-stopped"
        # "Good morning.", "The heating is on." and the failed sentence's run, closed.
        assert types.count("audio-stop") == types.count("audio-start") == 3
        assert types.index("error") < types.index("synthesize-stopped")
        await nothing_more(client)


async def test_model_that_fails_to_load_answers_errors_and_describe_still_works() -> None:
    def broken() -> Any:
        raise EngineFailure("model file is corrupt")

    services = Services.from_settings(ServerSettings())
    slot = ModelSlot("broken", broken)
    services.asr = services.tts = slot
    services.llm = SlotChat(slot)
    services.start_loading()
    async with in_process_server(services) as port:
        for request in (turn_event("Hello."), Synthesize(text="Hello.").event()):
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(request)
                await client.write_event(Describe().event())
                # The failed request's error and in-band end, then describe's info (replies
                # keep the order of requests).
                replies = await read_until(client, "info", timeout=30)
                [error] = [e.data for e in replies if e.type == "error"]
                assert error["code"] == ErrorCode.INTERNAL
                assert "model file is corrupt" in error["text"]
                assert {"not-handled", "audio-stop"} & {e.type for e in replies}


# A turn longer than the LLM's context is no longer a failure: it is trimmed
# (tests/test_conversation_budget.py, on the real model and through the server).
