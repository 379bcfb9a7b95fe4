"""Run inside a private network namespace (see test_zeroconf.py): start the real server with
zeroconf on, browse for `_wyoming._tcp.local.` and print what was found as JSON.

`browse_first` is also the probe of test_ha_satellite_zeroconf.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from zeroconf import ServiceBrowser, ServiceStateChange, Zeroconf

from tests.helpers import free_port, wait_for_port

SERVICE = "_wyoming._tcp.local."


def browse_first(timeout: float = 20.0) -> dict[str, object]:
    """Browse as Home Assistant does; the first service resolved: name, port, addresses."""
    found: dict[str, object] = {}
    resolved = threading.Event()
    zc = Zeroconf()
    try:

        def on_change(
            zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
        ) -> None:
            if state_change is ServiceStateChange.Added:
                info = zeroconf.get_service_info(service_type, name, timeout=3000)
                if info is not None:
                    found.update(name=name, port=info.port, addresses=info.parsed_addresses())
                    resolved.set()

        ServiceBrowser(zc, SERVICE, handlers=[on_change])
        resolved.wait(timeout)
    finally:
        zc.close()
    return found


def main() -> int:
    port = free_port()
    name = "pivoice-probe"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wyoming_pivoice",
            "server",
            "--uri",
            f"tcp://0.0.0.0:{port}",
            "--zeroconf-name",
            name,
            "--llm-lazy",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc=server)
        found = browse_first()
    finally:
        server.terminate()
        server.wait(10)
    print(json.dumps({"expected_port": port, "expected_name": f"{name}.{SERVICE}", **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
