"""Are the model files there, and how much memory will they take once loaded?

Resolves the same model options the server takes, through wyoming_pivoice.models,
without loading anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import models
from .base import MIB, Check, Finding, Status, mib

ASR = Check("model-asr", "the speech recognition model")
VOICE = Check("model-voice", "the Piper voice")
LLM = Check("model-llm", "the GGUF language model")
VAD = Check("model-vad", "the satellite's Silero VAD model")

# Approximate CTranslate2 download sizes of faster-whisper model names, for names
# that are fetched at first start (there is no file to measure yet).
WHISPER_NAME_BYTES = {
    "tiny": 75 * MIB,
    "base": 145 * MIB,
    "small": 485 * MIB,
    "medium": 1530 * MIB,
    "large": 3090 * MIB,
    "turbo": 1620 * MIB,
}
# Measured: the embedded server's resident size minus its model files (~320 MiB on
# amd64, Python 3.11), rounded up; it covers Python, onnxruntime, CTranslate2 and llama.cpp.
RUNTIME_BYTES = 384 * MIB
KV_CACHE_SHARE = 0.25  # the LLM's context cache, as a share of its GGUF size
MODEL_FIX = "run script/setup (it installs the embedded models), or pass a path that exists"


@dataclass(frozen=True)
class ModelChoice:
    asr: str = models.EMBEDDED
    voice: str = models.EMBEDDED
    voice_dirs: tuple[str, ...] = ()
    llm: str = models.EMBEDDED


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _found(check: Check, path: Path, extra: str = "") -> Finding:
    size = size_of(path)
    return check.finding(
        Status.OK, f"{path} ({mib(size)}){extra}", data={"path": str(path), "bytes": size}
    )


def check_asr(spec: str) -> Finding:
    try:
        resolved = models.resolve_whisper(spec)
    except models.ModelNotFoundError as err:
        return ASR.finding(Status.FAIL, str(err), fix=MODEL_FIX)
    path = Path(resolved)
    if path.exists():
        return _found(ASR, path)
    family = resolved.split(".")[0].split("-")[0]
    size = WHISPER_NAME_BYTES.get(family, 0)
    return ASR.finding(
        Status.INFO,
        f"{resolved!r} is a model name: faster-whisper downloads it at first start "
        f"(needs internet{f', about {mib(size)}' if size else ''})",
        data={"name": resolved, "bytes": size},
    )


def check_voice(spec: str, voice_dirs: tuple[str, ...]) -> Finding:
    try:
        path = models.resolve_voice(spec, [Path(d) for d in voice_dirs])
    except models.ModelNotFoundError as err:
        return VOICE.finding(Status.FAIL, str(err), fix=MODEL_FIX)
    config = Path(f"{path}.json")
    if not config.is_file():
        return VOICE.finding(
            Status.FAIL,
            f"{path} has no {config.name} beside it (Piper needs both)",
            fix=f"put the voice's {config.name} next to {path.name}",
        )
    return _found(VOICE, path)


def check_llm(spec: str) -> Finding:
    try:
        path = models.resolve_llm(spec)
    except models.ModelNotFoundError as err:
        return LLM.finding(Status.FAIL, str(err), fix=MODEL_FIX)
    with path.open("rb") as file:
        magic = file.read(4)
    if magic != b"GGUF":
        return LLM.finding(
            Status.FAIL,
            f"{path} is not a GGUF file",
            fix="convert or download the model as .gguf (llama.cpp format)",
        )
    return _found(LLM, path)


def check_vad() -> Finding:
    try:
        path = models.silero_vad_onnx()
    except models.ModelNotFoundError as err:
        return VAD.finding(
            Status.WARN,
            f"{err}: the satellite needs it, the server does not",
            fix="pip install --no-deps silero-vad (script/setup does)",
        )
    return _found(VAD, path)


def check_models(choice: ModelChoice) -> list[Finding]:
    return [
        check_asr(choice.asr),
        check_voice(choice.voice, choice.voice_dirs),
        check_llm(choice.llm),
        check_vad(),
    ]


def memory_need(findings: list[Finding]) -> tuple[int, str]:
    """Bytes the loaded models need, and how that figure is made up."""
    files = sum(int(f.data.get("bytes", 0)) for f in findings)
    llm = next((int(f.data.get("bytes", 0)) for f in findings if f.check == LLM.name), 0)
    cache = int(llm * KV_CACHE_SHARE)
    detail = (
        f"model files {mib(files)} + LLM context cache {mib(cache)} + runtimes {mib(RUNTIME_BYTES)}"
    )
    return files + cache + RUNTIME_BYTES, detail
