"""Model engines. None of them knows about Wyoming; all blocking calls run off the event loop.

What a host (the lab's bench, a test) may use is exported here. Imported on first use: each
engine loads its model runtime (faster-whisper, llama.cpp, Piper), and a satellite that
imports engines.vad must load none of them (exports.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exports import lazy_exports, names

_EXPORTS = {
    ".asr": ("AsrSettings", "WhisperAsr"),
    ".llm": ("LlamaChat", "LlmSettings"),
    ".priority": ("AudioFirst",),
    ".remote_llm": ("RemoteChat", "RemoteLlmError"),
    ".tts": ("PiperTts", "TtsSettings"),
    ".vad": ("RecentSileroVad", "SileroVad", "silero_vad"),
}
if TYPE_CHECKING:  # the same names, for the type checker (tests/test_layout.py: they agree)
    from .asr import AsrSettings, WhisperAsr
    from .llm import LlamaChat, LlmSettings
    from .priority import AudioFirst
    from .remote_llm import RemoteChat, RemoteLlmError
    from .tts import PiperTts, TtsSettings
    from .vad import RecentSileroVad, SileroVad, silero_vad

__all__ = names(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
