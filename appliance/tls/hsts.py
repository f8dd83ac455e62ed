"""Strict-Transport-Security, only where it cannot lock people out.

HSTS makes a browser refuse plain HTTP to a host, and refuse to let a person click past a
certificate warning, until max-age runs out. With the box's own CA that is a trap where:
- the host is an IP address or localhost: HSTS binds the host, not the port, so every other
  service on that address (a printer's page on the same DHCP lease tomorrow, a developer's
  server on localhost) would be forced to https too;
- the CA is replaced (a new state directory): a browser that saw HSTS cannot reach the box
  at all, not even past a warning, until max-age ends.
So: names only (box.local, the host name), never an address, and one day (MAX_AGE_S), no
includeSubDomains: long enough that a person's next visits do not start in clear, short
enough that a reinstalled box is reachable again tomorrow. A browser records HSTS only from
a connection it trusted (RFC 6797 8.1), so a person who has not trusted the CA is never bound.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_AGE_S = 86400
HEADER = (b"strict-transport-security", f"max-age={MAX_AGE_S}".encode())


def safe_host(host: str) -> bool:
    """A name HSTS may bind: not an IP literal, not localhost."""
    name = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
    name = name.lower().rstrip(".")
    try:
        ipaddress.ip_address(name)
        return False
    except ValueError:
        pass
    return bool(name) and name != "localhost" and not name.endswith(".localhost")


def hsts(app: ASGIApp) -> ASGIApp:
    """`app` with HSTS on its https responses to a safe Host."""
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            return await app(scope, receive, send)
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if not safe_host(host):
            return await app(scope, receive, send)

        async def send_hsts(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), HEADER]}
            await send(message)

        await app(scope, receive, send_hsts)

    return wrapped
