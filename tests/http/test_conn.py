"""appliance.http.conn: the request deadline and the per-address connection cap, on a real uvicorn
server on a loopback port running a tiny ASGI app, with raw sockets as clients (so a test
can trickle bytes, stay silent, or send from its own 127.0.0.x address). Deadlines are
half a second, so the whole file takes a few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from helpers.polling import until

from appliance.http.conn import ABORT_AFTER_S, ConnLimits, GuardedH11Protocol, http_protocol
from appliance.http.identity import parse_networks

DEADLINE = 0.5
# How long a wait for a close may take on a busy machine (a wait ends once its condition holds).
# What closed a connection is told by its 408, or the limits' timed_out count, never by an
# upper bound on the time it took: a machine kept busy by neighbours only makes it later.
SLACK = 5.0


@dataclass
class Seen:
    disconnects: list[str] = field(default_factory=list)


def make_app(seen: Seen) -> Callable[..., Awaitable[None]]:
    """Reads the whole body, answers {"n": body length}. `?wait=S` waits S seconds before
    reading the body (as the appliance waits for a parse slot); `/slow` answers S seconds
    after the body arrived; `/big` answers 16 MiB."""

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        assert scope["type"] == "http"
        query = dict(p.split("=") for p in scope["query_string"].decode().split("&") if p)
        wait = float(query.get("wait", 0))
        if scope["path"] != "/slow":
            await asyncio.sleep(wait)
        n, more = 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                seen.disconnects.append(scope["path"])
                return
            n += len(msg["body"])
            more = msg["more_body"]
        if scope["path"] == "/slow":
            await asyncio.sleep(wait)
        body = json.dumps({"n": n}).encode() if scope["path"] != "/big" else b"x" * 2**24
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


@dataclass
class Server:
    port: int
    protocol: type[GuardedH11Protocol]
    seen: Seen
    tls: bool = False

    @property
    def limits(self) -> ConnLimits:
        return self.protocol.limits

    async def connect(self, src: str = "127.0.0.1") -> Client:
        tls = None
        if self.tls:
            tls = ssl.create_default_context()
            tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(src, 0), ssl=tls)
        return Client(reader, writer)


@contextlib.asynccontextmanager
async def serving(deadline: float = DEADLINE, cap: int = 0, trusted: tuple[str, ...] = (),
                  keep_alive: int = 5, tls: tuple[Path, Path] | None = None) -> AsyncIterator[Server]:
    protocol = http_protocol(deadline, cap, parse_networks(trusted))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    seen = Seen()
    config = uvicorn.Config(make_app(seen), http=protocol, log_level="warning", lifespan="off",
                            timeout_keep_alive=keep_alive, timeout_graceful_shutdown=1,
                            ssl_certfile=tls and tls[0], ssl_keyfile=tls and tls[1])
    server = uvicorn.Server(config)
    task = asyncio.create_task(server._serve(sockets=[sock]))  # _serve: no signal handlers
    try:
        while not server.started:
            assert not task.done(), task.result()
            await asyncio.sleep(0.01)
        yield Server(sock.getsockname()[1], protocol, seen, tls is not None)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def trickle(self, data: bytes, every: float) -> None:
        """Send `data` a byte at a time; stop quietly when the server hangs up."""
        with contextlib.suppress(ConnectionError):
            for i in range(len(data)):
                await self.send(data[i:i + 1])
                await asyncio.sleep(every)

    async def response(self, timeout: float = 5) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
        status_line, *lines = head.decode().split("\r\n")[:-2]
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        body = await asyncio.wait_for(self.reader.readexactly(int(headers["content-length"])), timeout)
        return int(status_line.split()[1]), headers, body

    async def until_closed(self, timeout: float = 5) -> bytes:
        """Everything the server sends until it closes the connection (EOF or reset)."""
        data = b""
        with contextlib.suppress(ConnectionError):
            while chunk := await asyncio.wait_for(self.reader.read(65536), timeout):
                data += chunk
        return data

    def close(self) -> None:
        self.writer.close()


def request(path: str = "/", body: bytes = b"", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {len(body)}\r\n{extra}\r\n").encode() + body


def status_and_error(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    return int(head.split()[1]), json.loads(body)["error"]


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


# -- the deadline ----------------------------------------------------------------------------
def test_a_silent_connection_is_closed_after_the_deadline_without_a_response() -> None:
    async def main() -> None:
        async with serving() as srv:
            c = await srv.connect()
            t0 = time.monotonic()
            assert await c.until_closed() == b""  # nothing was asked, nothing is answered
            assert time.monotonic() - t0 >= DEADLINE - 0.05  # not before the deadline; by it: timed_out
            await until(lambda: srv.limits.stats().open == 0, 2)
            assert srv.limits.stats().timed_out == 1

    run(main())


def test_trickled_headers_get_a_408_and_the_connection_closed() -> None:
    async def main() -> None:
        async with serving() as srv:
            c = await srv.connect()
            t0 = time.monotonic()
            # A header byte every 50 ms: each one arrives, the request never completes in time.
            trickler = asyncio.create_task(c.trickle(request("/", extra="x-pad: " + "a" * 100 + "\r\n"), 0.05))
            data = await c.until_closed()
            elapsed = time.monotonic() - t0
            trickler.cancel()
            status, err = status_and_error(data)
            assert status == 408 and err["code"] == "request_timeout"
            assert elapsed >= DEADLINE - 0.05
            assert srv.seen.disconnects == []  # the app never saw a request
            assert srv.limits.stats().timed_out == 1

    run(main())


def test_a_trickled_body_is_dropped_and_the_app_sees_a_disconnect() -> None:
    async def main() -> None:
        async with serving() as srv:
            c = await srv.connect()
            t0 = time.monotonic()
            await c.send(request("/upload", b"")[:-2].replace(b"content-length: 0", b"content-length: 200") + b"\r\n")
            trickler = asyncio.create_task(c.trickle(b"x" * 200, 0.02))
            data = await c.until_closed()
            elapsed = time.monotonic() - t0
            trickler.cancel()
            assert status_and_error(data)[0] == 408
            assert elapsed >= DEADLINE - 0.05
            await until(lambda: srv.seen.disconnects == ["/upload"], 2)

    run(main())


def test_keep_alive_requests_each_get_the_deadline_again_and_a_slow_answer_is_not_cut() -> None:
    async def main() -> None:
        async with serving() as srv:
            c = await srv.connect()
            t0 = time.monotonic()
            for i in range(4):
                # Each request takes 0.3 s to arrive, 0.1 s after the previous answer: the
                # connection lives far beyond the deadline, each request within it.
                await asyncio.sleep(0.1)
                data = request("/", b"x" * (i + 1))
                await c.send(data[:10])
                await asyncio.sleep(0.3)
                await c.send(data[10:])
                status, _, body = await c.response()
                assert (status, json.loads(body)) == (200, {"n": i + 1})
            # The app takes twice the deadline to answer a complete request: not the client's time.
            await c.send(request(f"/slow?wait={2 * DEADLINE}", b"abc"))
            status, _, body = await c.response()
            assert (status, json.loads(body)) == (200, {"n": 3})
            assert time.monotonic() - t0 > 3 * DEADLINE
            assert srv.limits.stats().timed_out == 0
            c.close()

    run(main())


def test_the_deadline_runs_again_from_the_end_of_each_response() -> None:
    async def main() -> None:
        async with serving() as srv:
            c = await srv.connect()
            await c.send(request("/", b"hi"))
            assert (await c.response())[0] == 200
            t_end = time.monotonic()
            # The next request starts late and trickles: the clock started at the answer.
            await asyncio.sleep(0.3)
            trickler = asyncio.create_task(c.trickle(request("/"), 0.05))
            data = await c.until_closed()
            trickler.cancel()
            assert status_and_error(data)[0] == 408
            assert time.monotonic() - t_end >= DEADLINE - 0.05

            # A keep-alive connection that says nothing more is closed quietly.
            c = await srv.connect()
            await c.send(request("/", b"hi"))
            assert (await c.response())[0] == 200
            t_end = time.monotonic()
            assert await c.until_closed() == b""
            assert time.monotonic() - t_end >= DEADLINE - 0.05
            await until(lambda: srv.limits.stats().timed_out == 2, 2)  # the deadline closed it

    run(main())


def test_uvicorns_keep_alive_timeout_still_closes_idle_keep_alive_connections_first() -> None:
    async def main() -> None:
        async with serving(deadline=5, keep_alive=1) as srv:
            c = await srv.connect()
            await c.send(request("/", b"hi"))
            assert (await c.response())[0] == 200
            t_end = time.monotonic()
            assert await c.until_closed() == b""
            assert time.monotonic() - t_end >= 0.9  # uvicorn's 1 s, not the deadline: timed_out 0
            assert srv.limits.stats().timed_out == 0

    run(main())


def test_the_clock_stops_while_the_server_is_not_reading() -> None:
    async def main() -> None:
        async with serving() as srv:
            # A 1 MiB body sent at once while the app waits 3 deadlines before reading it
            # (uvicorn stops reading past 64 KiB): the client did its part, it is answered.
            c = await srv.connect()
            await c.send(request(f"/?wait={2 * DEADLINE}", b"x" * 2**20))
            status, _, body = await c.response()
            assert (status, json.loads(body)) == (200, {"n": 2**20})

            # A client waiting for "100 Continue" that the app only sends when it reads.
            c = await srv.connect()
            await c.send(request(f"/?wait={2 * DEADLINE}", extra="expect: 100-continue\r\n")
                         .replace(b"content-length: 0", b"content-length: 5"))
            interim = await asyncio.wait_for(c.reader.readuntil(b"\r\n\r\n"), 5)
            assert interim.startswith(b"HTTP/1.1 100 ")
            await c.send(b"hello")
            status, _, body = await c.response()
            assert (status, json.loads(body)) == (200, {"n": 5})
            assert srv.limits.stats().timed_out == 0

    run(main())


def test_a_client_that_does_not_read_its_answer_is_still_let_go() -> None:
    async def main() -> None:
        async with serving() as srv:
            c = await srv.connect()
            await c.send(request("/big"))  # 16 MiB that it never reads: close() alone would wait
            await until(lambda: srv.limits.stats().timed_out == 1, DEADLINE + SLACK)
            await until(lambda: srv.limits.stats().open == 0, ABORT_AFTER_S + SLACK)
            c.close()

    run(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_deadline_over_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)

    async def main() -> None:
        async with serving(tls=(cert, key)) as srv:
            c = await srv.connect()
            await c.send(request("/", b"hi"))
            assert (await c.response())[0] == 200
            t_end = time.monotonic()
            assert await c.until_closed() == b""
            assert time.monotonic() - t_end >= DEADLINE - 0.05
            await until(lambda: srv.limits.stats().timed_out == 1, 2)  # the deadline closed it

            c = await srv.connect()
            trickler = asyncio.create_task(c.trickle(request("/"), 0.05))
            assert status_and_error(await c.until_closed())[0] == 408  # delivered before the close
            trickler.cancel()

    run(main())


# -- the per-address cap -------------------------------------------------------------------------
def test_connections_beyond_the_cap_from_one_address_are_refused_at_once() -> None:
    async def main() -> None:
        async with serving(deadline=10, cap=3) as srv:
            held = [await srv.connect("127.0.0.2") for _ in range(3)]
            await until(lambda: srv.limits.stats().open == 3, 2)
            extra = await srv.connect("127.0.0.2")  # sends nothing: a 429 before the deadline's 408 is "at once"
            status, err = status_and_error(await extra.until_closed())
            assert status == 429 and err["code"] == "too_many_connections"
            assert srv.limits.stats().refused == 1

            # Another address is not affected, and the held ones still work.
            other = await srv.connect("127.0.0.3")
            await other.send(request("/", b"ok"))
            assert (await other.response())[0] == 200
            await held[0].send(request("/", b"ok"))
            assert (await held[0].response())[0] == 200

            # A closed connection frees its place.
            held.pop().close()
            await until(lambda: srv.limits.stats().open == 3, 2)  # 2 held + `other`
            again = await srv.connect("127.0.0.2")
            await again.send(request("/", b"ok"))
            assert (await again.response())[0] == 200
            assert srv.limits.stats().refused == 1
            for c in [*held, other, again]:
                c.close()
            await until(lambda: srv.limits.stats().open == 0, 2)

    run(main())


def test_trusted_proxies_are_exempt_from_the_cap() -> None:
    async def main() -> None:
        async with serving(deadline=10, cap=2, trusted=("127.0.0.4/32",)) as srv:
            proxy = [await srv.connect("127.0.0.4") for _ in range(6)]
            for c in proxy:
                await c.send(request("/", b"ok"))
            for c in proxy:
                assert (await c.response())[0] == 200
            assert srv.limits.stats().refused == 0
            # Everyone else still has the cap.
            _ = [await srv.connect("127.0.0.2") for _ in range(2)]
            status, _ = status_and_error(await (await srv.connect("127.0.0.2")).until_closed())
            assert status == 429

    run(main())


def test_no_cap_when_zero() -> None:
    async def main() -> None:
        async with serving(deadline=10, cap=0) as srv:
            conns = [await srv.connect("127.0.0.2") for _ in range(20)]
            await until(lambda: srv.limits.stats().open == 20, 2)
            await conns[-1].send(request("/", b"ok"))
            assert (await conns[-1].response())[0] == 200
            assert srv.limits.stats().refused == 0

    run(main())


# -- ConnLimits alone -----------------------------------------------------------------------
def test_limits_count_per_machine_and_release() -> None:
    limits = ConnLimits(1.0, 2, parse_networks(["10.0.0.0/24"]))
    # An IPv4 client seen through a dual-stack socket is the same machine.
    assert limits.admit("10.1.1.1") == "10.1.1.1"
    assert limits.admit("::ffff:10.1.1.1") == "10.1.1.1"
    assert limits.admit("10.1.1.1") is None
    assert limits.admit("::ffff:10.0.0.7") == "10.0.0.7"  # trusted, however written
    assert all(limits.admit("10.0.0.7") for _ in range(10))
    limits.release("10.1.1.1")
    assert limits.admit("10.1.1.1") == "10.1.1.1"
    s = limits.stats()
    assert (s.open, s.addresses, s.refused) == (2 + 11, 2, 1)
    assert ipaddress.ip_address("10.0.0.7") in limits.trusted[0]
