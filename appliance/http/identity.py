"""Who is asking: the one definition of a client identity, used for KV reuse, fairness
and per-client caps (with API keys on, the key takes its place: see guard.Caller).

The identity is the peer address; when the peer is a trusted proxy, it is the rightmost
X-Forwarded-For entry that is not itself a trusted proxy (entries left of that were
written by the client and can be forged).
"""

from __future__ import annotations

import ipaddress

from appliance.config import Network, parse_networks

__all__ = ["Network", "client_identity", "is_trusted", "parse_networks"]

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
