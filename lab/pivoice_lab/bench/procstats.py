"""Per-process figures the bench reports: RSS now and at peak, CPU seconds, open descriptors."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class ProcSample:
    rss_mb: float
    peak_rss_mb: float  # the kernel's high-water mark (VmHWM) since start
    cpu_s: float  # user + system
    fds: int
    threads: int


def _hwm_kb(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def sample(pid: int | None = None) -> ProcSample:
    proc = psutil.Process(pid or os.getpid())
    with proc.oneshot():
        rss = proc.memory_info().rss
        cpu = proc.cpu_times()
        fds = proc.num_fds()
        threads = proc.num_threads()
    hwm = _hwm_kb(proc.pid)
    peak = hwm * 1024 if hwm is not None else rss
    return ProcSample(
        rss_mb=rss / 2**20,
        peak_rss_mb=max(peak, rss) / 2**20,
        cpu_s=cpu.user + cpu.system,
        fds=fds,
        threads=threads,
    )
