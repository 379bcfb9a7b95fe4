"""Print the pip requirements of Home Assistant's `wyoming` integration and of every
integration it depends on (run inside a root with homeassistant installed).

HA's test harness never installs an integration's requirements (it skips pip), so the root
needs them beforehand; HA's own manifests say which, so no list is kept here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import homeassistant.components as components

ROOTS = ["wyoming", "stt", "tts", "ffmpeg"]


def requirements(roots: list[str]) -> list[str]:
    base = Path(components.__path__[0])
    seen: set[str] = set()
    wanted: list[str] = []
    todo = list(roots)
    while todo:
        domain = todo.pop()
        if domain in seen or not (base / domain / "manifest.json").exists():
            continue
        seen.add(domain)
        manifest = json.loads((base / domain / "manifest.json").read_text())
        wanted += [r for r in manifest.get("requirements", []) if r not in wanted]
        todo += manifest.get("dependencies", []) + manifest.get("after_dependencies", [])
    return wanted


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:] or ROOTS)))
