"""Models by name, downloaded once from a stand-in Hugging Face Hub on loopback (fake_hub):
the embedded model files served under catalogue-like names, through the real
huggingface_hub client; download, resume, checksum, offline and fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.tts import Synthesize

from pivoice_lab.ports import free_port, refused_port
from wyoming_pivoice import catalogue, models
from wyoming_pivoice.engines.tts import PiperTts, TtsSettings
from wyoming_pivoice.models import ModelDownloadError, ModelStore

from .fake_hub import FakeHub
from .helpers import (
    exchange,
    pivoice_env,
    read_wav,
    server_process,
    transcribe_events,
    words,
)

QWEN = catalogue.find("llm", "qwen2.5-0.5b-instruct-q4_k_m")
assert QWEN is not None
HUAYAN = catalogue.piper_files("zh_CN-huayan-medium")


def embedded_llm() -> Path:
    return models.EMBEDDED_LLM.locate()


def embedded_voice() -> Path:
    return models.EMBEDDED_VOICE.locate()


def embedded_whisper() -> Path:
    return models.EMBEDDED_WHISPER.locate()


def serve_embedded(hub: FakeHub) -> None:
    """The embedded LLM as the catalogue's Qwen2.5 0.5B, the embedded voice as
    zh_CN-huayan-medium, the embedded Whisper as faster-whisper's tiny.en."""
    assert QWEN is not None
    hub.add(QWEN.repo, QWEN.model_file, embedded_llm())
    voice = embedded_voice()
    hub.add(catalogue.PIPER_REPO, HUAYAN[0], voice)
    hub.add(catalogue.PIPER_REPO, HUAYAN[1], Path(f"{voice}.json"))
    for file in embedded_whisper().iterdir():
        if file.is_file():
            hub.add("Systran/faster-whisper-tiny.en", file.name, file)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as running:
        serve_embedded(running)
        monkeypatch.setenv("HF_ENDPOINT", running.url)
        yield running


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """HF_ENDPOINT on a loopback port that refuses connections for the whole test."""
    with refused_port() as port:
        endpoint = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        yield endpoint


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(data_dir=str(tmp_path / "data"))


