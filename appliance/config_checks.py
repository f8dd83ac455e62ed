"""The checks a setting's value passes (config.py names each in its field): each returns
None when the value is good, else the words shown after the key's name."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

# Trusted proxies' addresses (http/identity.py reads client addresses through them).
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


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]; '' -> []."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, dash, hi = part.partition("-")
        if not (lo.isdigit() and (hi.isdigit() or not dash)):
            raise ValueError(f"must be a CPU list like '0-3' or '0,2', got {text!r}")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise ValueError(f"range {part!r} is reversed")
        cpus.extend(range(a, b + 1))
    return sorted(set(cpus))


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else "must be a port number 0-65535"


def cpus(v: str) -> str | None:
    try:
        parse_cpu_list(v)
    except ValueError as e:
        return str(e)
    return None


def networks(v: tuple[str, ...]) -> str | None:

    try:
        parse_networks(v)
    except ValueError as e:
        return str(e)
    return None


MAX_PRESETS = 32  # each is a pinned KV sequence


def presets(v: dict[str, str]) -> str | None:
    if len(v) > MAX_PRESETS:
        return f"at most {MAX_PRESETS} presets"
    if any(not text for text in v.values()):
        return "a preset's text must not be empty"
    return None


def one_of(*choices: str) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"
