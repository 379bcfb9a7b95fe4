"""What `describe` answers, assembled from the engines' own descriptions
(engines/protocols.py `EngineDescription`), made once at start without loading any model,
so Home Assistant's one-second `describe` gets its answer while models still load.

Never put a `satellite` here: Home Assistant drops a service's STT/TTS/conversation
entities when its info lists one. The satellite is its own endpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
from ..engines.protocols import EngineDescription


def _attribution(engine: EngineDescription) -> Attribution:
    return Attribution(name=engine.attribution, url=engine.url)


@dataclass(frozen=True)
class ServiceDescription:
    asr: EngineDescription
    voice: EngineDescription
    llm: EngineDescription
    # Which engine answers now (a remote one with a local fallback), said in the handle
    # program's description at each describe.
    answering: Callable[[], str] | None = None

    def _handle_description(self) -> str:
        now = f"; now answering: {self.answering()}" if self.answering is not None else ""
        return f"Conversation on {self.llm.title}, through wyoming-pivoice{now}"

    def info(self) -> Info:
        asr, voice, llm = self.asr, self.voice, self.llm
        return Info(
            asr=[
                AsrProgram(
                    name=asr.program_name,
                    description=f"{asr.engine} speech to text on wyoming-pivoice",
                    attribution=_attribution(asr),
                    installed=True,
                    version=__version__,
                    models=[
                        AsrModel(
                            name=asr.model,
                            description=asr.title,
                            attribution=_attribution(asr),
                            installed=True,
                            version=asr.version,
                            languages=list(asr.languages),
                        )
                    ],
                    supports_transcript_streaming=True,
                )
            ],
            tts=[
                TtsProgram(
                    name=voice.program_name,
                    description=f"{voice.engine} text to speech on wyoming-pivoice",
                    attribution=_attribution(voice),
                    installed=True,
                    version=__version__,
                    voices=[
                        TtsVoice(
                            name=voice.model,
                            description=voice.title,
                            attribution=_attribution(voice),
                            installed=True,
                            version=voice.version,
                            languages=list(voice.languages),
                            speakers=[TtsVoiceSpeaker(name=s) for s in voice.speakers] or None,
                        )
                    ],
                    supports_synthesize_streaming=True,
                )
            ],
            handle=[
                HandleProgram(
                    name=llm.program_name,
                    description=self._handle_description(),
                    attribution=_attribution(llm),
                    installed=True,
                    version=__version__,
                    models=[
                        HandleModel(
                            name=llm.model,
                            description=llm.title,
                            attribution=_attribution(llm),
                            installed=True,
                            version=llm.version,
                            languages=list(llm.languages),
                        )
                    ],
                    supports_handled_streaming=True,
                )
            ],
        )
