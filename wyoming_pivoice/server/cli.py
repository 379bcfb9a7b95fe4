"""`wyoming-pivoice server`: command-line options → ServerSettings (whose fields carry them)."""

from __future__ import annotations

import argparse
import os

from .. import options
from ..catalogue import DEFAULT_VOICES, SYSTEM_PROMPTS
from ..engines.asr import AsrSettings
from ..engines.llm import LlmSettings
from ..engines.remote_llm import RemoteLlmSettings
from ..engines.tts import TtsSettings
from ..models import EMBEDDED, ModelStore
from ..settings import ServerSettings
from .knowledge import KnowledgeSettings, default_index


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "server",
        help="serve ASR, conversation and TTS over Wyoming",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    options.add_arguments(parser, ServerSettings)  # the fields carry their flags
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """The parsed options as settings, and what follows from one option to another:
    --language fills what is not given (ASR language, voice, prompt, the LLM's languages)."""
    pipeline = args.language or None
    asked = args.asr_language or pipeline or "en"
    language = None if asked in ("", "auto") else asked
    store = options.build(ModelStore, args)
    base = (pipeline or "en").split("_")[0].split("-")[0]
    voice = args.voice
    if voice == EMBEDDED and base in DEFAULT_VOICES:
        voice = DEFAULT_VOICES[base]  # the embedded voice speaks English only
    system_prompt = args.system_prompt or SYSTEM_PROMPTS.get(base, SYSTEM_PROMPTS["en"])
    return options.build(
        ServerSettings,
        args,
        language=pipeline,
        store=store,
        asr=options.build(AsrSettings, args, language=language, store=store),
        tts=options.build(TtsSettings, args, voice=voice, store=store),
        llm=options.build(
            LlmSettings,
            args,
            system_prompt=system_prompt,
            store=store,
            languages=tuple(args.llm_language or [pipeline or "en"]),
        ),
        remote_llm=remote_llm_from_args(args),
        knowledge=knowledge_from_args(args),
    )


def knowledge_from_args(args: argparse.Namespace) -> KnowledgeSettings | None:
    if args.knowledge is None:
        return None
    folder = args.knowledge.expanduser()
    index = args.knowledge_index or default_index(folder)
    return options.build(KnowledgeSettings, args, folder=folder, index=index)


def remote_llm_from_args(args: argparse.Namespace) -> RemoteLlmSettings | None:
    """The remote engine's settings from the server's (or doctor's) options, if --llm-url."""
    if not args.llm_url:
        return None
    return options.build(
        RemoteLlmSettings,
        args,
        api_key=args.llm_api_key or os.environ.get("PIVOICE_LLM_API_KEY") or None,
        model=args.llm_remote_model or None,
    )


def run(args: argparse.Namespace) -> int:
    from .. import compute_log, startup
    from .app import serve

    settings = settings_from_args(args)
    compute_log.open_log(settings.compute_log)
    try:
        return startup.run(lambda: serve(settings))
    finally:
        compute_log.current().close()


def settings_from_argv(argv: list[str]) -> ServerSettings:
    """The settings `wyoming-pivoice server ARGV…` would run with (its parser, its checks);
    a host that starts a server (the lab's bench) reads them without knowing the parser."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return settings_from_args(parser.parse_args(["server", *argv]))
