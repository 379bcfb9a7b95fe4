"""Running blocking model code from asyncio: load once, one call at a time, stream results.

A `ModelSlot` owns one model for the whole process. It loads in a worker thread
(so a server can answer `describe` while it loads), and serialises calls so
concurrent clients queue for the model instead of interleaving inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar, cast

from .. import compute_log

_LOGGER = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_DONE = object()

# The models run below the audio. A satellite on the same Pi (microphone, echo canceller and
# VAD at nice 0, -10 or real-time) must get the core it asks for while a reply decodes, or its
# echo reference slides (issue #20). Raising one's own nice value is always permitted, so this
# holds for any user, where real-time priority for the satellite often is not. The threads a
# model library starts (llama.cpp's, CTranslate2's, onnxruntime's pools) inherit it from the
# worker thread that loads or calls the model; the event loop stays at 0, so `describe` is
# answered at once. CFS weights nice 0 : 5 as 1024 : 335, about 3 : 1.
INFERENCE_NICE = 5


def lower_priority(tid: int | None = None) -> None:
    """Run a thread (the calling one by default), and the threads it starts, at
    INFERENCE_NICE (never higher)."""
    tid = threading.get_native_id() if tid is None else tid
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no getpriority here
        if os.getpriority(os.PRIO_PROCESS, tid) < INFERENCE_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, INFERENCE_NICE)


def model_executor() -> ThreadPoolExecutor:
    """The server's default executor: every model load and call runs on it, below the audio.

    The pools a library started at import, from the calling (main) thread, go below too:
    numpy's OpenBLAS threads took 0.2 s per turn at nice 0 (test_inference_priority)."""
    with contextlib.suppress(OSError):
        me = threading.get_native_id()
        for tid in (int(t) for t in os.listdir("/proc/self/task")):
            if tid != me:
                lower_priority(tid)
    return ThreadPoolExecutor(thread_name_prefix="model", initializer=lower_priority)


class ModelSlot(Generic[T]):
    def __init__(self, name: str, loader: Callable[[], T], kind: str | None = None) -> None:
        self.name = name
        self.kind = kind  # asr, llm or tts: its load goes into the compute log
        self._loader = loader
        self._load_task: asyncio.Future[T] | None = None
        self._lock = asyncio.Lock()
        self.load_seconds: float | None = None

    def start_loading(self) -> asyncio.Future[T]:
        """Begin loading in a worker thread (idempotent)."""
        if self._load_task is None:
            loop = asyncio.get_running_loop()
            self._load_task = loop.run_in_executor(None, self._timed_load)
            # Every get() still raises a failed load; this only keeps asyncio from printing
            # a traceback for a load nobody awaited (the start stops at the first failure).
            self._load_task.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._load_task

    def _timed_load(self) -> T:
        start = time.monotonic()
        _LOGGER.info("Loading %s", self.name)
        model = self._loader()
        self.load_seconds = time.monotonic() - start
        _LOGGER.info("Loaded %s in %.2f s", self.name, self.load_seconds)
        if self.kind is not None:
            log = compute_log.current()
            log.record_load(self.kind, compute_log.model_name(model), self.load_seconds)
        return model

    @property
    def loaded(self) -> bool:
        task = self._load_task
        return task is not None and task.done() and task.exception() is None

    async def get(self) -> T:
        return await asyncio.shield(self.start_loading())

    async def run(self, fn: Callable[[T], R]) -> R:
        """Run fn(model) in a worker thread, one caller at a time."""
        model = await self.get()
        async with self._lock:
            future = asyncio.get_running_loop().run_in_executor(None, fn, model)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                # The thread cannot be stopped; keep the model locked until it lets go.
                await asyncio.wait([future])
                raise

    async def stream(
        self, fn: Callable[[T, threading.Event], Iterator[R]]
    ) -> AsyncGenerator[R, None]:
        """Iterate fn(model, cancel) in a worker thread, holding the model while it runs.

        The model is free again as soon as the worker thread is done, not when the
        consumer has taken every item: a client that reads its replies slowly (or not at
        all) holds only its own results, which the request's limits bound, never the
        model. Leaving the `async for` early (break, exception, task cancel) sets the
        cancel event so the worker stops at its next item instead of running on.
        """
        model = await self.get()
        await self._lock.acquire()
        # From here to the thread's start nothing awaits, so the release is always armed.
        items = iterate_in_thread(lambda cancel: fn(model, cancel), on_done=self._lock.release)
        async with contextlib.aclosing(items):
            async for item in items:
                yield item


async def iterate_in_thread(
    factory: Callable[[threading.Event], Iterator[R]],
    on_done: Callable[[], None] | None = None,
) -> AsyncGenerator[R, None]:
    """Drive a blocking iterator in a worker thread and yield its items on the loop.

    `on_done` runs on the loop once the thread has finished, whether or not every item
    was consumed.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    cancel = threading.Event()

    def worker() -> None:
        try:
            for item in factory(cancel):
                loop.call_soon_threadsafe(queue.put_nowait, item)
                if cancel.is_set():
                    break
        except BaseException as err:  # handed to the consumer, raised there
            loop.call_soon_threadsafe(queue.put_nowait, _Failure(err))
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)

    future = loop.run_in_executor(None, worker)
    if on_done is not None:
        future.add_done_callback(lambda _future: on_done())
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                break
            if isinstance(item, _Failure):
                raise item.error
            yield cast(R, item)  # neither _DONE nor a _Failure: the worker's item
    finally:
        cancel.set()
        # The thread cannot be stopped; wait until it has let go of its model.
        await asyncio.shield(future)


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error
