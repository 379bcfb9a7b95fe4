"""What every doctor check shares: its name, a finding, its status, and the machine it looks at.

The machine is a root folder (normally `/`) so tests can point the checks at fake
`/sys` and `/proc` trees, plus the optional `vcgencmd` of the Raspberry Pi firmware.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

MIB = 1024 * 1024


class Status(str, Enum):
    OK = "OK"
    INFO = "INFO"  # nothing to judge: the check cannot see what it looks for here
    WARN = "WARN"  # works, but slower or less safe than it could be; the fix says how
    FAIL = "FAIL"  # the voice assistant will not work as configured

    @property
    def rank(self) -> int:
        return list(Status).index(self)


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    message: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status.value,
            "message": self.message,
            "fix": self.fix,
            "data": self.data,
        }


@dataclass(frozen=True)
class Check:
    """One line of the report: its name (the only place it is spelled) and what it looks at.

    registry.py lists every check once, in report order.
    """

    name: str
    about: str

    def finding(
        self, status: Status, message: str, fix: str = "", data: dict[str, Any] | None = None
    ) -> Finding:
        return Finding(self.name, status, message, fix, data or {})


@dataclass(frozen=True)
class Machine:
    root: Path = Path("/")
    vcgencmd: str | None = None  # path to the Raspberry Pi firmware tool, if present

    @classmethod
    def local(cls, root: Path = Path("/")) -> Machine:
        return cls(root=root, vcgencmd=shutil.which("vcgencmd"))

    def path(self, relative: str) -> Path:
        return self.root / relative.lstrip("/")

    def read(self, relative: str) -> str | None:
        """A small kernel file's text, or None where it does not exist or cannot be read."""
        return read_text(self.path(relative))

    def glob(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern.lstrip("/")))

    def firmware(self, *args: str) -> str | None:
        """`vcgencmd ARGS` output, or None where there is no working vcgencmd."""
        if self.vcgencmd is None:
            return None
        try:
            done = subprocess.run(
                [self.vcgencmd, *args], capture_output=True, text=True, timeout=5, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def mib(num_bytes: float) -> str:
    return f"{num_bytes / MIB:,.0f} MiB"
