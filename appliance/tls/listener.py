"""One port for both: a connection whose first byte starts a TLS handshake (0x16) is handed,
TLS and all, to the server's HTTP protocol; anything else is plain HTTP and gets a 308 to the
same host, port and path over https, and nothing more. nginx does the same on its TLS port
(error 497): a person who types `box:8080` (a browser tries http first) lands on the page
instead of on "the connection was reset", and no request of theirs is ever served in clear.

`https_protocol` wraps uvicorn's protocol class: uvicorn listens without TLS of its own and
this wrapper adds it per connection with `context()` at that moment, so a renewed certificate
serves new connections at once, without a restart. asyncio's SSLProtocol is what
`loop.create_server(ssl=...)` builds for each connection; here it is built one byte later.
`redirect_protocol` is the plain listener on `http_port` (port 80), redirecting to `port`.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable
from typing import Any

TLS_HANDSHAKE = 0x16
MAX_HEAD = 8192  # a redirect needs the request line and Host, nothing more
HANDSHAKE_TIMEOUT_S = 10
_HOST = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(?::\d+)?$")
_TARGET = re.compile(r"^/[\x21-\x7e]*$")


def location(head: bytes, port: int | None) -> str | None:
    """The https URL a plain request should go to: its Host (with `port` instead of its own,
    when given; 443 left out) and its path. None when the request says no usable Host."""
    lines = head.split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    target = parts[1] if len(parts) == 3 and _TARGET.match(parts[1]) else "/"
    host = next((line.split(b":", 1)[1].strip().decode("latin-1") for line in lines[1:]
                 if line.lower().startswith(b"host:")), "")
    found = _HOST.match(host)
    if found is None:
        return None
    if port is not None:
        host = found.group(1) + ("" if port == 443 else f":{port}")
    return f"https://{host}{target}"


def _answer(url: str | None) -> bytes:
    if url is None:
        body = b"plain HTTP is not served here; use https://\n"
        return (b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: "
                + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
    return (f"HTTP/1.1 308 Permanent Redirect\r\nlocation: {url}\r\ncontent-length: 0\r\n"
            "cache-control: no-store\r\nconnection: close\r\n\r\n").encode("latin-1")


class _Redirect(asyncio.Protocol):
    """Reads a request head, answers it with the redirect and closes; gives up on a head that
    does not come within `deadline_s` or MAX_HEAD bytes."""

    def __init__(self, port: int | None, deadline_s: float) -> None:
        self.port = port
        self.deadline_s = deadline_s
        self.head = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(self.deadline_s, transport.abort)

    def data_received(self, data: bytes) -> None:
        self.head += data
        if b"\r\n\r\n" in self.head or len(self.head) > MAX_HEAD:
            self.respond(location(self.head.split(b"\r\n\r\n")[0], self.port))

    def respond(self, url: str | None) -> None:
        assert self.transport is not None
        self.transport.write(_answer(url))
        self.transport.close()
        self.data_received = lambda data: None  # type: ignore[method-assign]  # the rest is ignored

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()


def redirect_protocol(port: int, deadline_s: float) -> Callable[[], asyncio.Protocol]:
    """For `loop.create_server`: plain HTTP on another port, redirected to https on `port`."""
    return lambda: _Redirect(port, deadline_s)


def https_protocol(inner: type[asyncio.Protocol], context: Callable[[], ssl.SSLContext],
                   deadline_s: float) -> type[asyncio.Protocol]:
    """A protocol class for `uvicorn.Config(http=...)`: TLS for `inner`, plain HTTP redirected."""

    class Sniff(_Redirect):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(None, deadline_s)
            self.kwargs = kwargs  # uvicorn's config and server state, for `inner`

        def data_received(self, data: bytes) -> None:
            if self.head or data[:1] != bytes([TLS_HANDSHAKE]):
                return super().data_received(data)
            assert self.transport is not None and self.timer is not None
            self.timer.cancel()  # the handshake has its own timeout; then `inner` times requests
            tls = SSLProtocol(asyncio.get_running_loop(), inner(**self.kwargs), context(), None, server_side=True,  # type: ignore[arg-type]
                              ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
            self.transport.set_protocol(tls)
            tls.connection_made(self.transport)
            while data:  # what was read already: the start of the ClientHello
                buffer = tls.get_buffer(len(data))
                n = min(len(buffer), len(data))
                buffer[:n] = data[:n]
                tls.buffer_updated(n)
                data = data[n:]

    return Sniff
