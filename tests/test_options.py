"""Settings spelled once (wyoming_pivoice/options.py): the CLI the fields generate.

`tests/fixtures/cli/<command>.json` is the command's options as argparse holds them (flag,
dest, default, help, type, choices, nargs, metavar, group): written from the hand-made parsers
before the fields carried their flags, so every flag keeps its name, default and help. A flag
added on purpose: PIVOICE_WRITE_CLI_SNAPSHOT=1 rewrites the files (review the diff).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from wyoming_pivoice.__main__ import build_parser

SNAPSHOTS = Path(__file__).parent / "fixtures" / "cli"
COMMANDS = ("server", "satellite", "doctor")


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return subparsers.choices[command]


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def describe(command: str) -> dict[str, dict[str, Any]]:
    """Every option of `command`, keyed by its first flag, as argparse holds it."""
    parser = _subparser(command)
    groups = {id(a): g.title for g in parser._action_groups for a in g._group_actions}
    exclusive = {
        id(a): sorted(b.option_strings[0] for b in g._group_actions)
        for g in parser._mutually_exclusive_groups
        for a in g._group_actions
    }
    options = {}
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "log_level", "debug"):
            continue
        kind = action.type
        options[action.option_strings[0]] = {
            "flags": list(action.option_strings),
            "dest": action.dest,
            "action": type(action).__name__,
            "default": _plain(action.default),
            "help": action.help,
            "type": getattr(kind, "__name__", None) if kind not in (None, str) else "str",
            "choices": _plain(action.choices),
            "nargs": _plain(action.nargs),
            "metavar": _plain(action.metavar),
            "group": groups.get(id(action)),
            "exclusive_with": exclusive.get(id(action)),
        }
    return options


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_keeps_its_name_default_and_help(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PIVOICE_DATA_DIR", raising=False)  # --data-dir's default reads it
    now = describe(command)
    path = SNAPSHOTS / f"{command}.json"
    if os.environ.get("PIVOICE_WRITE_CLI_SNAPSHOT") == "1":
        path.write_text(json.dumps(now, indent=1, ensure_ascii=False) + "\n")
    before = json.loads(path.read_text())
    assert sorted(now) == sorted(before), "flags added or gone"
    changed = {flag: (was, now[flag]) for flag, was in before.items() if now[flag] != was}
    assert changed == {}
