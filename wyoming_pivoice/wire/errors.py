"""The one vocabulary of refusals on the wire: the `code` of every `error` event we send,
which codes close the connection, and the exception that closes one (hardened.py)."""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    """The `code` of the server's `error` events (a str: it goes on the wire as is)."""

    # A request refused; the connection stays.
    BAD_REQUEST = "bad-request"  # a field of the wrong type, a NUL, text that is not UTF-8
    TEXT_TOO_LONG = "text-too-long"
    EMPTY_TEXT = "empty-text"
    AUDIO_TOO_LONG = "audio-too-long"
    BAD_AUDIO_FORMAT = "bad-audio-format"
    EMPTY_AUDIO = "empty-audio"
    UNKNOWN_SPEAKER = "unknown-speaker"
    OVERLOADED = "overloaded"  # too many requests (or queued audio) on one connection
    INTERNAL = "internal"  # a model failed
    UNAVAILABLE = "engine-unavailable"  # an engine outside us did not answer (remote LLM)
    # The connection is closed.
    MALFORMED = "malformed"
    FRAME_TOO_LARGE = "frame-too-large"
    TIMEOUT = "timeout"
    IDLE = "idle"
    BUSY = "busy"
    EVICTED = "evicted"

    def __str__(self) -> str:
        return self.value


# The codes that always close the connection (`overloaded` closes one too when refusals
# pile up faster than its client reads them; otherwise it refuses one request).
CLOSING = frozenset(
    {
        ErrorCode.MALFORMED,
        ErrorCode.FRAME_TOO_LARGE,
        ErrorCode.TIMEOUT,
        ErrorCode.IDLE,
        ErrorCode.BUSY,
        ErrorCode.EVICTED,
    }
)


class Closing(Exception):
    """The connection ends: `error` with this text and code, then close."""

    def __init__(self, text: str, code: ErrorCode) -> None:
        super().__init__(text)
        self.code = code
