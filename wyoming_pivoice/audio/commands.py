"""Mic and speaker commands, each in its own process group, ended as a group.

A command line runs through /bin/sh, which does not pass signals on to its children:
killing the shell alone leaves `arecord`/`aplay` running (and, for a speaker, playing).
Each command therefore starts a new session (process group = its pid) and is signalled
with killpg, so everything it started goes with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from ..realtime import timeout

KILL_WAIT = 1.0  # after SIGKILL the kernel needs only a moment; never wait longer than this


async def start_command(command: str, **kwargs: Any) -> asyncio.subprocess.Process:
    """`command` through the shell, as the leader of a new process group."""
    return await asyncio.create_subprocess_shell(command, start_new_session=True, **kwargs)


def signal_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def end_command(proc: asyncio.subprocess.Process, grace: float = 0.3) -> int | None:
    """End the command and whatever its group still runs; returns its exit status.

    A running command gets SIGTERM and `grace` seconds (0: SIGKILL at once, for a speaker
    that must fall silent now), then SIGKILL. A command that already exited may have left
    children in its group: they are killed too. Bounded: at most `grace` + KILL_WAIT, and
    finished even if the caller is cancelled meanwhile (a shutdown cancels its tasks more
    than once; a half-ended command outlives the event loop).
    """
    ending = asyncio.ensure_future(_end(proc, grace))
    try:
        return await asyncio.shield(ending)
    except asyncio.CancelledError:
        signal_group(proc, signal.SIGKILL)  # no more grace
        await asyncio.wait({ending}, timeout=KILL_WAIT)
        raise


async def _end(proc: asyncio.subprocess.Process, grace: float) -> int | None:
    _drop_pipes(proc)  # asyncio's wait() also waits for our end of its pipes to close
    if proc.returncode is None and grace > 0:
        signal_group(proc, signal.SIGTERM)
        with contextlib.suppress(asyncio.TimeoutError):
            async with timeout(grace):
                await proc.wait()
    signal_group(proc, signal.SIGKILL)  # the leader if it is still there, and any stragglers
    if proc.returncode is None:
        with contextlib.suppress(asyncio.TimeoutError):
            async with timeout(KILL_WAIT):
                await proc.wait()
    # Close the transport now: left to the garbage collector after the event loop has
    # closed, it prints "Event loop is closed" tracebacks.
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
    return proc.returncode


def _drop_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close our ends of its pipes without waiting: unsent input is dropped, and a paused
    reader no longer has to see EOF before wait() returns."""
    transport = getattr(proc, "_transport", None)
    if transport is None:
        return
    for fd in (0, 1, 2):
        pipe = transport.get_pipe_transport(fd)
        if pipe is not None and not pipe.is_closing():
            getattr(pipe, "abort", pipe.close)()


async def wait_command(proc: asyncio.subprocess.Process, seconds: float) -> int | None:
    """Give the command `seconds` to exit by itself, then end its group."""
    with contextlib.suppress(asyncio.TimeoutError):
        async with timeout(max(seconds, 0.0)):
            await proc.wait()
    return await end_command(proc)
