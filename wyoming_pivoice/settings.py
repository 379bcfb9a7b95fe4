"""Typed settings of `wyoming-pivoice server`: each field carries its flag (options.py), so
the CLI and the add-on's options are made from them (server/cli.py, addon.py).

The satellite's are in satellite/settings.py: they import no engine. The fields' order is
`--help`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .engines.asr import AsrSettings
from .engines.llm import LlmSettings
from .engines.remote_llm import RemoteLlmSettings
from .engines.tts import TtsSettings
from .models import ModelStore
from .options import Addon, nest, opt, server_uri
from .server.knowledge import KnowledgeSettings
from .server.limits import Limits
from .zeroconf import ZeroconfSettings

DEFAULT_SERVER_URI = "tcp://0.0.0.0:10800"

MODELS = "models by name and language"
LLM = "conversation (llama.cpp)"


@dataclass(frozen=True)
class ServerSettings:
    uri: str = opt(
        DEFAULT_SERVER_URI,
        "--uri",
        type=server_uri,
        help="tcp://HOST:PORT, unix://PATH or stdio://",
    )
    # the pipeline's (ASR, voice, prompt, phrases)
    language: str | None = opt(
        None,
        "--language",
        group=MODELS,
        help="the household's language (en, zh, ja, de …): ASR language, the voice's (if "
        "--voice is not given), the system prompt's (if --system-prompt is not given)",
    )
    # The one store the three stages download into (server/cli.py gives it to each).
    store: ModelStore = nest(ModelStore, group=MODELS)
    asr: AsrSettings = nest(AsrSettings, group="speech to text (faster-whisper)")
    tts: TtsSettings = nest(TtsSettings, group="text to speech (piper)")
    llm: LlmSettings = nest(LlmSettings, group=LLM)
    llm_lazy: bool = opt(
        False,
        "--llm-lazy",
        group=LLM,
        help="load the LLM on the first conversation turn instead of at start",
        addon=Addon("bool"),
    )
    audio_first: bool = opt(  # the LLM waits while Piper synthesizes (engines/priority.py)
        True,
        "--no-audio-first",
        group=LLM,
        help="let the LLM run on while Piper synthesizes (by default it waits: audio first)",
    )
    # --llm-url: the conversation runs there
    remote_llm: RemoteLlmSettings | None = nest(
        RemoteLlmSettings,
        group="conversation on a bigger machine (an OpenAI-compatible engine: llama-server, "
        "Ollama, vLLM)",
        optional=True,
    )
    # --knowledge: the household's notes
    knowledge: KnowledgeSettings | None = nest(
        KnowledgeSettings, group="local knowledge (the household's notes)", optional=True
    )
    limits: Limits = nest(Limits, group="limits")
    compute_log: Path | None = opt(
        None,
        "--compute-log",
        type=Path,
        metavar="PATH",
        help="append each model load and request's compute time here, as JSON lines "
        "(what `bench` reads)",
    )
    zeroconf: ZeroconfSettings = nest(ZeroconfSettings, group="discovery")
