"""`wyoming-pivoice satellite`: command-line options → SatelliteSettings (its fields: the flags)."""

from __future__ import annotations

import argparse
import logging
import uuid

from .. import options
from .settings import SatelliteSettings

_LOGGER = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "satellite",
        help="the on-device loop: standalone (--server) or for Home Assistant (--uri)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    options.add_arguments(parser, SatelliteSettings)  # the fields carry their flags
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> SatelliteSettings:
    conversation_id = args.conversation_id
    if conversation_id is None:
        conversation_id = f"pivoice-satellite-{uuid.uuid4().hex[:12]}"
    return options.build(SatelliteSettings, args, conversation_id=conversation_id or None)


def run(args: argparse.Namespace) -> int:
    from .. import startup  # asyncio and the rest: not needed for --help

    settings = settings_from_args(args)
    for spec, want_input in ((settings.mic.device, True), (settings.snd.device, False)):
        problem = startup.audio_device_problem(spec, want_input)
        if problem:
            raise startup.StartupError(problem, code=2)
    if settings.uri:
        return startup.run(lambda: _home_assistant(settings), fast_exit=True)
    if not settings.server:
        _LOGGER.error("satellite needs --server tcp://HOST:PORT (standalone) or --uri (for HA)")
        return 2
    return startup.run(lambda: _standalone(settings), fast_exit=True)


# Each mode's modules load inside `startup.run`: a signal while they import ends quietly.


async def _home_assistant(settings: SatelliteSettings) -> int:
    from .ha.adapter import serve_ha_satellite

    return await serve_ha_satellite(settings)


async def _standalone(settings: SatelliteSettings) -> int:
    from .standalone.pipeline import Satellite
    from .wake import WakeWordError

    try:
        satellite = Satellite(settings)
    except (WakeWordError, ValueError) as err:
        _LOGGER.error("%s", err)
        return 2
    return await satellite.run_until_signal()
