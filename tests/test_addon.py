"""The Home Assistant add-on, checked without Docker.

config.yaml and the Dockerfile's base are read against the Supervisor's own rules (ported from
home-assistant/supervisor `supervisor/addons/validate.py` and `supervisor/addons/options.py`:
the keys it knows, the schema type grammar, option validation, ports, arch names, map
volumes, image names). run.sh runs under a stand-in bashio with a stub `wyoming-pivoice`,
and the command lines it starts are compared word for word and parsed by the real CLI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from wyoming_pivoice import __version__
from wyoming_pivoice.__main__ import build_parser

from .helpers import ADDON, REPO

FIXTURES = Path(__file__).parent / "fixtures" / "addon"

# --- the Supervisor's rules -----------------------------------------------------------------

ARCH_ALL = {"armhf", "armv7", "aarch64", "amd64", "i386"}
RE_SLUG = re.compile(r"^[-_.A-Za-z0-9]+$")
RE_DOCKER_PORT = re.compile(r"^\d+(?:/tcp|/udp)?$")
RE_DOCKER_IMAGE_BUILD = re.compile(
    r"^([a-zA-Z\-\.:\d{}]+/)*?([\-\w{}]+)/([\-\w{}]+)(:[\.\-\w{}]+)?$"
)
RE_VOLUME = re.compile(
    r"^(data|config|ssl|addons|backup|share|media|homeassistant_config|all_addon_configs"
    r"|addon_config)(?::(rw|ro))?$"
)
MAPPING_TYPES = {
    "data",
    "config",
    "ssl",
    "addons",
    "backup",
    "share",
    "media",
    "homeassistant_config",
    "all_addon_configs",
    "addon_config",
}
RE_SCHEMA_ELEMENT = re.compile(
    r"^(?:"
    r"|bool"
    r"|email"
    r"|url"
    r"|port"
    r"|device(?:\((?P<filter>subsystem=[a-z]+)\))?"
    r"|str(?:\((?P<s_min>\d+)?,(?P<s_max>\d+)?\))?"
    r"|password(?:\((?P<p_min>\d+)?,(?P<p_max>\d+)?\))?"
    r"|int(?:\((?P<i_min>\d+)?,(?P<i_max>\d+)?\))?"
    r"|float(?:\((?P<f_min>[\d\.]+)?,(?P<f_max>[\d\.]+)?\))?"
    r"|match\((?P<match>.*)\)"
    r"|list\((?P<list>.+)\)"
    r")\??$"
)
# Every key _SCHEMA_ADDON_CONFIG accepts; anything else would be dropped silently.
KNOWN_KEYS = {
    "name", "version", "slug", "description", "arch", "machine", "url", "startup", "boot",
    "init", "advanced", "stage", "ports", "ports_description", "watchdog", "webui", "ingress",
    "ingress_port", "ingress_entry", "ingress_stream", "panel_icon", "panel_title",
    "panel_admin", "homeassistant", "host_network", "host_pid", "host_ipc", "host_uts",
    "host_dbus", "devices", "udev", "tmpfs", "map", "environment", "privileged", "apparmor",
    "full_access", "audio", "video", "gpio", "usb", "uart", "devicetree", "kernel_modules",
    "realtime", "hassio_api", "hassio_role", "homeassistant_api", "stdin", "legacy",
    "docker_api", "auth_api", "services", "discovery", "backup_exclude", "backup_pre",
    "backup_post", "restore_pre", "restore_post", "backup", "options", "schema", "image",
    "ulimits", "timeout", "journald", "breaking_versions",
}  # fmt: skip
BOOL_TRUE = {True, "true", "1", "yes", "on", "enable"}  # 1 == True
BOOL_FALSE = {False, "false", "0", "no", "off", "disable"}


def validate_option(typ: str, value: Any) -> None:
    """The Supervisor's `_single_validate` for the types this add-on uses."""
    match = RE_SCHEMA_ELEMENT.match(typ)
    assert match, f"unknown schema type {typ!r}"
    assert value is not None, "a required option may not be null"

    def in_range(number: float, low: str | None, high: str | None) -> None:
        assert low is None or number >= float(low), f"{number} < {low}"
        assert high is None or number <= float(high), f"{number} > {high}"

    if typ.startswith("str"):
        assert isinstance(value, str), f"{value!r} is not a string"
        in_range(len(value), match.group("s_min"), match.group("s_max"))
    elif typ.startswith("int"):
        assert isinstance(value, int) and not isinstance(value, bool), f"{value!r} is not an int"
        in_range(value, match.group("i_min"), match.group("i_max"))
    elif typ.startswith("float"):
        assert isinstance(value, (int, float)) and not isinstance(value, bool)
        in_range(float(value), match.group("f_min"), match.group("f_max"))
    elif typ.startswith("bool"):
        assert value in BOOL_TRUE | BOOL_FALSE, f"{value!r} is not a boolean"
    elif typ.startswith("list"):
        assert str(value) in match.group("list").split("|"), f"{value!r} not in {typ}"
    elif typ.startswith("url"):  # voluptuous' Url: a scheme and a host
        url = urlparse(value) if isinstance(value, str) else None
        assert url is not None and url.scheme and url.netloc, f"{value!r} is not a URL"
    else:
        raise AssertionError(f"this test does not check {typ!r} options")


