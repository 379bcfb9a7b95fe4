"""Which engine serves each stage: adding an engine is its file and one line here.

An engine class takes its stage's settings (`engine` names it) and has
`describe(settings) -> EngineDescription` (engines/protocols.py), which must not load the
model. Entries name the class as "module:Class" so nothing is imported until a stage
uses it (a satellite imports no engine; the server imports only what it serves).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .protocols import EngineDescription

KINDS = ("asr", "tts", "chat", "vad")

_ENGINES: dict[str, dict[str, Any]] = {
    "asr": {"faster-whisper": "wyoming_pivoice.engines.asr:WhisperAsr"},
    "tts": {"piper": "wyoming_pivoice.engines.tts:PiperTts"},
    "chat": {"llama.cpp": "wyoming_pivoice.engines.llm:LlamaChat"},
    "vad": {"silero": "wyoming_pivoice.engines.vad:SileroVad"},
}


class UnknownEngine(ValueError):
    """A settings' `engine` that no registry line names."""


def register(kind: str, name: str, engine: str | type) -> None:
    """Add (or replace) an engine: a class, or "module:Class" to import when first used."""
    if kind not in _ENGINES:
        raise ValueError(f"no engine kind {kind!r} ({', '.join(KINDS)})")
    _ENGINES[kind][name] = engine


def unregister(kind: str, name: str) -> None:
    _ENGINES[kind].pop(name, None)


def names(kind: str) -> list[str]:
    return list(_ENGINES[kind])


def engine_class(kind: str, name: str) -> Any:
    try:
        target = _ENGINES[kind][name]
    except KeyError:
        raise UnknownEngine(
            f"no {kind} engine {name!r} (there are: {', '.join(_ENGINES.get(kind, {}))})"
        ) from None
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
    return target


def _chosen(kind: str, settings: Any) -> Any:
    # Settings without an `engine` (the VAD has none yet): the kind's first engine.
    return engine_class(kind, getattr(settings, "engine", None) or next(iter(_ENGINES[kind])))


def describe(kind: str, settings: Any) -> EngineDescription:
    """The engine's description of itself for these settings, without loading a model."""
    description: EngineDescription = _chosen(kind, settings).describe(settings)
    return description


def load(kind: str, settings: Any) -> Any:
    """A loaded engine for these settings (blocking: call it in a worker thread)."""
    return _chosen(kind, settings)(settings)


def warmed(kind: str, settings: Any) -> Any:
    """`load`, then one warm-up call, so the first real request does not pay first-run costs."""
    engine = load(kind, settings)  # a failure stops the start in one line (server/app.py)
    engine.warm_up()
    return engine


if TYPE_CHECKING:  # mypy checks each built-in engine against its contract here
    from .asr import WhisperAsr
    from .llm import LlamaChat
    from .protocols import SpeechToText, TextToSpeech, TokenCounter, Vad
    from .tts import PiperTts
    from .vad import SileroVad

    _asr: type[SpeechToText] = WhisperAsr
    _tts: type[TextToSpeech] = PiperTts
    _chat: type[TokenCounter] = LlamaChat  # its async face: server/services.py SlotChat
    _vad: type[Vad] = SileroVad
