"""Are the model files there, and how much memory will they take once loaded?

Resolves the same model options the server takes, through wyoming_pivoice.models,
without loading anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import catalogue, models
from .base import MIB, Check, Finding, Status, mib

ASR = Check("model-asr", "the speech recognition model")
VOICE = Check("model-voice", "the Piper voice")
LLM = Check("model-llm", "the GGUF language model")
VAD = Check("model-vad", "the satellite's Silero VAD model")
CATALOGUE = Check("model-catalogue", "the models suggested for a Pi 5, by name")

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
NAME_FIX = "give a path, a catalogue name (see model-catalogue) or owner/repo:file"


def _later(check: Check, name: str, size: int, store: models.ModelStore) -> Finding:
    """A model given by name that is not in the store yet: the server downloads it."""
    about = f", about {mib(size)}" if size else ""
    return check.finding(
        Status.INFO,
        f"{name!r} is a model name: the server downloads it at first start into "
        f"{store.cache} (needs internet{about})",
        data={"name": name, "bytes": size},
    )


def _size(stage: str, name: str) -> int:
    entry = catalogue.find(stage, name)
    return entry.size_mb * 1000 * 1000 if entry is not None else 0


@dataclass(frozen=True)
class ModelChoice:
    asr: str = models.EMBEDDED
    voice: str = models.EMBEDDED
    voice_dirs: tuple[str, ...] = ()
    llm: str = models.EMBEDDED
    data_dir: str = ""  # the server's --data-dir

    @property
    def store(self) -> models.ModelStore:
        return models.ModelStore(data_dir=self.data_dir)


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _found(check: Check, path: Path, extra: str = "") -> Finding:
    size = size_of(path)
    return check.finding(
        Status.OK, f"{path} ({mib(size)}){extra}", data={"path": str(path), "bytes": size}
    )


def check_asr(spec: str, store: models.ModelStore | None = None) -> Finding:
    store = store or models.ModelStore()
    try:
        folder = models.cached_whisper(spec, store)
    except models.ModelNotFoundError as err:
        return ASR.finding(Status.FAIL, str(err), fix=MODEL_FIX)
    if folder is not None:
        path = Path(folder)
        if not (path / "model.bin").exists():
            return ASR.finding(
                Status.FAIL, f"{path} is not a CTranslate2 Whisper model (no model.bin)"
            )
        return _found(ASR, path)
    if spec.startswith((".", "/", "~")):
        return ASR.finding(Status.FAIL, f"Whisper model path {spec} does not exist", fix=MODEL_FIX)
    family = spec.split(".")[0].split("-")[0]
    return _later(ASR, spec, _size("asr", spec) or WHISPER_NAME_BYTES.get(family, 0), store)


def check_voice(
    spec: str, voice_dirs: tuple[str, ...], store: models.ModelStore | None = None
) -> Finding:
    store = store or models.ModelStore()
    try:
        path = models.local_voice(spec, [Path(d) for d in voice_dirs]) or models.cached_voice(
            spec, store
        )
    except models.ModelNotFoundError as err:
        return VOICE.finding(Status.FAIL, str(err), fix=MODEL_FIX)
    if path is None:
        try:
            if models.hub_spec(spec) is None:
                catalogue.piper_files(spec)
        except ValueError:
            return VOICE.finding(
                Status.FAIL,
                f"Piper voice {spec!r} not found (a path to an .onnx file, or a voice name "
                "like en_US-lessac-medium)",
                fix=MODEL_FIX,
            )
        return _later(VOICE, spec, _size("voice", spec) or 63 * 1000 * 1000, store)
    config = Path(f"{path}.json")
    if not config.is_file():
        return VOICE.finding(
            Status.FAIL,
            f"{path} has no {config.name} beside it (Piper needs both)",
            fix=f"put the voice's {config.name} next to {path.name}",
        )
    return _found(VOICE, path)


def check_llm(spec: str, store: models.ModelStore | None = None) -> Finding:
    store = store or models.ModelStore()
    try:
        path = models.cached_llm(spec, store)
    except models.ModelNotFoundError as err:
        return LLM.finding(Status.FAIL, str(err), fix=MODEL_FIX)
    if path is None:
        if models.llm_source(spec) is None:
            return LLM.finding(
                Status.FAIL,
                f"GGUF model {spec!r} not found (give a path to a .gguf file)",
                fix=f"{MODEL_FIX}; or {NAME_FIX}",
            )
        return _later(LLM, spec, _size("llm", spec), store)
    with path.open("rb") as file:
        magic = file.read(4)
    if magic != b"GGUF":
        return LLM.finding(
            Status.FAIL,
            f"{path} is not a GGUF file",
            fix="convert or download the model as .gguf (llama.cpp format)",
        )
    return _found(LLM, path)


def check_catalogue() -> Finding:
    """The catalogue, for choosing (docs/models.md has the figures' sources)."""
    rows = [
        f"{e.name} ({e.stage}, {e.size_mb} MB, RAM ≈ {e.ram_mb} MB, {e.speed}, {e.licence})"
        for e in catalogue.ENTRIES
    ]
    return CATALOGUE.finding(
        Status.OK,  # nothing to act on: a list to choose from
        f"{len(rows)} suggested choices by name for --llm-model / --voice / --asr-model "
        "(docs/models.md): " + "; ".join(rows),
        data={
            "entries": [
                {
                    "name": e.name,
                    "stage": e.stage,
                    "repo": e.repo,
                    "size_mb": e.size_mb,
                    "ram_mb": e.ram_mb,
                    "speed": e.speed,
                    "speed_source": e.speed_source,
                    "licence": e.licence,
                    "languages": list(e.languages),
                }
                for e in catalogue.ENTRIES
            ]
        },
    )


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
    store = choice.store
    return [
        check_asr(choice.asr, store),
        check_voice(choice.voice, choice.voice_dirs, store),
        check_llm(choice.llm, store),
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