def validate_options(schema: dict[str, str], options: dict[str, Any]) -> None:
    """The Supervisor's AddonOptions: known keys, valid values, no required key missing."""
    for key, value in options.items():
        assert key in schema, f"option {key!r} is not in the schema"
        validate_option(schema[key], value)
    for key, typ in schema.items():
        assert key in options or typ.endswith("?"), f"required option {key!r} has no default"


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return yaml.safe_load((ADDON / "config.yaml").read_text())


# --- config.yaml ----------------------------------------------------------------------------


def test_config_has_the_required_keys_and_no_unknown_ones(config: dict[str, Any]) -> None:
    for key in ("name", "version", "slug", "description", "arch"):
        assert isinstance(config.get(key), (str, list)) and config[key], key
    assert set(config) <= KNOWN_KEYS, set(config) - KNOWN_KEYS
    assert config["slug"] == "pivoice" and RE_SLUG.match(config["slug"])
    assert config["version"] == "0.1.0" == __version__
    url = urlparse(config["url"])
    assert url.scheme == "https" and url.netloc


def test_config_arch_init_audio_discovery(config: dict[str, Any]) -> None:
    assert config["arch"] == ["aarch64", "amd64"]
    assert set(config["arch"]) <= ARCH_ALL
    assert config["init"] is False  # s6-overlay in the base image is PID 1
    assert config["audio"] is True
    assert config["discovery"] == ["wyoming"]


def test_config_ports(config: dict[str, Any]) -> None:
    assert config["ports"] == {"10800/tcp": None, "10700/tcp": None}
    for port, host in config["ports"].items():
        assert RE_DOCKER_PORT.match(port)
        assert host is None or 1 <= host <= 65535
    assert set(config["ports_description"]) == set(config["ports"])
    assert all(isinstance(text, str) for text in config["ports_description"].values())


def test_config_map_and_backup_exclude(config: dict[str, Any]) -> None:
    for volume in config["map"]:
        if isinstance(volume, str):
            assert RE_VOLUME.match(volume), volume
        else:
            assert volume["type"] in MAPPING_TYPES
            assert isinstance(volume.get("read_only", True), bool)
            assert set(volume) <= {"type", "read_only", "path"}
    assert all(isinstance(p, str) for p in config["backup_exclude"])


def test_schema_types_are_valid(config: dict[str, Any]) -> None:
    for key, typ in config["schema"].items():
        assert isinstance(typ, str) and RE_SCHEMA_ELEMENT.match(typ), f"{key}: {typ!r}"


def test_options_validate_against_the_schema(config: dict[str, Any]) -> None:
    validate_options(config["schema"], config["options"])


def test_schema_covers_what_the_issue_asks_for(config: dict[str, Any]) -> None:
    asked = {
        "asr_model", "voice", "llm_model", "system_prompt", "max_tokens", "vad_silence_ms",
        "wake_word", "satellite_enabled", "mic_device", "snd_device", "log_level",
    }  # fmt: skip
    assert asked <= set(config["schema"])


