"""A stand-in wake word for rhasspy's wyoming-satellite in script/ha-real: its satellite always
needs one (local, or HA's wake stage, which the harness has no engine for), and `--vad` with a
wake word is refused. Its `--wake-command` protocol: raw audio on stdin, a line (the word's
name) on stdout per detection. This fires as the mic (tests/ha_real/mic.py) begins each clip,
read from FOLDER/said.log: the user said the wake word just before the request.

    python wake.py FOLDER"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

POLL = 0.02  # s between two looks at said.log (a file has no event to wait on here)


def drain() -> None:
    """Read the satellite's audio and drop it (a full pipe would stall the satellite)."""
    while sys.stdin.buffer.read(4096):
        pass


def main() -> None:
    said = Path(sys.argv[1]) / "said.log"
    threading.Thread(target=drain, daemon=True).start()
    seen = len(said.read_text().splitlines()) if said.exists() else 0
    while True:
        lines = said.read_text().splitlines() if said.exists() else []
        for _ in lines[seen:]:
            sys.stdout.write("cue\n")
            sys.stdout.flush()
        seen = max(seen, len(lines))
        time.sleep(POLL)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        main()
