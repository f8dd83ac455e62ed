"""One port for https and plain http (appliance/tls/listener.py) behind a real uvicorn, as
ops/serve.py builds it: TLS with the box's certificate, trusted by its CA alone; plain HTTP
answered with a 308 to the same host and path over https and nothing else; the plain port
(http_port) redirecting to the https port; a renewed certificate served without a restart;
HSTS on names only."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography import x509
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from appliance.config import Config
from appliance.http import conn
from appliance.ops.https import Https, prepare
from appliance.tls.hsts import hsts
from appliance.tls.listener import location
from appliance.tls.names import Names

NOW = dt.datetime.now(dt.UTC)  # real: the clients below check validity against the real clock


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"scheme": request.url.scheme, "path": request.url.path, "client": request.client.host
                         if request.client else None})


class Running:
    def __init__(self, https: Https, sock: socket.socket) -> None:
        self.https = https
        self.port = sock.getsockname()[1]
        inner = conn.http_protocol(30.0, 0, (), 120.0)
        app = hsts(Starlette(routes=[Route("/{path:path}", echo)]))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=https.protocol(inner)))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(verify=ssl.create_default_context(cafile=self.https.cert.parent / "ca.crt"), **kw)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    https = prepare(Config(tls="on", state_dir=str(tmp_path), port=sock.getsockname()[1]), lambda: NOW)
    assert https is not None and https.trust is not None
    live = Running(https, sock)
    yield live
    live.server.should_exit = True
    live.thread.join()
    sock.close()


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(4096):
            out += chunk
    return out


def test_https_is_served_with_the_box_certificate(running: Running) -> None:
    with running.client() as c:
        r = c.get(f"https://127.0.0.1:{running.port}/v1/models")
        assert r.json() == {"scheme": "https", "path": "/v1/models", "client": "127.0.0.1"}
        assert "strict-transport-security" not in r.headers  # an address: never HSTS
        r = c.get(f"https://localhost:{running.port}/")
        assert r.status_code == 200 and "strict-transport-security" not in r.headers
    # Without the box's CA, a client refuses it: nothing but the CA makes it trusted.
    with httpx.Client() as c, pytest.raises(httpx.ConnectError):
        c.get(f"https://127.0.0.1:{running.port}/")


def test_plain_http_on_the_same_port_only_redirects(running: Running) -> None:
    with httpx.Client() as c:
        r = c.get(f"http://127.0.0.1:{running.port}/a/b?c=1")
        assert r.status_code == 308
        assert r.headers["location"] == f"https://127.0.0.1:{running.port}/a/b?c=1"
        assert r.content == b""
    # The redirect followed lands on the page, over https.
    with running.client(follow_redirects=True) as c:
        r = c.get(f"http://127.0.0.1:{running.port}/x")
        assert r.json()["scheme"] == "https" and r.url.scheme == "https"
    # No usable Host: a 400, not a redirect anywhere.
    assert raw(running.port, b"GET / HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw(running.port, b"GET / HTTP/1.1\r\nHost: evil/x\r\n\r\n").startswith(b"HTTP/1.1 400")


def test_the_plain_port_redirects_to_the_https_port(running: Running) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    running.https.http_port = probe.getsockname()[1]
    probe.close()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        plain = asyncio.run_coroutine_threadsafe(running.https.plain_listener("127.0.0.1"), loop).result()
        assert plain is not None
        r = httpx.get(f"http://127.0.0.1:{running.https.http_port}/admin", headers={"Host": "box.local"})
        assert r.status_code == 308 and r.headers["location"] == f"https://box.local:{running.port}/admin"
        r = httpx.get(f"http://127.0.0.1:{running.https.http_port}/", headers={"Host": "box.local:80"})
        assert r.headers["location"] == f"https://box.local:{running.port}/"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


def test_hsts_on_a_name(running: Running) -> None:
    with running.client() as c:
        r = c.get(f"https://127.0.0.1:{running.port}/", headers={"Host": "appliance.local"})
    assert r.headers["strict-transport-security"] == "max-age=86400"


def test_a_renewed_certificate_serves_new_connections_without_a_restart(running: Running) -> None:
    def serial() -> int:
        with socket.create_connection(("127.0.0.1", running.port)) as s:
            ctx = ssl.create_default_context(cafile=running.https.cert.parent / "ca.crt")
            with ctx.wrap_socket(s, server_hostname="localhost") as tls:
                der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    before = serial()
    renewer = running.https.renewer
    assert renewer is not None
    moved = renewer.wanted()
    renewer.wanted = lambda: Names(moved.dns, moved.ips | {ipaddress.ip_address("10.1.2.3")})  # a new lease
    assert renewer.tick()
    assert serial() != before


@pytest.mark.parametrize(("head", "port", "url"), [
    (b"GET /x HTTP/1.1\r\nHost: box.local:8080", None, "https://box.local:8080/x"),
    (b"GET /x HTTP/1.1\r\nHost: box.local", 8443, "https://box.local:8443/x"),
    (b"GET / HTTP/1.1\r\nhost: [::1]:80", 443, "https://[::1]/"),
    (b"GET http://other/ HTTP/1.1\r\nHost: box", None, "https://box/"),  # an absolute target: to its root
    (b"GET / HTTP/1.1\r\nHost: a b", None, None),
])
def test_location(head: bytes, port: int | None, url: str | None) -> None:
    assert location(head, port) == url
