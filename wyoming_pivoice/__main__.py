"""`wyoming-pivoice`: server | satellite | bench | doctor."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__

# Each subcommand lives with the code it drives and adds its own parser.
_SUBCOMMANDS = (
    "wyoming_pivoice.server.cli",
    "wyoming_pivoice.satellite.cli",
    "wyoming_pivoice.bench.cli",
    "wyoming_pivoice.doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wyoming-pivoice", description="A fully local voice assistant for Home Assistant"
    )
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING …")
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


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(run())