def test_a_catalogue_llm_downloads_once_into_the_data_dir(
    hub: FakeHub, store: ModelStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    path = models.resolve_llm("qwen2.5-0.5b-instruct-q4_k_m", store)
    assert path.read_bytes() == embedded_llm().read_bytes()
    assert store.cache in path.parents
    assert "Downloading bartowski/Qwen2.5-0.5B-Instruct-GGUF:" in caplog.text
    asked = len(hub.requests)
    # Once: the next start asks the network nothing, and works with the hub gone.
    assert models.resolve_llm("qwen2.5-0.5b-instruct-q4_k_m", store) == path
    assert len(hub.requests) == asked
    assert models.cached_llm("qwen2.5-0.5b-instruct-q4_k_m", store) == path


def test_a_hub_repo_and_file_works_like_a_name(hub: FakeHub, store: ModelStore) -> None:
    assert QWEN is not None
    path = models.resolve_llm(f"{QWEN.repo}:{QWEN.model_file}", store)
    assert path.name == QWEN.model_file and path.stat().st_size == embedded_llm().stat().st_size


def test_a_broken_transfer_resumes_where_it_stopped(hub: FakeHub, store: ModelStore) -> None:
    assert QWEN is not None
    hub.cut.add(QWEN.model_file)
    path = models.resolve_llm("qwen2.5-0.5b-instruct-q4_k_m", store)
    assert path.read_bytes() == embedded_llm().read_bytes()
    first, second = hub.gets(QWEN.model_file)
    # The second request asks only for the rest: what arrived in whole chunks is kept.
    assert first is None and second is not None and second.startswith("bytes=")
    assert 0 < int(second[6:-1]) <= embedded_llm().stat().st_size // 2


def test_a_checksum_mismatch_is_refused_and_nothing_is_kept(
    hub: FakeHub, store: ModelStore
) -> None:
    assert QWEN is not None
    hub.corrupt.add(QWEN.model_file)
    with pytest.raises(ModelDownloadError, match="checksum mismatch for bartowski"):
        models.resolve_llm("qwen2.5-0.5b-instruct-q4_k_m", store)
    assert models.cached_llm("qwen2.5-0.5b-instruct-q4_k_m", store) is None
    assert not [p for p in (store.cache).rglob("*") if p.is_file() and p.stat().st_size > 1000]
    hub.corrupt.clear()  # the next start downloads it anew
    assert models.resolve_llm("qwen2.5-0.5b-instruct-q4_k_m", store).is_file()


def test_offline_is_one_line_and_quick(offline: str, store: ModelStore) -> None:
    start = time.monotonic()
    with pytest.raises(ModelDownloadError) as caught:
        models.resolve_llm("qwen2.5-1.5b-instruct-q4_k_m", store)
    assert time.monotonic() - start < 10
    message = str(caught.value)
    assert "\n" not in message and "unreachable (offline?)" in message
    assert "bartowski/Qwen2.5-1.5B-Instruct-GGUF:Qwen2.5-1.5B-Instruct-Q4_K_M.gguf" in message


def test_offline_falls_back_to_the_embedded_model_when_asked(
    offline: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ModelStore(data_dir=str(tmp_path), fallback_embedded=True)
    assert models.resolve_llm("qwen2.5-1.5b-instruct-q4_k_m", store) == embedded_llm()
    assert models.resolve_voice("zh_CN-huayan-medium", [], store) == embedded_voice()
    assert models.resolve_whisper("base", store) == str(embedded_whisper())
    assert caplog.text.count("the embedded") == 3
    # A name that is wrong is the user's mistake, not the network's: no fallback.
    with pytest.raises(models.ModelNotFoundError, match="not found"):
        models.resolve_llm("no-such-model", store)


def test_a_name_the_hub_lacks_says_check_the_name(hub: FakeHub, store: ModelStore) -> None:
    with pytest.raises(ModelDownloadError, match=r"is not on .* \(HTTP 404\): check the name"):
        models.resolve_llm("someone/nothing-GGUF:model.gguf", store)


def test_a_piper_voice_by_name_comes_in_rhasspy_layout(hub: FakeHub, store: ModelStore) -> None:
    settings = TtsSettings(voice="zh_CN-huayan-medium", store=store)
    before = PiperTts.describe(settings)  # from the name: nothing downloaded yet
    assert (before.model, before.languages, before.sample_rate) == (
        "zh_CN-huayan-medium",
        ("zh_CN",),
        22050,
    )
    path = models.resolve_voice("zh_CN-huayan-medium", [], store)
    assert path.name == "zh_CN-huayan-medium.onnx" and Path(f"{path}.json").is_file()
    assert hub.gets(HUAYAN[0]) == [None] and hub.gets(HUAYAN[1]) == [None]
    after = PiperTts.describe(settings)  # from the downloaded .onnx.json (the joe voice here)
    assert after.languages == ("en_US",) and after.sample_rate == 22050


def test_a_whisper_name_downloads_faster_whispers_files(hub: FakeHub, store: ModelStore) -> None:
    folder = Path(models.resolve_whisper("tiny.en", store))
    assert (folder / "model.bin").read_bytes() == (embedded_whisper() / "model.bin").read_bytes()
    assert (folder / "vocabulary.txt").is_file()
    assert models.cached_whisper("tiny.en", store) == str(folder)


# --- through the real server ---------------------------------------------------------------


@pytest.mark.slow
async def test_the_server_started_with_names_downloads_them_and_serves(
    hub: FakeHub, tmp_path: Path, kitchen_wav: Path
) -> None:
    names = ("--llm-model", "qwen2.5-0.5b-instruct-q4_k_m", "--voice", "zh_CN-huayan-medium")
    args = (*names, "--asr-model", "tiny.en", "--data-dir", str(tmp_path), "--llm-lazy")
    log = tmp_path / "server.log"
    with server_process(*args, log=log) as port:
        [info] = await exchange(port, [Describe().event()], until="info")
        [model] = info.data["handle"][0]["models"]
        [voice] = info.data["tts"][0]["voices"]
        assert model["name"] == "qwen2.5-0.5b-instruct-q4_k_m"  # as the user named it
        assert voice["name"] == "zh_CN-huayan-medium"
        turn = Event("transcript", {"text": "What is the capital of France?"})
        replies = await exchange(port, [turn], until="handled-stop")
        assert replies[-2].type == "handled" and replies[-2].data["text"].strip()
        spoken = await exchange(port, [Synthesize(text="Hello there.").event()], "audio-stop")
        assert sum(len(e.payload or b"") for e in spoken if e.type == "audio-chunk") > 10_000
        pcm, rate, width, channels = read_wav(kitchen_wav)
        events = transcribe_events(pcm, rate, width, channels)
        heard = await exchange(port, events, until="transcript-stop")
        assert {"kitchen", "lights"} <= words(heard[-2].data["text"])
    text = log.read_text()
    assert "Downloaded bartowski/Qwen2.5-0.5B-Instruct-GGUF" in text
    assert "Traceback" not in text


@pytest.mark.slow
async def test_the_server_offline_serves_the_embedded_models_when_asked(
    offline: str, tmp_path: Path
) -> None:
    names = ("--llm-model", "qwen2.5-1.5b-instruct-q4_k_m", "--voice", "zh_CN-huayan-medium")
    log = tmp_path / "server.log"
    with server_process(
        *names, "--data-dir", str(tmp_path), "--model-fallback", "embedded", log=log
    ) as port:
        turn = Event("transcript", {"text": "Hello"})
        replies = await exchange(port, [turn], until="handled-stop")
        assert replies[-2].type == "handled"
        spoken = await exchange(port, [Synthesize(text="Hello there.").event()], "audio-stop")
        assert sum(len(e.payload or b"") for e in spoken if e.type == "audio-chunk") > 10_000
    text = log.read_text()
    assert "unreachable (offline?)" in text and "the embedded voice model serves" in text, text
    assert "Traceback" not in text, text


@pytest.mark.slow
def test_the_server_offline_without_fallback_stops_with_one_line(
    offline: str, tmp_path: Path
) -> None:
    """A voice by name that cannot be downloaded stops the start (exit 1) with one line that
    says why and what to do, as every model that fails to load (server/app.py)."""
    result = subprocess.run(
        [sys.executable, "-m", "wyoming_pivoice", "server", "--no-zeroconf",
         "--uri", f"tcp://127.0.0.1:{free_port()}", "--llm-lazy",
         "--voice", "zh_CN-huayan-medium", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=pivoice_env(),
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in out, out
    [line] = [line for line in out.splitlines() if " ERROR " in line]
    assert "zh_CN-huayan-medium" in line and "unreachable (offline?)" in line, line
    assert "Ready" not in out


def test_an_endpoint_that_is_no_hub_is_one_line_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeHub(hang_up=True) as hub:
        endpoint = hub.url
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        with pytest.raises(ModelDownloadError) as caught:
            models.resolve_llm("qwen2.5-1.5b-instruct-q4_k_m", ModelStore(str(tmp_path / "a")))
        message = str(caught.value)
        assert "\n" not in message and f"{endpoint} did not answer as a model hub" in message
        store = ModelStore(data_dir=str(tmp_path / "b"), fallback_embedded=True)
        assert models.resolve_voice("zh_CN-huayan-medium", [], store) == embedded_voice()
    assert "the embedded voice model serves" in caplog.text


@pytest.mark.slow
def test_a_server_whose_models_all_fail_stops_with_one_line(tmp_path: Path) -> None:
    """The voice and the LLM both fail (the start stops at the first): one line, exit 1, and
    no traceback for the failure nobody waited for."""
    with FakeHub(hang_up=True) as hub:
        env = pivoice_env({**os.environ, "HF_ENDPOINT": hub.url})
        result = subprocess.run(
            [sys.executable, "-m", "wyoming_pivoice", "server", "--no-zeroconf",
             "--uri", f"tcp://127.0.0.1:{free_port()}", "--voice", "zh_CN-huayan-medium",
             "--llm-model", "qwen2.5-1.5b-instruct-q4_k_m", "--data-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in out, out
    [line] = [line for line in out.splitlines() if " ERROR " in line]
    assert "did not answer as a model hub" in line, line
