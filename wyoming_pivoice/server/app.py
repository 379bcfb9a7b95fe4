"""Starting the server: check the options, listen, then load models (so `describe` is
answered at once), and say "ready" once every model that loads at start has loaded.

A model that cannot load stops the start with one ERROR line and exit status 1: a server
that keeps listening without its ASR answers every transcription with an empty transcript,
which Home Assistant shows as "nothing was understood".
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from wyoming.server import AsyncServer, AsyncStdioServer

from ..engines.runtime import model_executor
from ..models import EMBEDDED, EMBEDDED_WHISPER_NAME, ModelNotFoundError, check_names
from ..settings import ServerSettings
from ..startup import StartupError, advertise, how_to_add, listen, stop_on_signals, withdraw
from .handler import PivoiceEventHandler
from .knowledge import KnowledgeBase, KnowledgeError, TurnNotes, open_knowledge
from .services import Services

_LOGGER = logging.getLogger(__name__)

DEFAULT_PORT = 10800


def check_models(settings: ServerSettings) -> None:
    """Every model option names something that exists here, or a name that can be
    downloaded (before anything starts; nothing is downloaded before the socket listens)."""
    voice_dirs = [Path(d) for d in settings.tts.voice_dirs]
    remote = settings.remote_llm
    llm = settings.llm.model if remote is None or remote.fallback == "local" else None
    checks: list[tuple[str, str, Callable[[], object]]] = [
        (
            "--asr-model",
            settings.asr.model,
            lambda: check_names(settings.asr.model, EMBEDDED, [], None),
        ),
        (
            "--voice",
            settings.tts.voice,
            lambda: check_names(EMBEDDED, settings.tts.voice, voice_dirs, None),
        ),
    ]
    if llm is not None:
        checks.append(("--llm-model", llm, lambda: check_names(EMBEDDED, EMBEDDED, [], llm)))
    for flag, value, resolve in checks:
        try:
            resolve()
        except ModelNotFoundError as err:
            fix = _MODEL_FIX[flag]
            if flag == "--voice" and voice_dirs:
                fix += f" (looked in {', '.join(str(d) for d in voice_dirs)})"
            raise StartupError(f"{flag} {value!r}: {err}. {fix}", code=2) from None


_MODEL_FIX = {
    "--asr-model": f"Give a CTranslate2 Whisper folder, a faster-whisper name, or '{EMBEDDED}'",
    "--voice": f"Give an .onnx voice (its .onnx.json beside it), a voice name, or '{EMBEDDED}'",
    "--llm-model": f"Give the path of a .gguf file, a catalogue name, or '{EMBEDDED}'",
}

_LABELS = {"asr": "ASR", "tts": "voice", "llm": "LLM"}

_LOAD_FIX = {
    "asr": "a faster-whisper name is downloaded the first time, which needs internet: give "
    "--asr-model a CTranslate2 Whisper folder, or 'embedded'",
    "tts": "give --voice a Piper .onnx voice with its .onnx.json, or 'embedded'",
    "llm": "give --llm-model a .gguf file llama.cpp can read, or 'embedded'",
}


def _one_line(err: BaseException) -> str:
    """An exception as one short line: its first line, its type if it has no text."""
    text = str(err).strip().splitlines()
    first = text[0].strip() if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


async def load_at_start(services: Services) -> list[str]:
    """Wait for the models that load at start, and name them; the first that fails is a
    StartupError.

    The ASR first: start_loading loads it alone and the others after it (asking for
    another model now would start it beside the ASR).
    """
    settings = services.settings
    steps: list[tuple[str, str, object]] = [
        ("asr", settings.asr.model, services.asr),
        ("tts", settings.tts.voice, services.tts),
    ]
    if not settings.llm_lazy:
        local = getattr(services.llm, "local", None)  # the remote engine's fallback, if any
        if local is not None:
            steps.append(("llm", settings.llm.model, local))
    names = []
    for kind, model, slot in steps:
        try:
            engine = await slot.get()  # type: ignore[attr-defined]
        except Exception as err:
            name = getattr(slot, "name", kind)
            raise StartupError(
                f"{name} {model!r} failed to load ({_one_line(err)}); {_LOAD_FIX[kind]}"
            ) from None
        name = EMBEDDED_WHISPER_NAME if kind == "asr" and model == EMBEDDED else engine.name
        names.append(f"{_LABELS[kind]} {name}")
    if settings.remote_llm is not None:
        names.append(f"LLM at {settings.remote_llm.url}")
    elif settings.llm_lazy:
        names.append("LLM on the first turn")
    return names


def _knowledge(settings: ServerSettings) -> KnowledgeBase | None:
    """The notes' index (--knowledge), opened before listening: a misconfigured one is one line."""
    if settings.knowledge is None:
        return None
    try:
        return open_knowledge(settings.knowledge)
    except KnowledgeError as err:
        raise StartupError(f"--knowledge: {err}", code=2) from None


async def serve(settings: ServerSettings, ready: asyncio.Event | None = None) -> int:
    sys.setswitchinterval(0.0005)  # the loop gets the GIL back soon from loader threads
    asyncio.get_running_loop().set_default_executor(model_executor())  # models below the audio
    check_models(settings)
    services = Services.from_settings(settings)
    knowledge = _knowledge(settings)
    if knowledge is not None:  # the notes in each turn's prompt; indexed on a thread of its own
        services.conversations.notes = TurnNotes(knowledge)
    server = AsyncServer.from_uri(settings.uri)
    factory = partial(PivoiceEventHandler, services)
    stdio_task: asyncio.Task[None] | None = None
    if isinstance(server, AsyncStdioServer):
        stdio_task = asyncio.create_task(server.run(factory))  # one client: our stdin/stdout
    else:
        await listen(server, factory, settings.uri)
    _LOGGER.info("Listening on %s", settings.uri)
    services.start_loading()
    if knowledge is not None:
        knowledge.start()

    advertiser = await advertise(settings.zeroconf, server, settings.uri, "server", DEFAULT_PORT)

    stop = asyncio.Event()
    stop_on_signals(stop.set)
    if ready is not None:
        ready.set()
    if stdio_task is not None:
        stdio_task.add_done_callback(lambda _task: stop.set())
    loading = asyncio.ensure_future(load_at_start(services))
    stopping = asyncio.ensure_future(stop.wait())
    failed: StartupError | None = None
    try:
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if loading.done():
            failed = loading.exception()  # type: ignore[assignment]
            if failed is None:
                _LOGGER.info(
                    "Ready (%s): %s",
                    ", ".join(loading.result()),
                    how_to_add("server", settings.uri, settings.zeroconf, DEFAULT_PORT),
                )
                await stopping
        else:
            loading.cancel()
    finally:
        stopping.cancel()
        _LOGGER.info("Stopping")
        await withdraw(advertiser)
        await server.stop()
        if knowledge is not None:
            knowledge.close()
    if failed is not None:
        raise failed
    return 0
