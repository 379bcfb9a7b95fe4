"""The Wyoming surface: which event goes to which request handler.

Like rhasspy's wyoming-faster-whisper and wyoming-piper handlers, this only dispatches:
the connection's lifecycle, deadlines and answers are in connection.py, the checks on event
data in validate.py (codes in errors.py), the requests in transcribe.py, converse.py and
synthesize.py, and the scheduling of the models in services.py.
"""

from __future__ import annotations

import asyncio
import logging

from wyoming.event import Event
from wyoming.ping import Pong

from . import follow
from .connection import Connection
from .converse import Conversations
from .errors import Owed
from .services import Services
from .synthesize import Syntheses
from .transcribe import Transcriptions
from .validate import check_utf8, event_data

_LOGGER = logging.getLogger(__name__)

# What a refused event owes its client, by event type (errors.py).
_OWED = {
    "transcribe": Owed.TRANSCRIPT,
    "audio-start": Owed.TRANSCRIPT,
    "audio-chunk": Owed.TRANSCRIPT,
    "audio-stop": Owed.TRANSCRIPT,
    "transcript": Owed.TURN,
    "synthesize": Owed.AUDIO,
    "synthesize-stop": Owed.STREAM_END,
}


class PivoiceEventHandler(Connection):
    def __init__(
        self,
        services: Services,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(services, reader, writer)
        limits, queue, write = self.limits, self.queue, self.write_event
        self.asr = Transcriptions(services, limits, queue, write)
        self.turns = Conversations(services, limits, queue, write, self.host)
        self.tts = Syntheses(services, limits, queue, write, self.host, self.report)
        self._follower: follow.Follower | None = None  # a satellite following its turns
        self._own_tts = False  # the TTS a following satellite speaks its reply with

    def receiving(self) -> bool:
        return self.asr.receiving or self.tts.receiving

    def owed_by(self, event_type: str) -> Owed:
        return _OWED.get(event_type, Owed.NOTHING)

    def is_request(self, event_type: str) -> bool:
        # An event we ignore asks for nothing, so it buys no slot and no time.
        return event_type in _HANDLED and super().is_request(event_type)

    async def handle_event(self, event: Event) -> bool:
        data = event_data(event)
        kind = event.type
        if kind not in _HANDLED:
            _LOGGER.debug("%s: ignoring event %s", self.peer, kind)
            return True
        check_utf8(data)
        if kind == "describe":
            await self.reply(self.services.description.info().event())
            return True
        if kind == "ping":
            await self.reply(Pong(text=data.get("text")).event())
            return True
        if kind in follow.EVENTS:  # a Home Assistant satellite of ours follows its turns
            self._follow(kind, data, event.payload)
            return True
        if kind in ("synthesize", "synthesize-chunk") and not self._own_tts:
            await follow.HUB.hold_tts(data.get("text"))  # a satellite speaks it already
        if kind == "transcribe":
            self.asr.transcribe(data)
        elif kind == "audio-start":
            self.asr.audio_start(data)
        elif kind == "audio-chunk":
            self.asr.audio_chunk(event.payload)
        elif kind == "audio-stop":
            self.asr.audio_stop()
        elif kind == "transcript":
            self.turns.transcript(data)
        elif kind == "synthesize":
            self.tts.synthesize(data)
        elif kind == "synthesize-start":
            self.tts.start(data)
        elif kind == "synthesize-chunk":
            self.tts.chunk(data)
        elif kind == "synthesize-stop":
            self.tts.stop()
        return True

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            if self._follower is not None:
                follow.HUB.leave(self._follower)

    def _follow(self, kind: str, data: dict, payload: bytes | None) -> None:
        if kind == follow.OWN_TTS:
            self._own_tts = True
            return
        follower = self._follower
        if follower is None:
            follower = self._follower = follow.Follower(self.write_event, str(self.peer))
        if kind == follow.FOLLOW:
            follow.HUB.follow(follower, data)
        elif kind == follow.HEARD:
            follow.HUB.heard(follower, data)
        elif kind == follow.SPECULATE:
            follow.HUB.speculate(follower, payload, self.services, self.host, data)
        elif kind == follow.VOID:
            follow.HUB.void(follower)
        else:
            follow.HUB.spoken(follower)


# Events we act on; any other type is ignored whatever its data holds.
_HANDLED = {
    "describe",
    "ping",
    "transcribe",
    "audio-start",
    "audio-chunk",
    "audio-stop",
    "transcript",
    "synthesize",
    "synthesize-start",
    "synthesize-chunk",
    "synthesize-stop",
    *follow.EVENTS,
}
