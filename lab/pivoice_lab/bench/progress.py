"""A progress bar on stderr (plain lines when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, what: str, stream: TextIO | None = None) -> None:
        self.total = max(1, total)
        self.what = what
        self.done = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self._last_plain = 0.0

    def step(self, label: str = "", count: int = 1) -> None:
        self.done = min(self.total, self.done + count)
        self.show(label)

    def show(self, label: str = "") -> None:
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        if self.tty:
            width = 30
            filled = int(width * self.done / self.total)
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(
                f"\r{self.what} [{bar}] {self.done}/{self.total} {elapsed:4.0f} s "
                f"(~{eta:.0f} s left) {label[:40]:<40}"
            )
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            now = time.monotonic()
            # Plain text: one line per step, at most one a second (and always the last).
            if now - self._last_plain < 1.0 and self.done < self.total:
                return
            self._last_plain = now
            self.stream.write(f"{self.what}: {self.done}/{self.total} {elapsed:.0f} s {label}\n")
        self.stream.flush()
