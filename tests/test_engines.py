"""Engine contracts (engines/protocols.py) and the registry: a new engine is one class and
one registry line, and the server serves it without naming it anywhere."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from wyoming.event import Event
from wyoming.info import Describe

from wyoming_pivoice.engines import registry
from wyoming_pivoice.engines.chat import SlotChat
from wyoming_pivoice.engines.protocols import EngineDescription, Message, TokenCounter
from wyoming_pivoice.engines.runtime import ModelSlot
from wyoming_pivoice.engines.tts import TtsSettings
from wyoming_pivoice.server.services import Services
from wyoming_pivoice.settings import ServerSettings

from .helpers import exchange, in_process_server


class ToneTts:
    """A second TTS engine, registered from this test only: each piece is a short tone
    (a control-flow stand-in, not a voice)."""

    sample_rate = 8000
    sample_width = 2
    channels = 1

    def __init__(self, settings: TtsSettings) -> None:
        self.settings = settings

    @classmethod
    def describe(cls, settings: TtsSettings) -> EngineDescription:
        return EngineDescription(
            kind="tts",
            engine="tone",
            model=settings.voice,
            languages=("xx",),
            attribution="the tests",
            url="https://example.invalid/tone",
            speakers=("low", "high"),
            sample_rate=cls.sample_rate,
        )

    @property
    def name(self) -> str:
        return self.settings.voice

    def speaker_id(self, speaker: str | None) -> int | None:
        if speaker in (None, "low", "high"):
            return None if speaker is None else ("low", "high").index(speaker)
        raise ValueError(f"no speaker {speaker!r}")

    def pieces(self, text: str) -> list[str]:
        return [w for w in text.split() if w]

    def speak(
        self, piece: str, speaker: str | None = None, cancel: threading.Event | None = None
    ) -> Iterator[bytes]:
        pitch = 880.0 if speaker == "high" else 440.0
        t = np.arange(int(0.1 * self.sample_rate * len(piece))) / self.sample_rate
        yield (np.sin(2 * np.pi * pitch * t) * 8000).astype(np.int16).tobytes()

    def warm_up(self) -> None:
        pass


@pytest.fixture
def tone_registered() -> Iterator[None]:
    registry.register("tts", "tone", ToneTts)
    try:
        yield
    finally:
        registry.unregister("tts", "tone")


async def test_a_second_tts_engine_is_one_registry_line(tone_registered: None) -> None:
    settings = ServerSettings(tts=TtsSettings(engine="tone", voice="tone-a"))
    services = Services.from_settings(settings)
    services.tts.start_loading()
    async with in_process_server(services) as port:
        [info] = await exchange(port, [Describe().event()], until="info")
        [program] = info.data["tts"]
        [voice] = program["voices"]
        assert program["name"] == "pivoice-tone"
        assert voice["name"] == "tone-a" and voice["languages"] == ["xx"]
        assert [s["name"] for s in voice["speakers"]] == ["low", "high"]
        replies = await exchange(
            port,
            [Event("synthesize", {"text": "one three", "voice": {"speaker": "high"}})],
            until="audio-stop",
        )
    start = next(e for e in replies if e.type == "audio-start")
    pcm = b"".join(e.payload or b"" for e in replies if e.type == "audio-chunk")
    assert start.data["rate"] == 8000
    assert len(pcm) == 2 * int(0.1 * 8000 * 3) + 2 * int(0.1 * 8000 * 5)  # "one", "three"


def test_an_unknown_engine_is_named_with_those_there_are() -> None:
    with pytest.raises(registry.UnknownEngine, match=r"no tts engine .nope.*piper"):
        registry.describe("tts", TtsSettings(engine="nope"))


class BlockingChat:
    """A blocking chat engine (llama.cpp's shape): stream() is an iterator for a thread."""

    context_size = 512

    def count_tokens(self, messages: list[Message]) -> int:
        return sum(len(m["content"].split()) for m in messages)

    def stream(self, messages, max_tokens=None, cancel=None, pause=None) -> Iterator[str]:
        for piece in ("Paris ", "is ", "the capital."):
            if pause is not None:
                pause()
            yield piece


class AsyncChat(BlockingChat):
    """An async one (the remote engine's shape): stream() is an async generator."""

    async def stream(  # type: ignore[override]
        self, messages, max_tokens=None, cancel=None, pause=None
    ) -> AsyncIterator[str]:
        for piece in ("Paris ", "is ", "the capital."):
            await asyncio.sleep(0)
            yield piece


class AsyncSlot:
    """Stands where RemoteLlmSlot stands: no lock, the engine's async stream on the loop."""

    name = "async"
    loaded = True

    def __init__(self, engine: AsyncChat) -> None:
        self.engine = engine

    def start_loading(self) -> None:
        pass

    async def stream(self, fn):  # type: ignore[no-untyped-def]
        async for piece in fn(self.engine, threading.Event()):
            yield piece


@pytest.mark.parametrize("kind", ["blocking", "async"])
async def test_one_async_chat_contract_over_both_engine_shapes(kind: str) -> None:
    chat = SlotChat(
        ModelSlot("blocking", BlockingChat) if kind == "blocking" else AsyncSlot(AsyncChat())
    )
    counted: list[int] = []
    seen: list[list[Message]] = []

    def prompt(counter: TokenCounter) -> list[Message]:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        counted.append(counter.count_tokens(messages))
        return messages

    pauses: list[None] = []
    pieces = [
        p
        async for p in chat.reply(
            prompt,
            pause=lambda: pauses.append(None),
            on_prompt=lambda _engine, messages: seen.append(messages),
        )
    ]
    assert "".join(pieces) == "Paris is the capital."
    assert counted == [6] and len(seen) == 1
    assert len(pauses) == (3 if kind == "blocking" else 0)  # the remote has nothing to yield to


def test_every_builtin_engine_describes_itself_without_loading() -> None:
    settings = ServerSettings()
    asr = registry.describe("asr", settings.asr)
    voice = registry.describe("tts", settings.tts)
    chat = registry.describe("chat", settings.llm)
    vad = registry.describe("vad", None)
    assert (asr.model, asr.languages) == ("tiny.en", ("en",))
    assert voice.model == "en_US-joe-medium" and voice.sample_rate == 22050
    assert voice.languages == ("en_US",) and voice.version == "1.0.0"
    assert chat.engine == "llama.cpp" and chat.languages == ("en",)
    assert vad.model == "silero-vad"


def test_program_names_home_assistant_shows_stay_as_they_were() -> None:
    from wyoming_pivoice.engines.remote_llm import RemoteLlmSettings

    info = Services.from_settings(ServerSettings()).description.info().event().data
    assert [info[k][0]["name"] for k in ("asr", "tts", "handle")] == [
        "pivoice-faster-whisper",
        "pivoice-piper",
        "pivoice-llama",
    ]
    remote = ServerSettings(remote_llm=RemoteLlmSettings(url="http://127.0.0.1:9/v1"))
    handle = Services.from_settings(remote).description.info().event().data["handle"][0]
    assert handle["name"] == "pivoice-llama"  # one agent, whichever engine answers
