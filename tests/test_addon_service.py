"""script/install-service: the systemd units for a bare Pi, written without systemd."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from wyoming_pivoice.__main__ import build_parser

from .helpers import REPO

INSTALL = REPO / "script" / "install-service"
SERVER = "wyoming-pivoice-server.service"
SATELLITE = "wyoming-pivoice-satellite.service"


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(INSTALL), *args], capture_output=True, text=True, check=False, timeout=60
    )


def read_unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    unit.read_string(path.read_text())
    return unit


def test_units_for_server_and_satellite(tmp_path: Path) -> None:
    done = install(
        "--dry-run",
        "--unit-dir", str(tmp_path),
        "--user", "pi",
        "--venv", "/home/pi/wyoming-pivoice/.venv",
        "--server-args", "--llm-model /home/pi/models/qwen.gguf --max-tokens 128",
        "--satellite-args", "--wake-word okay_nabu --mic-device USB",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [SATELLITE, SERVER]
    # No systemd here: --dry-run says what it would run instead of running it.
    assert done.stdout.splitlines()[-2:] == [
        "would run: systemctl daemon-reload",
        f"would run: systemctl enable --now {SERVER} {SATELLITE}",
    ]

    server = read_unit(tmp_path / SERVER)
    assert server["Unit"]["After"] == "sound.target network-online.target"
    assert server["Unit"]["Wants"] == "network-online.target"
    assert server["Service"]["User"] == "pi"
    assert server["Service"]["Restart"] == "always"
    assert server["Service"]["WorkingDirectory"] == str(REPO)
    assert server["Service"]["ExecStart"] == (
        "/home/pi/wyoming-pivoice/.venv/bin/wyoming-pivoice server --uri tcp://0.0.0.0:10800 "
        "--llm-model /home/pi/models/qwen.gguf --max-tokens 128"
    )
    assert server["Install"]["WantedBy"] == "multi-user.target"

    satellite = read_unit(tmp_path / SATELLITE)
    assert satellite["Unit"]["After"] == (
        "sound.target network-online.target wyoming-pivoice-server.service"
    )
    assert satellite["Unit"]["Wants"] == "network-online.target wyoming-pivoice-server.service"
    assert satellite["Service"]["User"] == "pi"
    assert satellite["Service"]["SupplementaryGroups"] == "audio"
    # The audio threads may take SCHED_RR 10 (else nice -10) as user pi; the server may not.
    assert (satellite["Service"]["LimitRTPRIO"], satellite["Service"]["LimitNICE"]) == ("10", "-10")
    assert "LimitRTPRIO" not in server["Service"] and server["Service"]["RestrictRealtime"] == "yes"
    assert satellite["Service"]["Restart"] == "always"
    assert satellite["Service"]["ExecStart"] == (
        "/home/pi/wyoming-pivoice/.venv/bin/wyoming-pivoice satellite --uri tcp://0.0.0.0:10700 "
        "--wake-word okay_nabu --mic-device USB"
    )

    # The command lines are ones the real CLI accepts.
    for unit in (server, satellite):
        argv = shlex.split(unit["Service"]["ExecStart"])
        assert build_parser().parse_args(argv[1:]).command in ("server", "satellite")


def test_satellite_only_does_not_wait_for_a_local_server(tmp_path: Path) -> None:
    done = install(
        "--dry-run", "--unit-dir", str(tmp_path), "--user", "pi", "--no-server",
        "--satellite-server", "tcp://192.168.1.20:10800", "--satellite-args", "--wake-word alexa",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == [SATELLITE]
    satellite = read_unit(tmp_path / SATELLITE)
    assert satellite["Unit"]["After"] == "sound.target network-online.target"
    assert "wyoming-pivoice-server" not in (tmp_path / SATELLITE).read_text()
    assert satellite["Service"]["ExecStart"] == (
        f"{REPO}/.venv/bin/wyoming-pivoice satellite --server tcp://192.168.1.20:10800 "
        "--wake-word alexa"
    )
    argv = shlex.split(satellite["Service"]["ExecStart"])
    assert build_parser().parse_args(argv[1:]).server == "tcp://192.168.1.20:10800"
    assert f"would run: systemctl enable --now {SATELLITE}" in done.stdout


def test_dry_run_without_a_unit_dir_prints_the_units() -> None:
    done = install("--dry-run", "--user", "pi", "--no-satellite")
    assert done.returncode == 0, done.stderr
    assert f"# {SERVER}\n[Unit]\n" in done.stdout
    assert "[Service]\nType=simple\nUser=pi\n" in done.stdout
    assert SATELLITE not in done.stdout.replace(f"# {SERVER}", "")


def test_refuses_root_and_nonsense() -> None:
    assert install("--dry-run", "--user", "root").returncode == 2
    assert install("--dry-run", "--no-server", "--no-satellite", "--user", "pi").returncode == 2
    bad = install("--frobnicate")
    assert bad.returncode == 2 and "unknown option --frobnicate" in bad.stderr


def test_uninstall_dry_run(tmp_path: Path) -> None:
    done = install("--uninstall", "--dry-run", "--unit-dir", str(tmp_path), "--user", "pi")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"would run: systemctl disable --now {SERVER} {SATELLITE}",
        f"would run: rm -f {tmp_path}/{SERVER}",
        f"would run: rm -f {tmp_path}/{SATELLITE}",
        "would run: systemctl daemon-reload",
    ]


def test_help_lists_the_options() -> None:
    done = install("--help")
    assert done.returncode == 0
    for option in ("--user", "--venv", "--unit-dir", "--dry-run", "--no-satellite", "--uninstall"):
        assert option in done.stdout


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, check=False, timeout=60
    )


def exposure(unit: Path) -> float:
    """systemd-analyze security's overall exposure (0 safest … 10 UNSAFE) of a unit file."""
    done = analyze("security", "--offline=true", "--no-pager", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout + done.stderr)
    assert match, done.stdout + done.stderr
    return float(match.group(1))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_units_verify_and_are_sandboxed(tmp_path: Path) -> None:
    """Both units pass `systemd-analyze verify` (ExecStart: this checkout's venv) and their
    exposure is low: before the sandbox both were 9.5 UNSAFE here. What they keep: the
    network (Wyoming, zeroconf's netlink), the checkout read-only, the state folder, and for
    the satellite the ALSA devices."""
    done = install("--dry-run", "--unit-dir", str(tmp_path), "--user", "daemon")
    assert done.returncode == 0, done.stderr
    for name, worst in ((SERVER, 2.0), (SATELLITE, 2.5)):
        unit = tmp_path / name
        verified = analyze("verify", str(unit))
        assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr
        assert exposure(unit) <= worst, name
        service = read_unit(unit)["Service"]
        assert service["ProtectSystem"] == "strict" and service["ProtectHome"] == "read-only"
        assert service["NoNewPrivileges"] == "yes" and service["PrivateTmp"] == "yes"
        families = set(service["RestrictAddressFamilies"].split())
        assert families == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
        assert service["RestartPreventExitStatus"] == "2"  # a mistake in the options
        assert "HF_HOME=%S/wyoming-pivoice/huggingface" in service["Environment"].split()
    satellite = read_unit(tmp_path / SATELLITE)["Service"]
    assert satellite["DeviceAllow"] == "char-alsa rw" and satellite["DevicePolicy"] == "closed"
    assert read_unit(tmp_path / SERVER)["Service"]["PrivateDevices"] == "yes"
