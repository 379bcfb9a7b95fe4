"""The Home Assistant add-on's options → the server's and the satellite's command lines.

An option that is a flag is declared on its settings field (`Addon(...)` in its `opt()`), so a
new setting reaches the add-on with one line there, plus its line in addon/config.yaml (which
the Supervisor reads as a file: tests/test_addon.py checks it against `schema()` and
`defaults()` here) and its translation. The options below are the add-on's own: they choose
between flags or fill in the add-on's paths.

addon/run.sh runs `wyoming-pivoice addon-args server|satellite`, which prints the command line
NUL-separated (a system prompt may hold any character).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from . import options
from .catalogue import names

OPTIONS_FILE = "/data/options.json"  # where the Supervisor writes them
SERVER_PORT = 10800
SATELLITE_PORT = 10700
SHARE_DIR = "/share/pivoice"  # your own models, voices, notes and the timing log
PIPER_DIR = "/share/piper"  # Piper voices other add-ons use
MIC_COMMAND = "arecord -r 16000 -c 1 -f S16_LE -t raw"  # the Supervisor's PulseAudio, by ALSA
SND_COMMAND = "aplay -r {rate} -c {channels} -f S16_LE -t raw"

# The add-on's own options: (schema, default or MISSING for none in `options:`).
OWN: dict[str, tuple[str, Any]] = {
    "asr_catalogue": (f"list({'|'.join(names('asr'))})?", MISSING),  # wins over asr_model
    "voice_catalogue": (f"list({'|'.join(names('voice'))})?", MISSING),
    "llm_catalogue": (f"list({'|'.join(names('llm'))})?", MISSING),
    "model_fallback": ("bool?", MISSING),  # --model-fallback embedded
    "llm_api_key": ("password?", MISSING),  # run.sh passes it by environment, not as a flag
    "knowledge": ("bool?", MISSING),  # the notes in SHARE_DIR/knowledge
    "satellite_enabled": ("bool", False),  # run.sh starts the satellite too
    "satellite_mode": ("list(home_assistant|standalone)", "home_assistant"),
    "timing_log": ("bool", False),  # SHARE_DIR/timing.jsonl
    "log_level": ("list(debug|info|warning|error)", "info"),
}
CATALOGUES = {
    "asr_catalogue": "asr_model",
    "voice_catalogue": "voice",
    "llm_catalogue": "llm_model",
}


def _fields(cls: type) -> Iterator[tuple[str, options.Flag, Any]]:
    """(option key, flag, its add-on default or MISSING) of each flag the add-on offers."""
    for field, spec, _ in options.walk(cls):
        if spec.addon is None:
            continue
        assert field.default is not True, f"{spec.flag}: an option is true to set a switch"
        default = spec.addon.default
        if default is options.UNSET:
            default = MISSING if spec.addon.schema.endswith("?") else options.field_default(field)
        yield spec.addon_key(), spec, default


def _commands() -> tuple[type, type]:
    from .satellite.settings import SatelliteSettings
    from .settings import ServerSettings

    return ServerSettings, SatelliteSettings


def schema() -> dict[str, str]:
    """config.yaml's `schema:`, the flags' options first (in `--help` order), then OWN."""
    out = {
        key: spec.addon.schema for cls in _commands() for key, spec, _ in _fields(cls) if spec.addon
    }
    out.update((key, typ) for key, (typ, _) in OWN.items())
    return out


def defaults() -> dict[str, Any]:
    """config.yaml's `options:`: each required option's default, and an optional one's if
    the add-on gives it one (the wake word)."""
    out = {key: default for cls in _commands() for key, _, default in _fields(cls)}
    out.update((key, default) for key, (_, default) in OWN.items())
    return {key: value for key, value in out.items() if value is not MISSING}


def _given(value: Any) -> bool:
    return value is not None and value != ""  # as bashio::config.has_value


def _flags(cls: type, chosen: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, spec, _ in _fields(cls):
        value = chosen.get(key)
        if not _given(value):
            continue
        if isinstance(value, bool):  # a switch: llm_lazy
            argv += [spec.flag] if value else []
        else:
            argv += [spec.flag, str(value)]
    return argv


def _llm_path(model: str) -> str:
    """A .gguf given by file name is in the share folder; a catalogue name, a path or a
    Hugging Face owner/repo:file the server resolves."""
    if model == "embedded" or model.startswith("/") or not model.endswith(".gguf") or ":" in model:
        return model
    return f"{SHARE_DIR}/{model}"


def _logging(given: Mapping[str, Any]) -> list[str]:
    return ["--log-level", str(given.get("log_level") or "info").upper()]


def server_argv(given: Mapping[str, Any]) -> list[str]:
    server, _ = _commands()
    chosen = dict(given)
    for listed, free in CATALOGUES.items():
        if _given(given.get(listed)):
            chosen[free] = given[listed]
    if _given(chosen.get("llm_model")):
        chosen["llm_model"] = _llm_path(str(chosen["llm_model"]))
    argv = [
        *_logging(given),
        "server",
        "--uri",
        f"tcp://0.0.0.0:{SERVER_PORT}",
        "--no-zeroconf",  # the Supervisor announces the add-on; mDNS would offer it twice
        "--voice-dir",
        SHARE_DIR,
        "--voice-dir",
        PIPER_DIR,
        *_flags(server, chosen),
    ]
    if given.get("model_fallback") is True:
        argv += ["--model-fallback", "embedded"]
    if given.get("knowledge") is True:  # the index lives with the add-on's data
        argv += [
            "--knowledge",
            f"{SHARE_DIR}/knowledge",
            "--knowledge-index",
            "/data/knowledge.sqlite3",
        ]
    return argv


def satellite_argv(given: Mapping[str, Any]) -> list[str]:
    _, satellite = _commands()
    chosen = dict(given)
    if given.get("satellite_mode") == "standalone":
        # The local loop talks to this add-on's server directly, not through Home Assistant,
        # in the speech's language unless told otherwise.
        mode = ["--server", f"tcp://127.0.0.1:{SERVER_PORT}"]
        if not _given(chosen.get("satellite_language")):
            chosen["satellite_language"] = given.get("asr_language")
    else:
        mode = ["--uri", f"tcp://0.0.0.0:{SATELLITE_PORT}", "--no-zeroconf"]
    # One source and one sink (argparse refuses two): a command wins over a device, and
    # without either the Supervisor's PulseAudio through ALSA.
    for command, device, default in (
        ("mic_command", "mic_device", MIC_COMMAND),
        ("snd_command", "snd_device", SND_COMMAND),
    ):
        if _given(chosen.get(command)):
            chosen[device] = None
        elif not _given(chosen.get(device)):
            chosen[command] = default
    argv = [*_logging(given), "satellite", *mode, *_flags(satellite, chosen)]
    if given.get("timing_log") is True:
        argv += ["--timing-log", f"{SHARE_DIR}/timing.jsonl"]
    return argv


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "addon-args",
        help="the Home Assistant add-on's options as a command line (for addon/run.sh)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("service", choices=("server", "satellite"))
    parser.add_argument(
        "--options", type=Path, default=Path(OPTIONS_FILE), help="the add-on's options (JSON)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        given = json.loads(args.options.read_text())
    except (OSError, ValueError) as err:
        print(f"addon-args: cannot read the options {args.options}: {err}", file=sys.stderr)
        return 2
    if not isinstance(given, dict):
        print(f"addon-args: {args.options} holds no options object", file=sys.stderr)
        return 2
    argv = server_argv(given) if args.service == "server" else satellite_argv(given)
    sys.stdout.write("".join(f"{word}\0" for word in argv))
    return 0
