"""A stand-in wake word service for rhasspy's wyoming-satellite in script/ha-real: its satellite
always needs a wake word (local, or HA's wake stage, which the harness has no engine for), and
its `--vad` cannot go with one. A Wyoming wake service (the `wyoming` library's server, run on
rhasspy's venv) that detects "cue" as the mic (tests/ha_real/mic.py) begins each clip, read
from FOLDER/said.log at each audio chunk: the user said the wake word just before the request.

    python wake.py tcp://127.0.0.1:PORT FOLDER"""

from __future__ import annotations

import asyncio
import sys
from functools import partial
from pathlib import Path
from typing import Any

from wyoming.audio import AudioChunk
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, WakeModel, WakeProgram
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.wake import Detection

ATTRIBUTION = Attribution(name="wyoming-pivoice", url="")
INFO = Info(
    wake=[
        WakeProgram(
            name="cue",
            description="the mic's cue",
            attribution=ATTRIBUTION,
            installed=True,
            version="1",
            models=[
                WakeModel(
                    name="cue",
                    description="cue",
                    attribution=ATTRIBUTION,
                    installed=True,
                    languages=["en"],
                    phrase="cue",
                    version="1",
                )
            ],
        )
    ]
)


def said(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


class Handler(AsyncEventHandler):  # type: ignore[misc]
    def __init__(self, log: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = log
        self.seen = said(log)

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(INFO.event())
        elif AudioChunk.is_type(event.type) and (now := said(self.log)) > self.seen:
            self.seen = now
            chunk = AudioChunk.from_event(event)
            await self.write_event(Detection(name="cue", timestamp=chunk.timestamp).event())
        return True


async def main() -> None:
    server = AsyncServer.from_uri(sys.argv[1])
    await server.run(partial(Handler, Path(sys.argv[2]) / "said.log"))


if __name__ == "__main__":
    asyncio.run(main())