def test_the_validator_rejects_bad_options(config: dict[str, Any]) -> None:
    """The checks above would catch a broken default."""
    schema = config["schema"]
    bad = [
        {**config["options"], "max_tokens": "many"},
        {**config["options"], "vad_threshold": 1.5},
        {**config["options"], "log_level": "verbose"},
        {**config["options"], "no_such_option": 1},
        {k: v for k, v in config["options"].items() if k != "system_prompt"},
    ]
    for options in bad:
        with pytest.raises(AssertionError):
            validate_options(schema, options)
    with pytest.raises(AssertionError):
        validate_option("string", "x")


def test_translations_name_every_option(config: dict[str, Any]) -> None:
    translations = yaml.safe_load((ADDON / "translations" / "en.yaml").read_text())
    assert set(translations) <= {"configuration", "network"}
    assert set(translations["configuration"]) == set(config["schema"])
    for key, text in translations["configuration"].items():
        assert isinstance(text["name"], str) and text["name"], key
        assert isinstance(text.get("description", ""), str)
    assert set(translations["network"]) == set(config["ports"])


def test_docs_mention_every_option(config: dict[str, Any]) -> None:
    docs = (ADDON / "DOCS.md").read_text()
    missing = [key for key in config["schema"] if f"`{key}`" not in docs]
    assert missing == []


