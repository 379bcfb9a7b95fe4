"""Typed settings of `wyoming-pivoice server` (argparse stops at the CLI).

The satellite's are in satellite/settings.py: they import no engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .engines.asr import AsrSettings
from .engines.llm import LlmSettings
from .engines.remote_llm import RemoteLlmSettings
from .engines.tts import TtsSettings
from .server.knowledge import KnowledgeSettings
from .server.limits import Limits
from .zeroconf import ZeroconfSettings

DEFAULT_SERVER_URI = "tcp://0.0.0.0:10800"


@dataclass(frozen=True)
class ServerSettings:
    uri: str = DEFAULT_SERVER_URI
    asr: AsrSettings = field(default_factory=AsrSettings)
    tts: TtsSettings = field(default_factory=TtsSettings)
    llm: LlmSettings = field(default_factory=LlmSettings)
    remote_llm: RemoteLlmSettings | None = None  # --llm-url: the conversation runs there
    llm_lazy: bool = False
    audio_first: bool = True  # the LLM waits while Piper synthesizes (engines/priority.py)
    language: str | None = None  # --language: the pipeline's (ASR, voice, prompt, phrases)
    limits: Limits = field(default_factory=Limits)
    zeroconf: ZeroconfSettings = field(default_factory=ZeroconfSettings)
    knowledge: KnowledgeSettings | None = None  # --knowledge: the household's notes
