"""A real OpenAI-compatible LLM engine for tests: llama-cpp-python's own server
(`python -m llama_cpp.server`) on the embedded SmolLM2 GGUF, on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pivoice_lab.bench.servers import stop
from pivoice_lab.ports import free_port, wait_for_port
from wyoming_pivoice.models import EMBEDDED_LLM

MODEL_ALIAS = "smollm2"
# What llama_cpp.server prints when the client of a streamed completion has gone: it stops
# iterating the model's generator there, so no further token is computed.
DISCONNECTED = "Disconnected from client"
# What llama.cpp prints (verbose, the server's default) when a generation has run to its end.
GENERATED = "llama_perf_context_print:        eval time"


class LlamaServer:
    """Start, kill and restart (on the same port) one engine; its output goes to `log`."""

    def __init__(self, log: Path, threads: int = 1, interrupt: bool = False) -> None:
        self.log = log
        self.port = free_port()
        self.threads = threads
        # True: the engine's default, where a new request ends the running stream.
        self.interrupt = interrupt
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        argv = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(EMBEDDED_LLM.locate()), "--model_alias", MODEL_ALIAS,
            "--host", "127.0.0.1", "--port", str(self.port),
            # One thread for the prompt too: its default (all cores) crawls on a busy 2-core box.
            "--n_ctx", "2048", "--n_threads", str(self.threads),
            "--n_threads_batch", str(self.threads),
            # Off, so that a new request never cuts a stream short: a stream that ends
            # early in these tests was ended by its client.
            "--interrupt_requests", str(self.interrupt),
        ]  # fmt: skip
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Its "Disconnected" is a print(): unbuffered, it is in the log when it happens.
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        wait_for_port(self.port, self.proc, timeout=60)

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def kill(self) -> None:
        """SIGKILL: the engine dies as a crashed or unplugged one does, mid-sentence."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def count(self, needle: str) -> int:
        return self.text().count(needle)

    async def wait_for(self, needle: str, more_than: int, timeout: float = 15.0) -> float:
        """Wait until `needle` occurs more than `more_than` times in the log; when it did."""
        deadline = time.monotonic() + timeout
        while self.count(needle) <= more_than:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{needle!r} not in the engine's log after {timeout:.0f} s; its end:\n"
                    + self.text()[-3000:]
                )
            await asyncio.sleep(0.01)
        return time.monotonic()


@contextlib.contextmanager
def started(log_dir: Path, **options: object) -> Iterator[LlamaServer]:
    """One engine for a module's tests (its log in `log_dir`), stopped after them."""
    server = LlamaServer(log_dir / "llama_server.log", **options)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()
