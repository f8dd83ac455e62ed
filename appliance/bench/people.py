"""Signed-in bench users for a server in people mode (auth = "people"): before the clock
starts, the bench adds one person per simulated user through /admin/people (from this
machine, which the operator's routes admit), takes each invite from that user's own address,
and sends every request with the person's session cookie and CSRF token, as the page does.
A server in open mode gets no headers: the same command measures both side by side."""

from __future__ import annotations

import secrets
import ssl

import httpx

from appliance.bench.target import base_url, user_address

_made: dict[str, list[dict[str, str]]] = {}  # server root -> its bench people's headers, in user order


async def people_mode(url: str, tls: ssl.SSLContext) -> bool:
    async with httpx.AsyncClient(verify=tls, timeout=10, trust_env=False) as client:
        try:
            return (await client.get(base_url(url) + "/auth/me")).json().get("mode") == "people"
        except (httpx.HTTPError, ValueError, AttributeError):
            return False


async def signed_in(url: str, n: int, tls: ssl.SSLContext, local: bool) -> list[dict[str, str]] | None:
    """Headers for users 0..n-1 (cookie and CSRF token), or None when the server is in open mode."""
    root = base_url(url)
    if not await people_mode(url, tls):
        return None
    made = _made.setdefault(root, [])
    run = secrets.token_hex(3)
    async with httpx.AsyncClient(verify=tls, timeout=30, trust_env=False) as admin:
        while len(made) < n:
            i = len(made)
            r = await admin.post(root + "/admin/people", json={"name": f"bench-{run}-{i}"})
            if r.status_code != 201:
                raise RuntimeError(f"{root}/admin/people: {r.status_code} {r.text[:200]} (the bench adds its people "
                                   "from the server's own machine)")
            token = r.json()["invite_url"].rsplit("=", 1)[1]
            transport = httpx.AsyncHTTPTransport(verify=tls, local_address=user_address(i) if local else None)
            async with httpx.AsyncClient(transport=transport, timeout=30, trust_env=False) as user:
                r = await user.post(f"{root}/auth/invite/accept",
                                    json={"token": token, "password": secrets.token_urlsafe(16)})
            r.raise_for_status()
            cookie = r.headers["set-cookie"].split(";")[0]
            made.append({"Cookie": cookie, "X-CSRF-Token": r.json()["csrf"]})
    return made[:n]
