"""What the server refuses, with which code, and the answer each refusal still owes.

Home Assistant ignores `error`: STT reads until `transcript`, TTS until `audio-stop`, a
stream until `synthesize-stopped`, a conversation until `handled`/`not-handled`. So every
refused or failed request gets `error` (for clients that read it) and then the in-band end
its client waits for (`ending`). A connection we will not read on gets `error` and is
closed (`Closing`): EOF releases every client. The codes: wire/errors.py; the limits behind
them: limits.py.
"""

from __future__ import annotations

from enum import Enum

from wyoming.asr import Transcript, TranscriptStop
from wyoming.audio import AudioStart, AudioStop
from wyoming.event import Event
from wyoming.handle import HandledStop, NotHandled
from wyoming.tts import SynthesizeStopped

from ..wire.errors import ErrorCode


class Owed(Enum):
    """What a refused or failed request's client waits for."""

    TRANSCRIPT = "transcript"  # an empty `transcript`
    AUDIO = "audio"  # an (empty) audio run closed with `audio-stop`
    SENTENCE = "sentence"  # one sentence of a stream: its audio run closed; the stream goes on
    STREAM_END = "stream-end"  # `synthesize-stopped`
    TURN = "turn"  # `not-handled` with a short text
    NOTHING = "nothing"  # owes no answer of its own (its stream's end comes later)


class RequestError(Exception):
    """A request we refuse: `code` goes into `error`; `owed` (if given) overrides what the
    request's event type owes."""

    def __init__(
        self, text: str, code: ErrorCode = ErrorCode.BAD_REQUEST, owed: Owed | None = None
    ) -> None:
        super().__init__(text)
        self.code = code
        self.owed = owed


# The `not-handled` text, which Home Assistant may speak: short, and free of the request's text.
_SORRY = {
    ErrorCode.TEXT_TOO_LONG: "Sorry, that was too long for me.",
    ErrorCode.EMPTY_TEXT: "Sorry, I did not catch that.",
}
_SORRY_DEFAULT = "Sorry, I could not answer that."


def ending(owed: Owed, code: ErrorCode, open_runs: set[str], sample_rate: int) -> list[Event]:
    """What ends a refused or failed request for a client that ignores `error`.

    `open_runs`: the audio/transcript/handled runs started on the connection and not yet
    stopped; `sample_rate`: the voice's, for an empty audio run.
    """
    if owed is Owed.TRANSCRIPT:
        events = [Transcript(text="").event()]
        return [*events, TranscriptStop().event()] if "transcript" in open_runs else events
    if owed is Owed.TURN:
        events = [NotHandled(text=_SORRY.get(code, _SORRY_DEFAULT)).event()]
        return [*events, HandledStop().event()] if "handled" in open_runs else events
    if owed in (Owed.AUDIO, Owed.SENTENCE):
        if "audio" in open_runs:
            return [AudioStop().event()]
        if owed is Owed.SENTENCE:
            return []
        return [AudioStart(rate=sample_rate, width=2, channels=1).event(), AudioStop().event()]
    if owed is Owed.STREAM_END:
        return [SynthesizeStopped().event()]
    return []
