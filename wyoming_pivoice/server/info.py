"""What `describe` answers. Built once at start from model files, without loading any model,
so Home Assistant's one-second `describe` gets its answer while models still load.

Never put a `satellite` here: Home Assistant drops a service's STT/TTS/conversation
entities when its info lists one. The satellite is its own endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wyoming.info import (
    AsrModel,
    AsrProgram,
    Attribution,
    HandleModel,
    HandleProgram,
    Info,
    TtsProgram,
    TtsVoice,
    TtsVoiceSpeaker,
)

from .. import __version__
from ..models import EMBEDDED, EMBEDDED_WHISPER_NAME, resolve_llm, resolve_voice, resolve_whisper
from ..settings import ServerSettings

_PIVOICE = Attribution(name="wyoming-pivoice", url="https://github.com/wyoming-pivoice")
_WHISPER = Attribution(name="SYSTRAN / OpenAI", url="https://github.com/SYSTRAN/faster-whisper")
_PIPER = Attribution(name="rhasspy", url="https://github.com/OHF-Voice/piper1-gpl")
_LLAMA = Attribution(name="llama.cpp", url="https://github.com/ggml-org/llama.cpp")

# English-only Whisper vocabularies have 51864 tokens, multilingual ones 51865 or more.
_MULTILINGUAL_VOCAB = 51865


@dataclass(frozen=True)
class ModelDescription:
    name: str
    languages: list[str]


@dataclass(frozen=True)
class VoiceDescription(ModelDescription):
    speakers: list[str]
    sample_rate: int


@dataclass(frozen=True)
class ServiceDescription:
    asr: ModelDescription
    voice: VoiceDescription
    llm: ModelDescription
    # --llm-url: which engine answers, said in the handle program's description.
    remote_llm: str | None = None
    answering: Callable[[], str] | None = None

    @classmethod
    def from_settings(
        cls, settings: ServerSettings, answering: Callable[[], str] | None = None
    ) -> ServiceDescription:
        remote = settings.remote_llm
        if remote is None:
            llm_name = resolve_llm(settings.llm.model).stem
        else:
            llm_name = remote.model or "remote"
        return cls(
            asr=_describe_whisper(settings),
            voice=_describe_voice(settings),
            llm=ModelDescription(name=llm_name, languages=list(settings.llm_languages)),
            remote_llm=None if remote is None else _remote_engine(settings),
            answering=answering,
        )

    def _handle_description(self) -> str:
        if self.remote_llm is None:
            return "Local LLM conversation (llama.cpp) on wyoming-pivoice"
        now = f"; now answering: {self.answering()}" if self.answering is not None else ""
        return f"Conversation on {self.remote_llm}, through wyoming-pivoice{now}"

    def info(self) -> Info:
        return Info(
            asr=[
                AsrProgram(
                    name="pivoice-faster-whisper",
                    description="faster-whisper speech to text on wyoming-pivoice",
                    attribution=_WHISPER,
                    installed=True,
                    version=__version__,
                    models=[
                        AsrModel(
                            name=self.asr.name,
                            description=f"Whisper {self.asr.name}",
                            attribution=_WHISPER,
                            installed=True,
                            version=None,
                            languages=self.asr.languages,
                        )
                    ],
                    supports_transcript_streaming=True,
                )
            ],
            tts=[
                TtsProgram(
                    name="pivoice-piper",
                    description="Piper text to speech on wyoming-pivoice",
                    attribution=_PIPER,
                    installed=True,
                    version=__version__,
                    voices=[
                        TtsVoice(
                            name=self.voice.name,
                            description=f"Piper {self.voice.name}",
                            attribution=_PIPER,
                            installed=True,
                            version=None,
                            languages=self.voice.languages,
                            speakers=[TtsVoiceSpeaker(name=s) for s in self.voice.speakers] or None,
                        )
                    ],
                    supports_synthesize_streaming=True,
                )
            ],
            handle=[
                HandleProgram(
                    name="pivoice-llama",
                    description=self._handle_description(),
                    attribution=_LLAMA,
                    installed=True,
                    version=__version__,
                    models=[
                        HandleModel(
                            name=self.llm.name,
                            description=f"GGUF {self.llm.name}"
                            if self.remote_llm is None
                            else f"{self.llm.name} on {self.remote_llm}",
                            attribution=_PIVOICE,
                            installed=True,
                            version=None,
                            languages=self.llm.languages,
                        )
                    ],
                    supports_handled_streaming=True,
                )
            ],
        )


def _remote_engine(settings: ServerSettings) -> str:
    remote = settings.remote_llm
    assert remote is not None
    text = f"the OpenAI-compatible engine at {remote.url}"
    if remote.fallback == "local":
        text += f" (the local {resolve_llm(settings.llm.model).stem} answers while it cannot)"
    return text


def _describe_whisper(settings: ServerSettings) -> ModelDescription:
    model = resolve_whisper(settings.asr.model)
    path = Path(model)
    name = path.name if path.exists() else model
    if settings.asr.model == EMBEDDED:
        name = EMBEDDED_WHISPER_NAME  # the package names its folder just "model"
    vocabulary = path / "vocabulary.txt"
    english_only = name.endswith(".en")
    if vocabulary.exists():
        with vocabulary.open(encoding="utf-8") as lines:
            english_only = sum(1 for _ in lines) < _MULTILINGUAL_VOCAB
    if english_only:
        return ModelDescription(name=name, languages=["en"])
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    return ModelDescription(name=name, languages=list(_LANGUAGE_CODES))


def _describe_voice(settings: ServerSettings) -> VoiceDescription:
    path = resolve_voice(settings.tts.voice, [Path(d) for d in settings.tts.voice_dirs])
    config = json.loads(Path(f"{path}.json").read_text(encoding="utf-8"))
    language = (config.get("language") or {}).get("code") or config.get("espeak", {}).get(
        "voice", "en"
    )
    return VoiceDescription(
        name=path.stem,
        languages=[language],
        speakers=list((config.get("speaker_id_map") or {}).keys()),
        sample_rate=int(config["audio"]["sample_rate"]),
    )
