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
}
