"""The HA satellite advertises `_wyoming._tcp.local.` the way HA's config flow discovers it:
browse, resolve, connect to the advertised address and port, `describe` → a satellite.

Runs inside a private network namespace (`unshare -rn`), so no multicast ever reaches
the machine's real network. Run as a module, this file is the probe inside it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from .helpers import REPO

NAMESPACE_SETUP = (
    "ip link set lo up && ip link set lo multicast on && ip route add 224.0.0.0/4 dev lo && "
)
SERVICE = "_wyoming._tcp.local."


def test_satellite_is_discovered_and_describes_itself(tmp_path: Path) -> None:
    result = subprocess.run(
        ["unshare", "-rn", "sh", "-c",
         NAMESPACE_SETUP + f"{sys.executable} -m tests.test_ha_satellite_zeroconf {tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = json.loads(result.stdout.strip().splitlines()[-1])
    log = (tmp_path / "satellite.log").read_text()
    assert found.get("name") == f"pivoice-probe-satellite.{SERVICE}", result.stdout + log
    assert found["port"] == found["expected_port"]
    assert "127.0.0.1" in found["addresses"]
    assert found["satellite"] == "Probe satellite"  # HA's get_name() shows this


async def _describe(host: str, port: int) -> str | None:
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info

    async with AsyncTcpClient(host, port) as client:
        await client.write_event(Describe().event())
        event = await asyncio.wait_for(client.read_event(), 10.0)
        assert event is not None
        satellite = Info.from_event(event).satellite
        return satellite.name if satellite is not None else None


def main(workdir: Path) -> int:
    from tests.helpers import free_port, wait_for_port
    from tests.zeroconf_probe import browse_first

    port = free_port()
    with open(workdir / "satellite.log", "w") as log:
        sat = subprocess.Popen(
            [sys.executable, "-m", "wyoming_pivoice", "satellite",
             "--uri", f"tcp://0.0.0.0:{port}", "--zeroconf-name", "pivoice-probe-satellite",
             "--name", "Probe satellite", "--snd-device", "null", "--mic-command", "true"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_port(port, proc=sat)
        found = browse_first()
        if found:
            addresses = found["addresses"]
            assert isinstance(addresses, list) and isinstance(found["port"], int)
            found["satellite"] = asyncio.run(_describe(addresses[0], found["port"]))
    finally:
        sat.terminate()
        sat.wait(10)
    print(json.dumps({"expected_port": port, **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
