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


# --- the mapper itself, on a settings class of the test's own --------------------------------


def test_a_new_setting_is_one_field() -> None:
    """A field with `opt()` is a flag with its help and default, and comes back typed; a
    `--no-` flag clears a default True; a repeatable one gives a tuple; two flags of one
    `exclusive` name refuse each other; a `reads` field takes its value from another's flag."""
    from dataclasses import dataclass

    from wyoming_pivoice import options
    from wyoming_pivoice.options import nest, opt

    @dataclass(frozen=True)
    class Inner:
        rate: int = opt(16000, "--demo-rate", help="samples per second")
        a: str | None = opt(None, "--demo-a", exclusive="one")
        b: str | None = opt(None, "--demo-b", exclusive="one")

    @dataclass(frozen=True)
    class Demo:
        enabled: bool = opt(True, "--no-demo", help="off")
        dirs: tuple[str, ...] = opt((), "--demo-dir", append=True)
        pair: int = opt(0, "--demo-pair", nargs=2, type=float, cli_default=(2, 0.5),
                        convert=lambda p: int(p[0]))  # fmt: skip
        half: float = opt(1.0, reads="demo_pair", convert=lambda p: float(p[1]))
        inner: Inner = nest(Inner, group="inner things")

    parser = argparse.ArgumentParser()
    options.add_arguments(parser, Demo)
    assert options.build(Demo, parser.parse_args([])) == Demo(pair=2, half=0.5)
    args = parser.parse_args(
        ["--no-demo", "--demo-dir", "x", "--demo-dir", "y", "--demo-rate", "8000",
         "--demo-b", "B", "--demo-pair", "3", "0.25"]
    )  # fmt: skip
    assert options.build(Demo, args) == Demo(
        enabled=False, dirs=("x", "y"), pair=3, half=0.25, inner=Inner(rate=8000, b="B")
    )
    rate = next(a for a in parser._actions if "--demo-rate" in a.option_strings)
    assert (rate.help, rate.default, rate.type) == ("samples per second", 16000, int)
    [inner] = [g for g in parser._action_groups if g.title == "inner things"]
    assert rate in inner._group_actions
    with pytest.raises(SystemExit):
        parser.parse_args(["--demo-a", "A", "--demo-b", "B"])