def test_changelog_starts_with_this_version(config: dict[str, Any]) -> None:
    headings = re.findall(r"^## (\S+)", (ADDON / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == config["version"]


# --- the base image per architecture, without build.yaml -----------------------------------


def test_base_image_per_arch_without_build_yaml(config: dict[str, Any]) -> None:
    """The newest Supervisor warns that build.yaml is deprecated and then passes no BUILD_FROM;
    those before 2026.04 pass BUILD_FROM=<arch>-base:latest (Alpine) without one. So the
    Dockerfile picks Home Assistant's Debian base from BUILD_ARCH, which every Supervisor
    passes, and never reads BUILD_FROM."""
    assert not (ADDON / "build.yaml").exists() and not (ADDON / "build.json").exists()
    lines = (ADDON / "Dockerfile").read_text().splitlines()
    dockerfile = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert "BUILD_FROM" not in dockerfile
    args = dict(
        line.removeprefix("ARG ").split("=", 1)
        for line in dockerfile.splitlines()
        if line.startswith("ARG ") and "=" in line
    )
    assert args["BUILD_ARCH"] == "amd64"  # a plain `docker build` outside the Supervisor
    base = args["PIVOICE_BASE"]
    for arch in config["arch"]:
        image = base.replace("${BUILD_ARCH}", arch)
        assert image == f"ghcr.io/home-assistant/{arch}-base-debian:bookworm"
        assert RE_DOCKER_IMAGE_BUILD.match(image), image
    froms = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert froms == ["${PIVOICE_BASE}", "${PIVOICE_BASE}"]


def test_homeassistant_minimum_icon_and_logo(config: dict[str, Any]) -> None:
    """The oldest Home Assistant this was tested with (2025.4.4, shared/research/
    wyoming-protocol.md §8); the store shows icon.png (square) and logo.png."""
    assert config["homeassistant"] == "2025.4.4"
    for name, square in (("icon.png", True), ("logo.png", False)):
        data = (ADDON / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert 64 <= width <= 512 and 64 <= height <= 512, (name, width, height)
        assert (width == height) == square, (name, width, height)
        assert len(data) < 50_000, name


def test_docs_use_home_assistant_2026_names() -> None:
    """HA 2026 calls add-ons apps: Settings → Apps (the older path named beside it)."""
    for path in (ADDON / "DOCS.md", REPO / "README.md"):
        text = path.read_text()
        assert "Settings → Apps" in text, path
        assert "Prefer handling commands locally" in text, path


def test_script_setup_runtime_installs_what_the_base_image_lacks() -> None:
    """A bare Debian has no Python: script/setup --runtime must bring it (the image splits
    the same packages between its stages: test_addon_repository.py)."""
    setup = (REPO / "script" / "setup").read_text()
    match = re.search(r"^apt_runtime=\(([^)]*)\)", setup, re.M)
    assert match
    runtime = set(match.group(1).split())
    # python3-dev: pyaudio and llama-cpp-python compile; alsa-utils: arecord/aplay.
    assert {"python3", "python3-venv", "python3-dev", "alsa-utils"} <= runtime


# --- shellcheck -----------------------------------------------------------------------------


def test_shell_scripts_are_shellcheck_clean() -> None:
    scripts = [
        ADDON / "run.sh", ADDON / "healthcheck.sh", FIXTURES / "bashio.sh",
        *(REPO / "script" / n for n in ("install-service", "build-addon", "check-addon-image")),
    ]  # fmt: skip
    done = subprocess.run(
        ["shellcheck", *map(str, scripts)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- run.sh under a stand-in bashio ---------------------------------------------------------


class AddonRun:
    """addon/run.sh in its own network namespace (it binds the add-on's fixed ports)."""

    def __init__(self, tmp: Path, options: dict[str, Any], env: dict[str, str] | None = None):
        self.records = tmp / "records"
        self.records.mkdir()
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        stub = bin_dir / "wyoming-pivoice"
        stub.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" "{FIXTURES / "wyoming-pivoice"}" "$@"\n'
        )
        stub.chmod(0o755)
        (tmp / "options.json").write_text(json.dumps(options))
        self.discovery = tmp / "discovery.jsonl"
        self.log = tmp / "run.log"
        environ = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "BASH_ENV": str(FIXTURES / "bashio.sh"),
            "FAKE_BASHIO_OPTIONS": str(tmp / "options.json"),
            "PIVOICE_ADDON_OPTIONS": str(tmp / "options.json"),
            "FAKE_BASHIO_DISCOVERY": str(self.discovery),
            "STUB_RECORD_DIR": str(self.records),
            **(env or {}),
        }
        with self.log.open("wb") as log:
            # unshare execs bash, which execs run.sh: one process to signal.
            self.proc = subprocess.Popen(
                ["unshare", "-rn", "bash", "-c", f"ip link set lo up && exec bash {ADDON}/run.sh"],
                env=environ,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def argv(self, command: str) -> list[str] | None:
        path = self.records / f"{command}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def discovered(self) -> list[dict[str, Any]]:
        if not self.discovery.exists():
            return []
        return [json.loads(line) for line in self.discovery.read_text().splitlines()]

    def wait_for(self, ready, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"run.sh exited ({self.proc.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what}; log:\n{self.log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def run_addon(
    tmp: Path, options: dict[str, Any], satellite: bool
) -> tuple[list[str], list[str] | None, list[dict[str, Any]], str]:
    run = AddonRun(tmp, options)
    try:
        run.wait_for(lambda: run.argv("server") is not None, "server started")
        if satellite:
            run.wait_for(lambda: run.argv("satellite") is not None, "satellite started")
        # The log line follows the discovery message: wait for both, or stop() races it.
        run.wait_for(
            lambda: run.discovered() and "Announced the server" in run.log.read_text(),
            "discovery message",
        )
    finally:
        status = run.stop()
    assert status == 0, run.log.read_text()
    server = run.argv("server")
    assert server is not None
    return server, run.argv("satellite"), run.discovered(), run.log.read_text()


def parses(argv: list[str]) -> None:
    """The real wyoming-pivoice parser accepts the command line (exits on an unknown flag)."""
    args = build_parser().parse_args(argv)
    assert args.command in ("server", "satellite")


@pytest.fixture
def defaults(config: dict[str, Any]) -> dict[str, Any]:
    return dict(config["options"])


DEFAULT_PROMPT = (
    "You are a helpful voice assistant running on a Raspberry Pi. Answer in one or two short "
    "spoken sentences, without lists or markup."
)
DEFAULT_SERVER = [
    "--log-level", "INFO", "server",
    "--uri", "tcp://0.0.0.0:10800", "--no-zeroconf",
    "--voice-dir", "/share/pivoice", "--voice-dir", "/share/piper",
    "--asr-model", "embedded", "--asr-beam-size", "1", "--asr-language", "en",
    "--voice", "embedded",
    "--llm-model", "embedded", "--llm-context", "2048",
    "--max-tokens", "256", "--system-prompt", DEFAULT_PROMPT,
]  # fmt: skip


def test_defaults_start_the_server_alone_and_announce_it(
    tmp_path: Path, defaults: dict[str, Any]
) -> None:
    server, satellite, discovered, log = run_addon(tmp_path, defaults, satellite=False)
    assert server == DEFAULT_SERVER
    assert satellite is None
    assert discovered == [
        {"service": "wyoming", "config": {"uri": f"tcp://{socket.gethostname()}:10800"}}
    ]
    assert "Announced the server to Home Assistant" in log
    parses(server)


def test_satellite_for_home_assistant_with_the_default_audio(
    tmp_path: Path, defaults: dict[str, Any]
) -> None:
    options = {**defaults, "satellite_enabled": True}
    server, satellite, _, _ = run_addon(tmp_path, options, satellite=True)
    assert server == DEFAULT_SERVER
    assert satellite == [
        "--log-level", "INFO", "satellite",
        "--uri", "tcp://0.0.0.0:10700", "--no-zeroconf",
        "--mic-command", "arecord -r 16000 -c 1 -f S16_LE -t raw",
        "--snd-command", "aplay -r {rate} -c {channels} -f S16_LE -t raw",
        "--vad-threshold", "0.5", "--vad-silence-ms", "300",
        "--wake-word", "okay_nabu",
    ]  # fmt: skip
    parses(satellite)


def test_every_option_set(tmp_path: Path, defaults: dict[str, Any]) -> None:
    prompt = 'You are "Pip". Answer in one sentence; never say $HOME or `ls`.'
    options = {
        **defaults,
        "asr_model": "small.en",
        "asr_language": "auto",
        "asr_beam_size": 5,
        "asr_threads": 2,
        "asr_window": 30.0,
        "voice": "en_GB-alan-medium",
        "tts_speaker": "0",
        "tts_length_scale": 0.85,
        "llm_model": "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        "llm_context": 4096,
        "llm_threads": 3,
        "max_tokens": 96,
        "system_prompt": prompt,
        "llm_lazy": True,
        "satellite_enabled": True,
        "satellite_mode": "standalone",
        "wake_word": "hey_jarvis",
        "vad_threshold": 0.65,
        "vad_silence_ms": 450,
        "mic_device": "USB PnP",
        "snd_command": "paplay --raw --rate={rate} --channels={channels} --format=s16le",
        "timing_log": True,
        "log_level": "debug",
    }
    server, satellite, _, _ = run_addon(tmp_path, options, satellite=True)
    assert server == [
        "--log-level", "DEBUG", "server",
        "--uri", "tcp://0.0.0.0:10800", "--no-zeroconf",
        "--voice-dir", "/share/pivoice", "--voice-dir", "/share/piper",
        "--asr-model", "small.en", "--asr-beam-size", "5", "--asr-language", "auto",
        "--asr-threads", "2", "--asr-window", "30.0",
        "--voice", "en_GB-alan-medium", "--tts-speaker", "0", "--tts-length-scale", "0.85",
        "--llm-model", "/share/pivoice/qwen2.5-0.5b-instruct-q4_k_m.gguf",
        "--llm-threads", "3", "--llm-context", "4096",
        "--max-tokens", "96", "--system-prompt", prompt, "--llm-lazy",
    ]  # fmt: skip
    assert satellite == [
        "--log-level", "DEBUG", "satellite",
        "--server", "tcp://127.0.0.1:10800",
        "--mic-device", "USB PnP",
        "--snd-command", "paplay --raw --rate={rate} --channels={channels} --format=s16le",
        "--vad-threshold", "0.65", "--vad-silence-ms", "450",
        "--language", "auto",
        "--wake-word", "hey_jarvis",
        "--timing-log", "/share/pivoice/timing.jsonl",
    ]  # fmt: skip
    parses(server)
    parses(satellite)


def test_named_satellite_with_commands_and_no_wake_word(
    tmp_path: Path, defaults: dict[str, Any]
) -> None:
    options = {
        **defaults,
        "llm_model": "/share/models/phi-3-mini-4k-instruct-q4.gguf",
        "satellite_enabled": True,
        "satellite_name": "Kitchen",
        "satellite_area": "Kitchen",
        "wake_word": "",
        "mic_command": "arecord -D plughw:CARD=Device,DEV=0 -r 16000 -c 1 -f S16_LE -t raw",
        "mic_device": "ignored when a command is given",
        "snd_device": "Headphones",
        "log_level": "warning",
    }
    server, satellite, _, _ = run_addon(tmp_path, options, satellite=True)
    assert server[:2] == ["--log-level", "WARNING"]
    assert server[server.index("--llm-model") + 1] == "/share/models/phi-3-mini-4k-instruct-q4.gguf"
    assert satellite == [
        "--log-level", "WARNING", "satellite",
        "--uri", "tcp://0.0.0.0:10700", "--no-zeroconf",
        "--mic-command", "arecord -D plughw:CARD=Device,DEV=0 -r 16000 -c 1 -f S16_LE -t raw",
        "--snd-device", "Headphones",
        "--vad-threshold", "0.5", "--vad-silence-ms", "300",
        "--name", "Kitchen", "--area", "Kitchen",
    ]  # fmt: skip
    parses(server)
    parses(satellite)


def test_remote_llm_options(tmp_path: Path) -> None:
    """The add-on's remote LLM options become the server's --llm-* flags; the key stays out
    of the command line and the log."""
    options = {
        **yaml.safe_load((ADDON / "config.yaml").read_text())["options"],
        "llm_url": "http://192.168.1.20:8080/v1",
        "llm_api_key": "sk-secret-4711",
        "llm_remote_model": "qwen2.5-7b-instruct",
        "llm_fallback": "local",
        "llm_turn_timeout": 45.5,
        "llm_concurrency": 2,
    }
    server, _, _, log = run_addon(tmp_path, options, satellite=False)
    assert server == [
        *DEFAULT_SERVER,
        "--llm-url", "http://192.168.1.20:8080/v1",
        "--llm-remote-model", "qwen2.5-7b-instruct",
        "--llm-fallback", "local",
        "--llm-turn-timeout", "45.5",
        "--llm-concurrency", "2",
    ]  # fmt: skip
    assert "sk-secret-4711" not in log
    parses(server)
    from wyoming_pivoice.server.cli import settings_from_args

    remote = settings_from_args(build_parser().parse_args(server)).remote_llm
    assert remote is not None and (remote.turn_timeout, remote.concurrency) == (45.5, 2)


def test_the_addon_stops_when_the_server_dies(tmp_path: Path, defaults: dict[str, Any]) -> None:
    """run.sh exits with the server's status and takes the satellite down with it."""
    options = {**defaults, "satellite_enabled": True}
    run = AddonRun(tmp_path, options, env={"STUB_SERVER_EXIT": "3"})
    try:
        status = run.proc.wait(timeout=60)
    finally:
        run.stop()
    log = run.log.read_text()
    assert status == 3, log
    assert "A service exited with status 3" in log
    assert run.discovered() == []  # never announced a server that is not there


def test_shellcheck_is_installed_by_script_setup() -> None:
    assert shutil.which("shellcheck")
    setup = (REPO / "script" / "setup").read_text()
    assert re.search(r"^apt_dev=\([^)]*\bshellcheck\b", setup, re.M)


def test_catalogue_lists_are_the_packages_catalogue(tmp_path: Path, config: dict[str, Any]) -> None:
    """The add-on offers the catalogue (wyoming_pivoice/catalogue.py) as lists; a choice
    there wins over the free-form option, which still takes any name or path."""
    from wyoming_pivoice import catalogue

    for option, stage in (
        ("asr_catalogue", "asr"),
        ("voice_catalogue", "voice"),
        ("llm_catalogue", "llm"),
    ):
        listed = re.fullmatch(r"list\((.*)\)\?", config["schema"][option])
        assert listed is not None and listed.group(1).split("|") == catalogue.names(stage)
    options = {
        **dict(config["options"]),
        "asr_catalogue": "base",
        "voice_catalogue": "zh_CN-huayan-medium",
        "llm_catalogue": "qwen2.5-1.5b-instruct-q4_k_m",
        "model_fallback": True,
    }
    validate_options(config["schema"], options)
    server, _, _, _ = run_addon(tmp_path, options, satellite=False)
    assert server[server.index("--asr-model") + 1] == "base"
    assert server[server.index("--voice") + 1] == "zh_CN-huayan-medium"
    assert server[server.index("--llm-model") + 1] == "qwen2.5-1.5b-instruct-q4_k_m"
    assert server[server.index("--model-fallback") + 1] == "embedded"
    parses(server)
    hub_file = {**dict(config["options"]), "llm_model": "Qwen/Qwen2.5-0.5B-Instruct-GGUF:q.gguf"}
    (tmp_path / "free").mkdir()
    server, _, _, _ = run_addon(tmp_path / "free", hub_file, satellite=False)
    assert server[server.index("--llm-model") + 1] == "Qwen/Qwen2.5-0.5B-Instruct-GGUF:q.gguf"


# --- the options are the settings' (wyoming_pivoice/addon.py) ------------------------------


def test_config_yaml_is_what_the_settings_declare(config: dict[str, Any]) -> None:
    """Each add-on option that is a flag is declared on its settings field (its Supervisor
    type, and its default where the add-on has one); config.yaml must say the same, since
    the Supervisor reads only that file."""
    from wyoming_pivoice import addon

    assert config["schema"] == addon.schema()
    assert config["options"] == addon.defaults()


def _a_value(typ: str) -> Any:
    """A valid value of a schema type that no default has."""
    match = RE_SCHEMA_ELEMENT.match(typ)
    assert match
    if typ.startswith("int"):
        return int(match.group("i_max") or 3) - 1
    if typ.startswith("float"):
        return (float(match.group("f_min") or 0) + float(match.group("f_max") or 2)) / 2
    if typ.startswith("list"):
        return match.group("list").split("|")[-1]
    if typ.startswith("url"):
        return "http://192.168.1.20:8080/v1"
    if typ.startswith("bool"):
        return True
    return "some-value"


@pytest.mark.parametrize("service", ["server", "satellite"])
def test_every_flag_option_reaches_its_flag(service: str, config: dict[str, Any]) -> None:
    """Each option the settings declare, set alone, arrives on the real parser as its value."""
    from wyoming_pivoice import addon, options
    from wyoming_pivoice.satellite.settings import SatelliteSettings
    from wyoming_pivoice.settings import ServerSettings

    cls = ServerSettings if service == "server" else SatelliteSettings
    argv_of = addon.server_argv if service == "server" else addon.satellite_argv
    offered = [(f.addon_key(), f) for _, f, _ in options.walk(cls) if f.addon is not None]
    assert offered
    for key, spec in offered:
        value = _a_value(config["schema"][key])
        given = {**config["options"], key: value}
        validate_options(config["schema"], given)
        args = build_parser().parse_args(argv_of(given))
        parsed = getattr(args, spec.dest)
        assert parsed == value or (parsed is True and value is True), (key, parsed, value)


def test_standalone_satellite_language(config: dict[str, Any]) -> None:
    """The standalone satellite hears in the speech's language unless given its own."""
    from wyoming_pivoice import addon
    from wyoming_pivoice.satellite.cli import settings_from_args

    given = {**config["options"], "satellite_mode": "standalone", "asr_language": "de"}
    args = build_parser().parse_args(addon.satellite_argv(given))
    assert settings_from_args(args).language == "de"
    given["satellite_language"] = "auto"
    args = build_parser().parse_args(addon.satellite_argv(given))
    assert settings_from_args(args).language is None  # auto: detected


def test_addon_args_with_unreadable_options_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "options.json").write_text("{not json")
    for path in (tmp_path / "options.json", tmp_path / "missing.json"):
        done = subprocess.run(
            [sys.executable, "-m", "wyoming_pivoice", "addon-args", "server", "--options", path],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and "cannot read the options" in done.stderr


def test_run_sh_stops_with_one_line_when_the_options_cannot_be_read(
    tmp_path: Path, defaults: dict[str, Any]
) -> None:
    run = AddonRun(tmp_path, defaults, env={"PIVOICE_ADDON_OPTIONS": str(tmp_path / "none.json")})
    try:
        status = run.proc.wait(timeout=60)
    finally:
        run.stop()
    log = run.log.read_text()
    assert status == 2, log
    assert "The server's options could not be read" in log and "Traceback" not in log
    assert run.argv("server") is None  # nothing started


def test_docs_give_each_options_default(config: dict[str, Any]) -> None:
    """DOCS.md's table shows the default config.yaml has (the prompt: described, not quoted)."""
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]*) \|", (ADDON / "DOCS.md").read_text(), re.M))
    for key, value in config["options"].items():
        if key == "system_prompt":
            continue
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        assert f"`{shown}`" in rows[key], (key, rows[key])
