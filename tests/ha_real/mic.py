"""A microphone for script/ha-real's satellites: raw s16le 16 kHz mono on stdout at real time
(a sound card's pace), silence, and clip CLIPS/NAME.raw once each time FOLDER/go appears with
NAME in it (the test writes it; tests/ha_real/ha_wyoming.py `say`). FOLDER/said.log gets a
line "MONOTONIC NAME" as each clip's first chunk is written (the root shares the host's clock).

    python mic.py FOLDER CLIPS

Paced here, at the source, so the pipe to the satellite holds a chunk, not seconds: a shell loop
paced after the fact (`… | pv -L`) kept ~6 s of silence queued in front of each cue's words (the
loop's pipe and pv's buffer), and rhasspy's satellite reads its microphone unpaced. Standard
library only: it runs on whatever Python starts it (ours, or rhasspy's satellite's venv)."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

CHUNK = 1024  # bytes: 32 ms at 16 kHz, 16-bit mono
SECONDS = CHUNK / 32000


def main() -> None:
    folder, clips = Path(sys.argv[1]), Path(sys.argv[2])
    go = folder / "go"
    out = sys.stdout.buffer
    pending = b""
    began, n = time.monotonic(), 0
    while True:
        if not pending and go.exists():
            name = go.read_text().strip() or "kitchen"
            go.unlink()
            pending = (clips / f"{name}.raw").read_bytes()
            with open(folder / "said.log", "a") as said:
                said.write(f"{time.monotonic():.3f} {name}\n")
        chunk, pending = pending[:CHUNK], pending[CHUNK:]
        out.write(chunk.ljust(CHUNK, b"\0"))
        out.flush()
        n += 1
        # On an absolute timeline: a late wake (load) is made up by the next chunks.
        time.sleep(max(0.0, began + n * SECONDS - time.monotonic()))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        main()
