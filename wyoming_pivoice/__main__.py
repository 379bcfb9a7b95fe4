"""`wyoming-pivoice`: server | satellite | bench | doctor | addon-args."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any, NoReturn

from . import __version__

# Each subcommand lives with the code it drives and adds its own parser. Only the one
# that runs is imported: a satellite must not load the server's engines to start.
_SUBCOMMANDS = {
    "server": "wyoming_pivoice.server.cli",
    "satellite": "wyoming_pivoice.satellite.cli",
    "bench": "wyoming_pivoice.bench.cli",
    "doctor": "wyoming_pivoice.doctor.cli",
    "addon-args": "wyoming_pivoice.addon",
}


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Parser(argparse.ArgumentParser):
    """A mistake in the options is one line (the server's usage alone is 40 lines)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _log_level(value: str) -> str:
    if value.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{value!r}: choose one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def _add_logging(parser: argparse.ArgumentParser, default: Any) -> None:
    """--log-level and --debug, before the subcommand (`default`) and after it (SUPPRESS:
    only what is given there overrides what was given before)."""
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        type=_log_level,
        default=default or argparse.SUPPRESS,
        help="/".join(LOG_LEVELS),
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=False if default else argparse.SUPPRESS,
        help="log at DEBUG (as --log-level DEBUG)",
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI, or (`command`) that subcommand's parser and bare names for the rest."""
    parser = _Parser(
        prog="wyoming-pivoice", description="A fully local voice assistant for Home Assistant"
    )
    parser.add_argument("--version", action="version", version=__version__)
    _add_logging(parser, "INFO")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, module_name in _SUBCOMMANDS.items():
        if command in (None, name):
            importlib.import_module(module_name).add_parser(subparsers)
        else:
            subparsers.add_parser(name)
    for subparser in subparsers.choices.values():
        _add_logging(subparser, None)
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
    logging.basicConfig(level="DEBUG" if args.debug else args.log_level, handlers=[handler])
    from .startup import StartupError  # light: no asyncio loop, no engine

    try:
        return int(args.func(args) or 0)
    except StartupError as err:
        logging.getLogger("wyoming_pivoice").error("%s", err)
        return err.code


if __name__ == "__main__":
    sys.exit(run())
