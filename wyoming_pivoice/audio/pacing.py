"""Audio on the wall clock: pacing a stream like a device, and the audio threads' priority.

Standard library only. Waiting in general (backoff, a 3.10-safe timeout) is realtime.py.
"""

from __future__ import annotations

import asyncio
import threading
import time

__all__ = ["AUDIO_NICE", "AUDIO_RT_PRIORITY", "Pacer", "raise_thread"]


class Pacer:
    """Paces a stream like a device: each piece is due when the pieces before it have
    played (or been captured), counted from the first piece.

    `lead`: how long before its due time a piece may go (0: exactly on time; negative: that
    long after, e.g. a capture device hands a chunk over once its last sample is in).
    `late`: how late a piece may come before the timeline moves on, as a device that ran dry
    starts again when audio comes; None keeps the timeline fixed, so a late reader catches up.
    """

    def __init__(self, lead: float = 0.0, late: float | None = 0.0) -> None:
        self.lead = lead
        self.late = late
        self.start: float | None = None  # monotonic time the first piece was due
        self.seconds = 0.0  # the length of the pieces so far

    async def advance(self, seconds: float) -> float:
        """Wait until a piece `seconds` long may go; returns when it is due."""
        now = time.monotonic()
        if self.start is None:
            self.start = now
        due = self.start + self.seconds
        if self.late is not None and now - due > self.late:
            self.start += now - due
            due = now
        self.seconds += seconds
        delay = due - self.lead - now
        if delay > 0:
            await asyncio.sleep(delay)
        return due

    def taken(self, due: float) -> float:
        """The piece due at `due` was taken just now: it cannot play before now, so one taken
        too late (a device whose buffer was full) moves the timeline on. Returns when it plays."""
        late = time.monotonic() - due
        if self.late is not None and late > self.late and self.start is not None:
            self.start += late
            return due + late
        return due

    async def finish(self) -> None:
        """Wait until every piece so far has played."""
        if self.start is not None:
            delay = self.start + self.seconds - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    def reset(self, start: float | None = None) -> None:
        """A new stream: its first piece is due at `start` (None: when it comes)."""
        self.start = start
        self.seconds = 0.0


# ---- the audio threads' priority ------------------------------------------------------------

# Real-time round-robin, low in the range: above every normal thread (the models' too), below
# the kernel's and the sound server's (PipeWire asks for 20 and up).
AUDIO_RT_PRIORITY = 10
AUDIO_NICE = -10  # the fallback where real-time scheduling is not permitted
_priority_logged: set[str] = set()


def raise_thread(
    name: str, rt: int = AUDIO_RT_PRIORITY, nice: int = AUDIO_NICE, inherit: bool = True
) -> str:
    """Give the calling thread (an audio thread) priority over model work: SCHED_RR `rt` where
    permitted (root, CAP_SYS_NICE, or an RLIMIT_RTPRIO such as systemd's LimitRTPRIO=),
    else a raised `nice` value, else nothing. `inherit=False`: the threads it starts later
    (executors' workers) run at normal priority. Logged once per kind; returns what it got."""
    import logging
    import os

    logger = logging.getLogger(__name__)
    got = "normal"
    own = 0 if inherit else getattr(os, "SCHED_RESET_ON_FORK", 0)
    try:
        os.sched_setscheduler(0, os.SCHED_RR | own, os.sched_param(rt))
        got = f"SCHED_RR {rt}"
    except (AttributeError, OSError):
        try:
            if own:  # a plain policy may always be set; the flag keeps nice off its threads
                os.sched_setscheduler(0, os.SCHED_OTHER | own, os.sched_param(0))
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            got = f"nice {nice}"
        except (AttributeError, OSError):
            pass
    if name not in _priority_logged:
        _priority_logged.add(name)
        if got == "normal":
            logger.warning(
                "The %s thread runs at normal priority (no real-time or raised nice allowed): "
                "model work beside it may delay it; allow it with LimitRTPRIO=%d (systemd) "
                "or an rtprio limit for the audio group",
                name,
                rt,
            )
        else:
            logger.info("The %s thread runs at %s", name, got)
    return got
