"""`doctor` on the remote LLM engine (`--llm-url`): reachable, model listed, first-token time."""

from __future__ import annotations

import asyncio

from ..engines.llm import LlmSettings
from ..engines.remote_llm import RemoteChat, RemoteLlmError, RemoteLlmSettings
from .base import Check, Finding, Status

REMOTE = Check("llm-remote", "the remote LLM engine, with --llm-url")

# The reply's first word should be under way well within the time a listener notices a pause.
SLOW_FIRST_PIECE_S = 1.5


def check_remote_llm(settings: RemoteLlmSettings, llm: LlmSettings | None = None) -> Finding:
    try:
        return asyncio.run(_check(RemoteChat(settings, llm or LlmSettings())))
    except RemoteLlmError as err:
        return REMOTE.finding(
            Status.FAIL,
            str(err),
            fix="start the engine, check --llm-url (most engines' ends in /v1), --llm-api-key "
            "and the firewall; --llm-fallback local answers meanwhile",
            data={"url": settings.url},
        )


async def _check(chat: RemoteChat) -> Finding:
    settings = chat.settings
    models = await chat.models()
    data: dict = {"url": settings.url, "models": models}
    if settings.model is not None and settings.model not in models:
        return REMOTE.finding(
            Status.FAIL,
            f"{settings.url} does not list the model {settings.model!r} "
            f"(it lists {', '.join(models) or 'none'})",
            fix="pass one of the listed models as --llm-remote-model, or load it on the engine",
            data=data,
        )
    probe = await chat.probe()
    cold = ""
    if probe.first_piece_s > SLOW_FIRST_PIECE_S:
        # The engine's first request may load or warm the model (the server's own start-up
        # probe pays that): judge the second.
        cold = f" ({probe.first_piece_s * 1000:.0f} ms on the first request)"
        data["cold_first_piece_s"] = round(probe.first_piece_s, 3)
        probe = await chat.probe()
    data.update(model=probe.model, first_piece_s=round(probe.first_piece_s, 3))
    message = (
        f"{settings.url} answers with {probe.model!r}, "
        f"first piece of a reply in {probe.first_piece_s * 1000:.0f} ms{cold}"
    )
    if probe.first_piece_s > SLOW_FIRST_PIECE_S:
        return REMOTE.finding(
            Status.WARN,
            message,
            fix="a smaller or already loaded model, or a faster engine host: "
            "every reply waits this long before its first word",
            data=data,
        )
    return REMOTE.finding(Status.OK, message, data=data)
