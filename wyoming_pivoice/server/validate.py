"""Checks on an event's untrusted data, each failing with a RequestError and its code."""

from __future__ import annotations

import json
from typing import Any

from wyoming.event import Event

from ..wire.errors import ErrorCode
from .errors import RequestError


def event_data(event: Event) -> dict[str, Any]:
    """The data of an event whose type is a string and whose data is an object."""
    if not isinstance(event.type, str) or not isinstance(event.data, dict):
        raise RequestError(
            "event 'type' must be a string and 'data' an object", ErrorCode.MALFORMED
        )
    return event.data


def check_utf8(data: dict[str, Any]) -> None:
    """The wire is UTF-8: text with lone surrogates (from JSON escapes) cannot be echoed
    back or handed to a model, so refuse it at the door."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError) as err:
        raise RequestError(f"event data cannot be sent back as UTF-8 text: {err}") from None


def text_field(data: dict[str, Any], key: str, max_chars: int) -> str:
    """A required string of at most `max_chars` characters, without NUL."""
    value = data.get(key)
    if not isinstance(value, str):
        raise RequestError(f"'{key}' must be a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise RequestError(
            f"'{key}' is {len(value)} characters, over the {max_chars} limit",
            ErrorCode.TEXT_TOO_LONG,
        )
    if "\0" in value:
        raise RequestError(f"'{key}' contains a NUL character")
    return value


def context(data: dict[str, Any], max_chars: int) -> dict[str, Any] | None:
    """A turn's context, echoed back in `handled`: kept only if it is small."""
    value = data.get("context")
    if not isinstance(value, dict):
        return None
    if len(json.dumps(value)) > max_chars:
        raise RequestError(
            f"'context' is over the {max_chars} character limit", ErrorCode.TEXT_TOO_LONG
        )
    return value


def context_str(context: dict[str, Any] | None, key: str) -> str | None:
    value = (context or {}).get(key)
    return value if isinstance(value, str) else None


def language(data: dict[str, Any]) -> str | None:
    value = data.get("language")
    return value if isinstance(value, str) else None


def speaker(data: dict[str, Any]) -> str | None:
    voice = data.get("voice")
    if isinstance(voice, dict) and isinstance(voice.get("speaker"), str):
        return str(voice["speaker"])
    return None
