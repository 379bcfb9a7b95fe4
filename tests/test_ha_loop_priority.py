"""The Home Assistant satellite's event loop runs above the models (it turns a barge-in into
`run-pipeline`), and the threads it starts later (the wake word's executor, `to_thread`) do not
inherit that priority."""

from __future__ import annotations

import os
import threading

import pytest

from wyoming_pivoice.audio.pacing import raise_thread
from wyoming_pivoice.satellite.ha.adapter import LOOP_RT_PRIORITY


def priority() -> tuple[int, int]:
    """The calling thread's policy (without the reset-on-fork flag) and nice value."""
    flag = getattr(os, "SCHED_RESET_ON_FORK", 0)
    return os.sched_getscheduler(0) & ~flag, os.getpriority(os.PRIO_PROCESS, 0)


def test_the_loop_is_raised_and_its_later_threads_are_not() -> None:
    got: dict[str, object] = {}

    def loop_thread() -> None:  # as serve_ha_satellite does on the loop's thread
        got["raised"] = raise_thread("test loop", rt=LOOP_RT_PRIORITY, inherit=False)
        got["loop"] = priority()
        child = threading.Thread(target=lambda: got.setdefault("child", priority()))
        child.start()
        child.join()

    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join()
    if got["raised"] == "normal":
        pytest.skip("neither real-time scheduling nor a raised nice value is allowed here")
    assert got["loop"] != (os.SCHED_OTHER, 0), got
    assert got["child"] == (os.SCHED_OTHER, 0), got
