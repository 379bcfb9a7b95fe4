"""`wyoming-pivoice`: server | satellite | bench | doctor."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time

from . import __version__

# Each subcommand lives with the code it drives and adds its own parser.
_SUBCOMMANDS = (
    "wyoming_pivoice.server.cli",
    "wyoming_pivoice.satellite.cli",
    "wyoming_pivoice.bench.cli",
    "wyoming_pivoice.doctor.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wyoming-pivoice", description="A fully local voice assistant for Home Assistant"
    )
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING …")
    parser.add_argument(
        "--log-clock",
        choices=("wall", "monotonic"),
        default="wall",
        help="stamp log lines with the date, or with time.monotonic() seconds (the clock of "
        "the satellite's turn stamps: the bench lines both up this way)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            continue  # a subcommand not built yet
        module.add_parser(subparsers)
    return parser


class MonotonicFormatter(logging.Formatter):
    """asctime = time.monotonic() when the line is formatted (synchronously, as it is logged).

    The wall clock can be stepped or slewed under a running process; the monotonic clock
    is one system-wide clock that every process reads alike.
    """

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return f"{time.monotonic():.4f}"


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    formatter = MonotonicFormatter if args.log_clock == "monotonic" else logging.Formatter
    handler = logging.StreamHandler()
    handler.setFormatter(formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(run())
