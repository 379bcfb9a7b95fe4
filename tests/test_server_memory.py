"""Bounded memory per synthesis, and fair sharing of the voice (engines/tts.py).

Text without sentence ends used to be one Piper inference (~22 MiB of RSS per second of
speech: "9 9 9 …" passed 8 GB). Now every inference speaks at most MAX_PIECE_PHONEMES.
The suite checks the pieces and a short worst case against a server with its RSS watched;
`python -m tests.test_server_memory` runs the full-size worst cases (4000 characters) and
prints the peak.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from wyoming.event import Event, async_read_event, async_write_event

from wyoming_pivoice.engines.tts import MAX_PIECE_PHONEMES, PiperTts, TtsSettings

from .helpers import exchange, server_process, server_process_of

# Texts with no sentence end, each as long as `chars`: the shapes that blew up.
WORST = {
    "nines": lambda chars: ("9 " * chars)[: chars - 1],
    "tabbed-words": lambda chars: "\t".join(["word"] * chars)[:chars],
    "emoji": lambda chars: "😀" * (chars // 50),  # each is read out as "grinning face"
    "one-word": lambda chars: "a" * chars,
}
# Extra server RSS one synthesis may add (a piece is ~12 s of speech: ~260 MiB at 22 MiB/s;
# the old code passed 8 GB on the same text).
RSS_BOUND_MIB = 400


@pytest.fixture(scope="module")
def tts() -> Iterator[PiperTts]:
    yield PiperTts(TtsSettings())


@pytest.mark.parametrize("name", list(WORST))
def test_every_piece_is_bounded(tts: PiperTts, name: str) -> None:
    text = WORST[name](4000)
    pieces = tts.pieces(text)
    assert pieces and all(len(p) <= MAX_PIECE_PHONEMES for p in pieces)
    # The first piece, spoken: one inference, of bounded length.
    pcm = b"".join(tts.speak(pieces[0]))
    seconds = len(pcm) / 2 / tts.sample_rate
    assert 0.3 < seconds < 20.0, seconds


def test_a_normal_sentence_is_one_piece(tts: PiperTts) -> None:
    assert len(tts.pieces("The front door is locked, and the lights are off.")) == 1


class PeakRss:
    """Samples a process's RSS every 20 ms in a thread."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        self.base = proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def added_mib(self) -> float:
        return (self.peak - self.base) / 2**20


async def speak(port: int, text: str, started: asyncio.Event | None = None) -> float:
    """Seconds of audio the server speaks for `text`; `started` is set at its first audio."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await async_write_event(Event("synthesize", {"text": text}), writer)
        samples = 0
        async with asyncio.timeout(600):
            while (event := await async_read_event(reader)).type != "audio-stop":
                assert event.type != "error", event
                if event.type == "audio-chunk":
                    samples += len(event.payload or b"") // 2
                    if started is not None:
                        started.set()
        return samples / 22050
    finally:
        writer.close()


@pytest.fixture(scope="module")
def memory_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    log: Path = tmp_path_factory.mktemp("memory") / "server.log"
    with server_process("--llm-lazy", log=log) as port:
        yield port


async def test_worst_text_keeps_server_memory_bounded(memory_port: int) -> None:
    """A run-on text far longer than one piece, with the server's RSS watched."""
    proc = server_process_of(memory_port)
    await speak(memory_port, "Warm up.")
    with PeakRss(proc) as rss:
        seconds = await speak(memory_port, WORST["nines"](260))
    print(f"\n{seconds:.0f} s of speech; server RSS +{rss.added_mib:.0f} MiB at peak")
    assert seconds > 25  # several pieces' worth
    assert rss.added_mib < RSS_BOUND_MIB


async def test_a_short_request_is_served_between_pieces_of_a_long_one(memory_port: int) -> None:
    """Fair sharing: another client's short synthesis waits for one piece, not the whole."""
    start = time.monotonic()
    await speak(memory_port, "Hi.")
    alone = time.monotonic() - start
    first_audio = asyncio.Event()
    long = asyncio.create_task(speak(memory_port, WORST["nines"](300), first_audio))
    await first_audio.wait()
    start = time.monotonic()
    await speak(memory_port, "Hi.")
    beside = time.monotonic() - start
    assert not long.done()  # served between two pieces of the long one
    await long
    print(
        f"\nshort TTS alone {alone:.2f} s, beside a long one {beside:.2f} s; "
        f"the long one ended {time.monotonic() - start - beside:.1f} s after it"
    )


def main(argv: list[str] | None = None) -> int:
    """The full-size worst cases against a fresh server: peak RSS of each."""
    parser = argparse.ArgumentParser(prog="python -m tests.test_server_memory")
    parser.add_argument("--chars", type=int, default=4000)
    args = parser.parse_args(argv)
    with server_process("--llm-lazy") as port:
        proc = server_process_of(port)
        asyncio.run(speak(port, "Warm up."))
        print(f"server RSS at start {proc.memory_info().rss / 2**20:.0f} MiB")
        for name, make in WORST.items():
            text = make(args.chars)
            start = time.monotonic()
            with PeakRss(proc) as rss:
                seconds = asyncio.run(speak(port, text))
            print(
                f"{name:13s} {len(text):5d} chars: {seconds:6.1f} s of speech in "
                f"{time.monotonic() - start:5.1f} s; RSS peak {rss.peak / 2**20:6.0f} MiB "
                f"(+{rss.added_mib:.0f})"
            )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())


async def test_another_clients_long_synthesis_does_not_slow_a_turn(server_port: int) -> None:
    """ "Audio first" holds a turn back only for its own speech: beside a long synthesis that
    began first, the turn runs at its own pace (it used to wait up to 2 s a token)."""
    first_audio = asyncio.Event()
    long = asyncio.create_task(speak(server_port, WORST["nines"](600), first_audio))
    await first_audio.wait()
    start = time.monotonic()
    replies = await exchange(
        server_port, [Event("transcript", {"text": "What is the capital of France?"})], "handled"
    )
    seconds = time.monotonic() - start
    chunks = sum(e.type == "handled-chunk" for e in replies)
    assert replies[-1].data["text"] and not long.done()  # done while the voice still speaks
    await long
    print(f"\nturn beside a long synthesis: {chunks} pieces in {seconds:.2f} s")
