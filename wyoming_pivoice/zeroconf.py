"""Advertising an endpoint as `_wyoming._tcp.local.` so Home Assistant discovers it.

We use the zeroconf library directly rather than `wyoming.zeroconf` because we
need to unregister on shutdown and to choose the interfaces (tests advertise on
a private network namespace's loopback only).
"""

from __future__ import annotations

import logging
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .options import opt

if TYPE_CHECKING:  # the library loads when something is advertised, not with the settings
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

_LOGGER = logging.getLogger(__name__)

SERVICE_TYPE = "_wyoming._tcp.local."
_MDNS_GROUP = "224.0.0.251"


@dataclass(frozen=True)
class ZeroconfSettings:
    enabled: bool = opt(True, "--no-zeroconf", help="do not advertise over mDNS")
    name: str | None = opt(  # default: derived from the host name (default_name)
        None,
        "--zeroconf-name",
        help="default: pivoice-<hostname> (a satellite: pivoice-<hostname>-satellite)",
    )
    host: str | None = opt(None, "--zeroconf-host", help="address to advertise; default: detected")


def default_name(role: str) -> str:
    """`pivoice-<host>` for the server, `pivoice-<host>-satellite` for the satellite."""
    host = re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()).strip("-") or "pi"
    return f"pivoice-{host}" if role == "server" else f"pivoice-{host}-{role}"


def detect_host() -> str:
    """The address other machines reach us on: the source address of the mDNS route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((_MDNS_GROUP, 5353))
            address = probe.getsockname()[0]
        except OSError:
            address = "0.0.0.0"
    if address != "0.0.0.0":
        return address
    # No source address for the multicast route (e.g. a loopback-only host): take any interface.
    import ifaddr

    addresses = [
        str(ip.ip)
        for adapter in ifaddr.get_adapters()
        for ip in adapter.ips
        if ip.is_IPv4 and ip.ip != "0.0.0.0"
    ]
    outside = [a for a in addresses if not a.startswith("127.")]
    return (outside or addresses or ["127.0.0.1"])[0]


class Advertiser:
    """Registers one Wyoming service for as long as the endpoint runs."""

    def __init__(self, name: str, port: int, host: str | None = None) -> None:
        self.name = name
        self.port = port
        self.host = host if host and host not in ("0.0.0.0", "") else detect_host()
        self._zeroconf: AsyncZeroconf | None = None
        self._info: AsyncServiceInfo | None = None

    async def start(self) -> None:
        from zeroconf import InterfaceChoice
        from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

        self._zeroconf = AsyncZeroconf(interfaces=InterfaceChoice.All)
        self._info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{self.name}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(self.host)],
            port=self.port,
            server=f"{self.name}.local.",
        )
        await self._zeroconf.async_register_service(self._info)
        _LOGGER.info("Advertising %s on %s:%s over zeroconf", self.name, self.host, self.port)

    async def stop(self) -> None:
        if self._zeroconf is None:
            return
        if self._info is not None:
            await self._zeroconf.async_unregister_service(self._info)
        await self._zeroconf.async_close()
        self._zeroconf = None
