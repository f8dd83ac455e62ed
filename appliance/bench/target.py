"""Where a server is: its root URL, whether it is on loopback, the source address of each
simulated user, and the model it serves."""

from __future__ import annotations

import ipaddress

import httpx


def base_url(url: str) -> str:
    """Server root from any of `host:port`, `.../v1` or `.../v1/chat/completions`."""
    url = url.rstrip("/")
    for suffix in ("/chat/completions", "/v1"):
        url = url.removesuffix(suffix)
    return url


def is_loopback(url: str) -> bool:
    """True for 127.x.y.z and localhost: the only targets we can reach from many addresses."""
    host = httpx.URL(base_url(url)).host
    if host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    # IPv6 has one loopback address (::1), so there is nothing to spread users over.
    return addr.version == 4 and addr.is_loopback


def user_address(i: int) -> str:
    """Source address of simulated user i (0-based): 127.0.0.2, 127.0.0.3, ...

    The whole of 127/8 reaches the local host, so each user can arrive from their own address
    as each PC in an office does; the server keys cache reuse and fairness by it. 127.0.0.1
    stays for everything that is not a user (health checks, resolve_model).
    """
    hi, lo = divmod(i, 253)  # .2 to .254 in each /24
    if hi > 255:
        raise ValueError(f"no loopback address for user {i}")
    return f"127.0.{hi}.{lo + 2}"


async def resolve_model(url: str, timeout: float = 10.0) -> str:
    """First id from GET /v1/models; "default" when the server does not say."""
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            resp = await client.get(base_url(url) + "/v1/models")
            resp.raise_for_status()
            return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, LookupError, TypeError):
        return "default"
