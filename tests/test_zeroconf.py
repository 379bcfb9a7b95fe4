"""The server advertises `_wyoming._tcp.local.` — tested inside a private network namespace so
no multicast ever reaches the machine's real network."""

from __future__ import annotations

import json
import subprocess
import sys

from .helpers import REPO

NAMESPACE_SETUP = (
    "ip link set lo up && ip link set lo multicast on && ip route add 224.0.0.0/4 dev lo && "
)


def test_server_is_discovered_by_a_browser() -> None:
    result = subprocess.run(
        [
            "unshare",
            "-rn",
            "sh",
            "-c",
            NAMESPACE_SETUP + f"{sys.executable} -m tests.zeroconf_probe",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found.get("name") == found["expected_name"], result.stdout + result.stderr
    assert found["port"] == found["expected_port"]
    assert "127.0.0.1" in found["addresses"]
