"""The names and addresses people reach the box by, which its server certificate covers: the
host name and FQDN, `<box_name>.local`, localhost, and every address of its interfaces as they
are now (a router's DHCP may change them: renewal.py compares and reissues)."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
IF_INET6 = Path("/proc/net/if_inet6")


@dataclass(frozen=True, slots=True)
class Names:
    dns: frozenset[str]
    ips: frozenset[IP]

    def covers(self, other: Names) -> bool:
        return other.dns <= self.dns and other.ips <= self.ips


def current(box_name: str) -> Names:
    hosts = {socket.gethostname(), socket.getfqdn(), "localhost"}
    if box_name:
        hosts.add(f"{box_name}.local")
    dns = frozenset(h.lower().rstrip(".") for h in hosts if h and not _is_ip(h))
    return Names(dns, frozenset(addresses()))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def addresses() -> set[IP]:
    """Every interface's IPv4 address and IPv6 addresses, link-local ones left out (a URL
    cannot carry their zone, so nobody types them)."""
    found: set[IP] = {ipaddress.ip_address("127.0.0.1")}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # an interface without an IPv4 address
            found.add(ipaddress.IPv4Address(raw[20:24]))
    try:
        lines = IF_INET6.read_text().splitlines()
    except OSError:
        lines = []  # no IPv6 on this machine
    for line in lines:
        found.add(ipaddress.IPv6Address(bytes.fromhex(line.split()[0])))
    return {ip for ip in found if not ip.is_link_local}
