"""The remote engine's turn gate and body bounds as pure logic (the real engines:
test_remote_llm_engine.py, test_remote_llm_hostile.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from wyoming_pivoice.engines.remote_llm import MAX_LINE_BYTES, TooLarge, _BoundedStream
from wyoming_pivoice.engines.remote_slot import TurnGate


async def test_the_gate_lets_turns_in_in_order_of_arrival() -> None:
    gate = TurnGate(1)
    order: list[int] = []
    release = asyncio.Event()

    async def turn(n: int) -> None:
        async with gate.turn(10):
            order.append(n)
            await release.wait()

    tasks = [asyncio.create_task(turn(n)) for n in range(4)]
    while not order:
        await asyncio.sleep(0)
    assert order == [0] and gate.running == 1 and gate.waiting == 3
    release.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3] and gate.running == 0


async def test_a_waiter_that_times_out_or_is_cancelled_holds_no_place() -> None:
    gate = TurnGate(1)
    held = asyncio.Event()
    done = asyncio.Event()

    async def holder() -> None:
        async with gate.turn(10):
            held.set()
            await done.wait()

    task = asyncio.create_task(holder())
    await held.wait()
    with pytest.raises((TimeoutError, asyncio.TimeoutError)):
        async with gate.turn(0.01):
            pass
    cancelled = asyncio.create_task(gate.turn(10).__aenter__())
    await asyncio.sleep(0)
    cancelled.cancel()
    done.set()
    await task
    assert gate.running == 0
    async with gate.turn(1):  # the place is free again
        assert gate.running == 1
    gate.resize(3)
    assert gate.width == 3


class _Chunks:
    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        pass


async def _read(*chunks: bytes) -> bytes:
    stream = _BoundedStream(_Chunks(*chunks), MAX_LINE_BYTES)  # type: ignore[arg-type]
    return b"".join([c async for c in stream])


async def test_event_lines_are_bounded_across_and_within_chunks() -> None:
    fine = b"data: x\n\n" * 1000
    assert await _read(fine, fine) == fine * 2
    half = b"y" * (MAX_LINE_BYTES // 2 + 1)
    with pytest.raises(TooLarge):
        await _read(half, half)  # one line over two chunks
    with pytest.raises(TooLarge):
        await _read(b"a\n" + b"z" * (MAX_LINE_BYTES + 1) + b"\nb")  # within one chunk
    assert await _read(half + b"\n", half) == half + b"\n" + half  # two lines, each fine
