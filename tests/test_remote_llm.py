"""The conversation on a real OpenAI-compatible engine (`--llm-url`): llama-cpp-python's own
server on the embedded SmolLM2, started here on loopback, behind our Wyoming server.

A turn streams back from it; the engine killed mid-reply ends that turn with `not-handled`
and an error, and the next turns work again once it is back; a satellite's cancelled
speculative turn closes the HTTP stream and the engine stops generating; with
`--llm-fallback local` the local model answers while the engine is down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest
import pytest_asyncio
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe

from pivoice_lab.bench import remote as bench_remote
from pivoice_lab.ports import refused_port
from wyoming_pivoice.doctor.base import Status
from wyoming_pivoice.doctor.remote import check_remote_llm
from wyoming_pivoice.engines.remote_llm import RemoteLlmSettings
from wyoming_pivoice.engines.remote_slot import RemoteLlmSlot
from wyoming_pivoice.satellite.stages import ServerLink, StreamingResponder
from wyoming_pivoice.server.services import Services
from wyoming_pivoice.settings import ServerSettings
from wyoming_pivoice.timing import TurnClock

from .helpers import (
    in_process_server,
    read_until,
    server_process,
    turn_event,
    wait_until,
)
from .llama_server import DISCONNECTED, GENERATED, MODEL_ALIAS, LlamaServer, started

CHAT = "POST /v1/chat/completions"
# SmolLM2 writes all the tokens --max-tokens allows for this (64: about 3 s here), far more
# than the few pieces a test waits for.
LONG = "Write a long story about a dragon who lives in a castle."
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with started(tmp_path_factory.mktemp("engine")) as server:
        yield server


@pytest.fixture
def running(engine: LlamaServer) -> LlamaServer:
    """The engine, started again if an earlier test killed it."""
    engine.ensure_running()
    return engine


async def answered(client: AsyncTcpClient, text: str, conversation_id: str | None = None) -> str:
    """A turn that works: streamed pieces, then `handled` holding all of them."""
    await client.write_event(turn_event(text, conversation_id))
    replies = await read_until(client, "handled-stop", "error")
    types = [e.type for e in replies]
    assert types[0] == "handled-start" and types[-2:] == ["handled", "handled-stop"], replies[-1]
    reply = replies[-2].data["text"]
    assert reply and reply == "".join(e.data["text"] for e in replies[1:-2]).strip()
    return reply


async def failure(client: AsyncTcpClient, timeout: float = 30) -> tuple[list[str], str]:
    """The rest of a failed turn: it ends with `not-handled` (what Home Assistant waits for)
    and an `error` (the reason), in either order, maybe followed by `handled-stop` for a
    streaming client; then nothing more (a ping's pong is next). (event types, error text)."""
    replies = await read_until(client, "not-handled", "error", "handled-stop", timeout=timeout)
    end = {"not-handled": "error", "error": "not-handled"}.get(replies[-1].type)
    assert end is not None, [e.type for e in replies]
    replies += await read_until(client, end, "handled-stop", timeout=timeout)
    await client.write_event(Event("ping", {"text": "after"}))
    replies += await read_until(client, "pong", timeout=timeout)
    types = [e.type for e in replies]
    assert "handled" not in types, types
    tail = types[types.index("error") :] if "error" in types else types
    assert set(tail) <= {"error", "not-handled", "handled-stop", "pong"}, types
    assert tail.count("handled-stop") <= 1 and types[-1] == "pong", types
    return types, next(e.data["text"] for e in replies if e.type == "error")


async def failed(client: AsyncTcpClient, text: str) -> str:
    """A turn that fails; the error's text."""
    await client.write_event(turn_event(text))
    return (await failure(client))[1]


@pytest.fixture(scope="module")
def pivoice(engine: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`wyoming-pivoice server --llm-url …` as a user starts it."""
    log = tmp_path_factory.mktemp("pivoice") / "server.log"
    args = ("--llm-url", engine.url, "--llm-timeout", "20", "--max-tokens", str(MAX_TOKENS))
    with server_process(*args, log=log) as port:
        # Its start-up probe has reached the engine: the tests count the requests after it.
        wait_until(lambda: "Loaded LLM (remote" in log.read_text(), "remote LLM probe", 60)
        yield port


async def test_a_turn_streams_from_the_remote_engine(running: LlamaServer, pivoice: int) -> None:
    asked = running.count(CHAT)
    async with AsyncTcpClient("127.0.0.1", pivoice) as client:
        await client.write_event(Describe().event())
        (info,) = await read_until(client, "info")
        (handle,) = info.data["handle"]
        assert running.url in handle["description"]
        assert "now answering: remote" in handle["description"]

        await client.write_event(turn_event(LONG, "remote-1"))
        replies = await read_until(client, "handled-stop", "error")
        assert [e.type for e in replies][-2:] == ["handled", "handled-stop"], replies[-1]
        pieces = [e.data["text"] for e in replies if e.type == "handled-chunk"]
        assert len(pieces) >= 5  # streamed piece by piece, not in one block
        assert replies[-2].data["text"] == "".join(pieces).strip()
        assert replies[-2].data["context"]["conversation_id"] == "remote-1"
        # The same conversation goes on, on the same connection.
        await answered(client, "What was the dragon's name?", "remote-1")
    assert running.count(CHAT) == asked + 2


async def test_engine_killed_mid_reply_then_back(running: LlamaServer, pivoice: int) -> None:
    async with AsyncTcpClient("127.0.0.1", pivoice) as client:
        await client.write_event(turn_event(LONG))
        first = await read_until(client, "handled-chunk", "handled-stop", "error")
        assert first[-1].type == "handled-chunk", [e.type for e in first]
        running.kill()
        killed = time.monotonic()
        _, error = await failure(client)
        assert "connection lost mid-reply" in error
        assert time.monotonic() - killed < 5  # noticed at once, not after the timeout

        # Down: the turn fails at once, with the reason.
        start = time.monotonic()
        assert "unreachable" in await failed(client, "Hello?")
        assert time.monotonic() - start < 5

        # Back on the same address: the next turn works, on the same connection.
        running.start()
        await answered(client, "Hello again.")


async def test_a_cancelled_speculative_turn_stops_the_remote_generation(
    running: LlamaServer, pivoice: int
) -> None:
    """The satellite cancels a speculative run by cancelling its task, which closes its
    connection; the server's HTTP stream to the engine closes with it."""
    link = ServerLink(f"tcp://127.0.0.1:{pivoice}")
    responder = StreamingResponder(link, "kitchen", "spec")
    got_piece = asyncio.Event()
    pieces: list[str] = []

    async def speculative_run() -> None:
        async for piece in responder.respond(LONG, TurnClock(1)):
            pieces.append(piece)
            got_piece.set()

    disconnects = running.count(DISCONNECTED)
    generations = running.count(GENERATED)
    run = asyncio.create_task(speculative_run())
    async with asyncio.timeout(60):
        await got_piece.wait()
    run.cancel()
    cancelled = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await run
    stopped = await running.wait_for(DISCONNECTED, disconnects, timeout=20)
    assert stopped - cancelled < 3, running.text()[-3000:]  # the whole reply: seconds more
    # The engine stopped there: the cancelled generation never reached its end (where
    # llama.cpp prints its timings), and the next turn's is the only one that did.
    async with AsyncTcpClient("127.0.0.1", pivoice) as client:
        await answered(client, "Say hi.")
    await running.wait_for(GENERATED, generations)
    assert running.count(GENERATED) == generations + 1, running.text()[-3000:]


async def test_doctor_checks_the_remote_engine(running: LlamaServer) -> None:
    settings = RemoteLlmSettings(url=running.url)
    finding = await asyncio.to_thread(check_remote_llm, settings)
    assert finding.status in (Status.OK, Status.WARN), finding
    assert finding.data["models"] == [MODEL_ALIAS] and finding.data["model"] == MODEL_ALIAS
    assert 0 < finding.data["first_piece_s"] < 30

    wrong = await asyncio.to_thread(check_remote_llm, replace(settings, model="llama-70b"))
    assert wrong.status is Status.FAIL and "does not list the model 'llama-70b'" in wrong.message

    with refused_port() as port:
        nobody = RemoteLlmSettings(url=f"http://127.0.0.1:{port}/v1")
        down = await asyncio.to_thread(check_remote_llm, nobody)
    assert down.status is Status.FAIL and "unreachable" in down.message


@pytest_asyncio.fixture(loop_scope="session")
async def with_fallback(running: LlamaServer) -> AsyncIterator[tuple[int, Services]]:
    """An in-process server on the engine with `--llm-fallback local` (no ASR or TTS loaded)."""
    remote = RemoteLlmSettings(url=running.url, timeout=20, fallback="local")
    services = Services.from_settings(ServerSettings(remote_llm=remote))
    slot = services.llm.slot  # type: ignore[attr-defined]
    assert isinstance(slot, RemoteLlmSlot)
    slot.retry_after_s = 0.0  # try the engine again at every turn: it is back below
    slot.start_loading()
    # Its start-up probe has reached the engine (the test counts the requests after it).
    async with asyncio.timeout(60):
        while not (slot.loaded and slot.fallback is not None and slot.fallback.loaded):
            await asyncio.sleep(0.05)
    async with in_process_server(services) as port:
        yield port, services


async def test_fallback_answers_with_the_local_model_while_the_engine_is_down(
    running: LlamaServer, with_fallback: tuple[int, Services], caplog: pytest.LogCaptureFixture
) -> None:
    port, services = with_fallback
    slot = services.llm.slot  # type: ignore[attr-defined]
    assert isinstance(slot, RemoteLlmSlot) and slot.fallback is not None
    running.kill()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await answered(client, "What is the capital of France?", "fallback")
        assert "the local model answers" in caplog.text and "unreachable" in caplog.text
        assert slot.fallback.loaded  # the local model did answer
        await client.write_event(Describe().event())
        (info,) = await read_until(client, "info")
        (handle,) = info.data["handle"]
        assert "answers while it cannot" in handle["description"]

        running.start()
        asked = running.count(CHAT)
        await answered(client, "And of Spain?", "fallback")
        assert running.count(CHAT) == asked + 1  # the engine answered this one


async def test_bench_compares_the_remote_engine_with_the_local_one(
    running: LlamaServer, pivoice: int, server_port: int
) -> None:
    """`bench --server-arg=--llm-url=…`'s section, on the two real servers (one round)."""
    texts = ["What time is it?"]
    uris = {"remote": f"tcp://127.0.0.1:{pivoice}", "local": f"tcp://127.0.0.1:{server_port}"}
    section = await bench_remote.compare(texts, uris, rounds=1)
    for name in ("remote", "local"):
        summary = section["summary"][name]
        assert summary["errors"] == 0 and summary["turns"] == 1
        assert summary["first_ms"]["median"] > 0 and summary["pieces"]["median"] >= 1
    assert section["overhead"]["first_ms"] is not None
    section.update(url=running.url, remote_model=MODEL_ALIAS, local_model="SmolLM2")
    text = "\n".join(bench_remote.render(section))
    assert "Remote overhead (remote − local, medians): first piece" in text


def test_bench_runs_the_local_twin_without_the_remote_options() -> None:
    args = ["--llm-url=http://h:8080/v1", "--max-tokens", "64", "--llm-remote-model", "m",
            "--llm-fallback=local", "--llm-timeout", "5", "--asr-beam-size=2"]  # fmt: skip
    assert bench_remote.uses_remote(args)
    assert bench_remote.without_remote(args) == ["--max-tokens", "64", "--asr-beam-size=2"]
    assert not bench_remote.uses_remote(["--llm-model", "x.gguf"])
