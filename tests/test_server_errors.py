"""What a refused or failed request still sends, by what its client waits for (no server)."""

from __future__ import annotations

import json

import pytest

from wyoming_pivoice.server.errors import Owed, ending
from wyoming_pivoice.wire.errors import CLOSING, ErrorCode

RATE = 22050


def types(owed: Owed, runs: set[str], code: ErrorCode = ErrorCode.BAD_REQUEST) -> list[str]:
    return [event.type for event in ending(owed, code, runs, RATE)]


@pytest.mark.parametrize(
    ("owed", "runs", "expected"),
    [
        (Owed.TRANSCRIPT, set(), ["transcript"]),
        (Owed.TRANSCRIPT, {"transcript"}, ["transcript", "transcript-stop"]),
        (Owed.TURN, set(), ["not-handled"]),
        (Owed.TURN, {"handled"}, ["not-handled", "handled-stop"]),
        (Owed.AUDIO, set(), ["audio-start", "audio-stop"]),
        (Owed.AUDIO, {"audio"}, ["audio-stop"]),
        (Owed.SENTENCE, set(), []),
        (Owed.SENTENCE, {"audio"}, ["audio-stop"]),
        (Owed.STREAM_END, set(), ["synthesize-stopped"]),
        (Owed.NOTHING, {"audio", "handled"}, []),
    ],
)
def test_each_refusal_ends_what_its_client_reads_until(
    owed: Owed, runs: set[str], expected: list[str]
) -> None:
    assert types(owed, runs) == expected


def test_an_empty_audio_run_has_the_voice_format() -> None:
    start = ending(Owed.AUDIO, ErrorCode.EMPTY_TEXT, set(), RATE)[0]
    assert (start.data["rate"], start.data["width"], start.data["channels"]) == (RATE, 2, 1)


def test_not_handled_text_is_short_and_says_why() -> None:
    def text(code: ErrorCode) -> str:
        return str(ending(Owed.TURN, code, set(), RATE)[0].data["text"])

    assert "too long" in text(ErrorCode.TEXT_TOO_LONG)
    assert "did not catch" in text(ErrorCode.EMPTY_TEXT)
    assert text(ErrorCode.INTERNAL) == text(ErrorCode.BAD_REQUEST)


def test_codes_go_on_the_wire_as_their_strings() -> None:
    assert json.dumps({"code": ErrorCode.FRAME_TOO_LARGE}) == '{"code": "frame-too-large"}'
    assert ErrorCode.BUSY == "busy" and f"{ErrorCode.IDLE}" == "idle"
    assert ErrorCode.OVERLOADED not in CLOSING  # it refuses one request, mostly
