"""Where people reach the box, for the links it hands out (an invite, a shared chat) and their
QR codes. A request that came to a loopback address (a browser on the box itself, an SSH
tunnel: the only ways to make the first admin before `appliance person add`) would put
`http://127.0.0.1:8080` in them, which leads nowhere from a phone: those links name the box
by its announced name, `<box_name>.local`, and the port it serves on. Any other request's
links name the host it came by (what the person typed, or a proxy's public name).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.requests import Request

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Box:
    """The box's name on the LAN, the port it serves on and how (ops/address.py builds it)."""

    name: str = "appliance"
    port: int = 8080
    scheme: str = "http"

    @property
    def host(self) -> str:
        return f"{self.name}.local"

    @property
    def url(self) -> str:
        return join(self.scheme, self.host, self.port) + "/"


def join(scheme: str, host: str, port: int) -> str:
    """scheme://host:port, without a port the scheme implies (no trailing slash)."""
    return f"{scheme}://{host}" + ("" if DEFAULT_PORTS.get(scheme) == port else f":{port}")


def loopback(host: str) -> bool:
    """Whether a Host header's name is this machine's own (127.0.0.0/8, ::1, localhost)."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def origin(request: Request, box: Box) -> str:
    """The origin (and root path) the links made for `request` carry, without a trailing slash."""
    if loopback(request.url.hostname or ""):
        return join(request.url.scheme, box.host, box.port) + request.scope.get("root_path", "").rstrip("/")
    return str(request.base_url).rstrip("/")


def invite_link(origin: str, token: str) -> str:
    # In the fragment: a browser never sends it to a server, so no proxy or log sees the token.
    return f"{origin}/#invite={token}"
