"""Session-wide fixtures (one real server on the embedded models, shared by the tests) and the
`slow` marker, applied here so that `script/test -m "not slow"` runs the logic tests alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import make_speech, server_process

# Fixtures that start a server, a model or an outside program: a test using any is slow.
SLOW_FIXTURES = {
    "server_port",  # the session server on the real models
    "limited_port", "slots_port", "memory_port", "short_text_port", "tiny_port",  # servers
    "voice_loaded", "fuzz_server", "reply_audio",  # answers of the session server
    "asr", "llm", "tts", "faulty",  # real models loaded in the test process
    "engine", "running", "pivoice",  # llama.cpp's own server and a server using it
    "bench_result", "corpus_dir",  # the bench; its corpus spoken by espeak-ng
    "dist", "venv", "installed_server",  # a wheel built and installed afresh
    "hub",  # the stand-in Hugging Face Hub serving the embedded models (downloads, hashes)
}  # fmt: skip
# Modules whose tests start server or satellite processes themselves or run real-time rooms:
# slow whatever their fixtures. (Single slow tests elsewhere carry @pytest.mark.slow.)
SLOW_MODULES = {
    "test_concurrency", "test_faults_satellite", "test_ha_faults",
    "test_ha_satellite", "test_ha_satellite_zeroconf", "test_room", "test_satellite_room",
    "test_satellite_standalone", "test_server_startup", "test_wheel_install", "test_zeroconf",
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SLOW_FIXTURES or item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def server_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with server_process(log=log) as port:
        yield port


@pytest.fixture(scope="session")
def speech_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speech")


@pytest.fixture(scope="session")
def kitchen_wav(speech_dir: Path) -> Path:
    return make_speech("Turn on the kitchen lights please.", speech_dir / "kitchen.wav")
