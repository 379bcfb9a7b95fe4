"""`wyoming-pivoice`: server | satellite | doctor | addon-args (and the lab's bench)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any, NoReturn

from . import __version__

# Each subcommand lives with the code it drives and adds its own parser. Only the one
# that runs is imported: a satellite must not load the server's engines to start.
_SUBCOMMANDS = {
    "server": "wyoming_pivoice.server.cli",
    "satellite": "wyoming_pivoice.satellite.cli",
    "doctor": "wyoming_pivoice.doctor.cli",
    "addon-args": "wyoming_pivoice.addon",
}
# Subcommands of other distributions: the lab (lab/pyproject.toml) registers `bench` here, so
# the runtime names no lab module and runs without it (a Pi, the add-on image).
PLUGIN_GROUP = "wyoming_pivoice.subcommands"
# Named even when not installed, so asking for one says what to install instead of argparse's
# "invalid choice".
_PLUGINS_EXPECTED = {
    "bench": "the lab, not installed here: in a checkout, script/setup (pip install -e ./lab)"
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


def _plugins() -> dict[str, str]:
    """Installed subcommands of other distributions: name → module with `add_parser`."""
    from importlib import metadata  # 74 ms to import at load 12: not for server or satellite

    return {ep.name: ep.value for ep in metadata.entry_points(group=PLUGIN_GROUP)}


class MissingSubcommand(Exception):
    """A subcommand of a distribution that is not installed; the message says which."""


def _missing(name: str) -> None:
    raise MissingSubcommand(f"`{name}` needs {_PLUGINS_EXPECTED[name]}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI, or (`command`) that subcommand's parser and bare names for the rest."""
    parser = _Parser(
        prog="wyoming-pivoice", description="A fully local voice assistant for Home Assistant"
    )
    parser.add_argument("--version", action="version", version=__version__)
    _add_logging(parser, "INFO")
    subparsers = parser.add_subparsers(dest="command", required=True)
    # The entry-point scan reads every installed distribution (49-200 ms here, load 12 on 2
    # cores): only when a plugin or the whole CLI is asked for, never for server/satellite.
    plugins = _plugins() if command is None or command not in _SUBCOMMANDS else {}
    if command in _PLUGINS_EXPECTED and command not in plugins:
        _missing(command)
    for name, module_name in {**_SUBCOMMANDS, **plugins}.items():
        if command in (None, name):
            importlib.import_module(module_name).add_parser(subparsers)
        else:
            subparsers.add_parser(name)
    for name in _PLUGINS_EXPECTED.keys() - plugins.keys() - _SUBCOMMANDS.keys():
        subparsers.add_parser(name, help=f"(needs {_PLUGINS_EXPECTED[name]})")
    for subparser in subparsers.choices.values():
        _add_logging(subparser, None)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is one), if any."""
    known = _SUBCOMMANDS.keys() | _PLUGINS_EXPECTED.keys()
    return next((arg for arg in argv if arg in known), None)


def run(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    try:
        args = build_parser(_command(argv)).parse_args(argv)
    except MissingSubcommand as err:
        print(f"wyoming-pivoice: {err}", file=sys.stderr)
        return 2
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level="DEBUG" if args.debug else args.log_level, handlers=[handler])
    from .startup import StartupError  # light: no asyncio loop, no engine

    try:
        return int(args.func(args) or 0)
    except StartupError as err:
        logging.getLogger("wyoming_pivoice").error("%s", err)
        return err.code


def main() -> NoReturn:
    """The console command: `run`, then the exit, past livekit's native runtime.

    WebRTC's echo canceller comes through livekit's FFI library, whose tokio workers panic
    ("panic in a function that cannot unwind": SIGABRT, a Rust trace on stderr) when Python
    finalizes under them: 1 `doctor` in 12 here. By the time `run` returns everything is
    closed and flushed but the interpreter's own teardown, so a process that loaded it ends
    without that teardown."""
    code = run()
    if "livekit.rtc" in sys.modules:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
