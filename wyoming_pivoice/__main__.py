"""`wyoming-pivoice`: server | satellite | bench | doctor."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__

# Each subcommand lives with the code it drives and adds its own parser. Only the one
# that runs is imported: a satellite must not load the server's engines to start.
_SUBCOMMANDS = {
    "server": "wyoming_pivoice.server.cli",
    "satellite": "wyoming_pivoice.satellite.cli",
    "bench": "wyoming_pivoice.bench.cli",
    "doctor": "wyoming_pivoice.doctor.cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI, or (`command`) that subcommand's parser and bare names for the rest."""
    parser = argparse.ArgumentParser(
        prog="wyoming-pivoice", description="A fully local voice assistant for Home Assistant"
    )
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING …")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, module_name in _SUBCOMMANDS.items():
        if command in (None, name):
            importlib.import_module(module_name).add_parser(subparsers)
        else:
            subparsers.add_parser(name)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is one), if any."""
    return next((arg for arg in argv if arg in _SUBCOMMANDS), None)


def run(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(_command(argv)).parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(run())
