"""Who is asking: the one definition of a client identity, used for KV reuse, fairness
and per-client caps (with API keys on, the key takes its place: see guard.Caller).

The identity is the peer address; when the peer is a trusted proxy, it is the rightmost
X-Forwarded-For entry that is not itself a trusted proxy (entries left of that were
written by the client and can be forged).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    """'10.0.0.1', '10.0.0.0/24' or '::1' -> networks; ValueError names a bad entry."""
    nets = []
    for item in items:
        try:
            nets.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ValueError(f"not an IP address or network: {item!r}") from None
    return tuple(nets)


def is_trusted(addr: str, proxies: tuple[Network, ...]) -> bool:
    """Is addr one of our trusted proxies?"""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return any(ip in net for net in proxies)


def client_identity(peer: str, forwarded_for: str | None, proxies: tuple[Network, ...]) -> str:
    if not proxies or not forwarded_for or not is_trusted(peer, proxies):
        return peer
    for hop in reversed([h.strip() for h in forwarded_for.split(",")]):
        if hop and not is_trusted(hop, proxies):
            return hop
    return peer  # every hop is a proxy of ours: the request started at one of them
