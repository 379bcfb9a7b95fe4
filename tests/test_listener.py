"""Control flow of the shared listener and the standalone satellite's wake-word window.

Stand-in detectors say which chunk holds what; the real VAD and wake word are exercised
end to end in test_satellite_standalone.py and test_ha_satellite.py.
"""

from __future__ import annotations

import pytest

from wyoming_pivoice.audio.format import CHUNK_BYTES
from wyoming_pivoice.satellite import listener as listener_module
from wyoming_pivoice.satellite.endpoint import EndpointEvent, EndpointKind
from wyoming_pivoice.satellite.listener import Heard, Listener, WakeWindow

CHUNK_S = 0.032


class ScriptMic:
    """`chunks` chunks, chunk i captured at i × 32 ms; a read may fail once."""

    def __init__(self, chunks: int, fail_at: int | None = None) -> None:
        self.chunks = chunks
        self.fail_at = fail_at
        self.read_count = 0
        self.chunk_time: float | None = None

    async def open(self) -> None:
        pass

    async def read(self) -> bytes | None:
        i = self.read_count
        self.read_count += 1
        if i == self.fail_at:
            self.fail_at = None
            self.read_count -= 1
            raise OSError("device hiccup")
        if i >= self.chunks:
            return None
        self.chunk_time = i * CHUNK_S
        return i.to_bytes(2, "little") * (CHUNK_BYTES // 2)

    async def close(self) -> None:
        pass


def index(chunk: bytes) -> int:
    return int.from_bytes(chunk[:2], "little")


class ScriptEndpointer:
    """Speech from chunk `start` to `end` (an endpoint at `end`); records what it is fed."""

    hearing = None

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.fed: list[int] = []
        self.resets = 0
        self.in_speech = False

    async def load(self) -> None:
        pass

    async def feed(self, chunk: bytes, now: float | None = None) -> list[EndpointEvent]:
        i = index(chunk)
        self.fed.append(i)
        t = now or 0.0
        if i == self.start:
            self.in_speech = True
            return [EndpointEvent(EndpointKind.SPEECH_STARTED, t, t, t)]
        if i == self.end and self.in_speech:
            self.in_speech = False
            return [EndpointEvent(EndpointKind.ENDPOINT, t, t, t)]
        return []

    def flush(self, now: float | None = None) -> list[EndpointEvent]:
        return []

    def reset(self) -> None:
        self.resets += 1
        self.in_speech = False

    def close(self) -> None:
        pass


class ScriptWake:
    name = "okay_nabu"
    phrase = "Okay Nabu"

    def __init__(self, *at: int) -> None:
        self.at = set(at)
        self.heard: list[int] = []

    async def async_detect(self, chunk: bytes) -> bool:
        self.heard.append(index(chunk))
        return index(chunk) in self.at

    async def async_reset(self) -> None:
        pass

    def close(self) -> None:
        pass


async def listen(listener: Listener, window: WakeWindow) -> list[tuple[int, EndpointKind]]:
    events: list[tuple[int, EndpointKind]] = []

    async def heard(heard: Heard) -> None:
        for event in await window.heard(heard):
            events.append((index(heard.chunk), event.kind))

    await listener.run(window, heard)
    return events


async def test_without_a_wake_word_every_chunk_reaches_the_endpointer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(listener_module, "READ_RETRY_S", 0.0)
    endpointer = ScriptEndpointer(start=5, end=20)
    listener = Listener(ScriptMic(30, fail_at=3), endpointer)
    events = await listen(listener, WakeWindow(listener))
    assert endpointer.fed == list(range(30))  # the failed read is retried, nothing lost
    assert events == [(5, EndpointKind.SPEECH_STARTED), (20, EndpointKind.ENDPOINT)]


async def test_the_endpointer_hears_only_what_follows_the_wake_word() -> None:
    endpointer = ScriptEndpointer(start=12, end=20)
    wake = ScriptWake(10)
    listener = Listener(ScriptMic(40), endpointer, wake)
    woken: list[bool] = []

    async def on_wake() -> None:
        woken.append(True)

    events = await listen(listener, WakeWindow(listener, timeout=1.0, on_wake=on_wake))
    assert woken == [True] and endpointer.resets == 1
    # The word's own chunk is no part of the request; after the endpoint the word is
    # awaited again, and the detector is not run while the window is open.
    assert endpointer.fed == list(range(11, 21))
    assert wake.heard == [*range(0, 11), *range(21, 40)]
    assert events == [(12, EndpointKind.SPEECH_STARTED), (20, EndpointKind.ENDPOINT)]


async def test_no_speech_after_the_wake_word_closes_the_window() -> None:
    endpointer = ScriptEndpointer(start=100, end=200)  # never speaks
    wake = ScriptWake(2)
    listener = Listener(ScriptMic(60), endpointer, wake)
    timeout = 20.5 * CHUNK_S  # the window: chunks 3 to 22
    events = await listen(listener, WakeWindow(listener, timeout=timeout))
    assert events == []
    assert endpointer.fed == list(range(3, 23))
    assert wake.heard[-1] == 59
