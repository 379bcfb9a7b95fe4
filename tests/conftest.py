"""Session-wide fixtures: one real server on the embedded models, shared by the tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import make_speech, server_process


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
