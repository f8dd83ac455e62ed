"""appliance.http.conn: the header bounds hold however the bytes arrive, and an answer its
client does not read is cut after `stall_s`, on a real uvicorn server on a loopback port
with raw sockets as clients."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from helpers.polling import until

from appliance.http.conn import MAX_HEADER_BYTES, MAX_HEADERS, ConnLimits, http_protocol

BIG = 32 * 2**20  # an answer far larger than the socket buffers: it cannot all sit in the kernel


@dataclass
class Seen:
    answered: list[str] = field(default_factory=list)  # paths whose answer was sent whole
    left: list[str] = field(default_factory=list)  # paths whose client was seen leaving


def make_app(seen: Seen) -> Callable[..., Awaitable[None]]:
    """Reads the whole body and answers {"n": its length}; `/big` streams BIG bytes in 64 KiB
    pieces, watching for the client leaving."""

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        n, more = 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                seen.left.append(scope["path"])
                return
            n += len(msg["body"])
            more = msg["more_body"]
        if scope["path"] == "/big":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(BIG).encode())]})
            piece = b"x" * 65536
            gone = asyncio.ensure_future(receive())  # http.disconnect once the client is gone
            for _ in range(BIG // len(piece)):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                if gone.done():
                    seen.left.append(scope["path"])
                    return
            gone.cancel()
            await send({"type": "http.response.body", "body": b""})
            seen.answered.append(scope["path"])
            return
        body = json.dumps({"n": n}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        seen.answered.append(scope["path"])

    return app


@dataclass
class Server:
    port: int
    limits: ConnLimits
    seen: Seen

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@contextlib.asynccontextmanager
async def serving(stall_s: float = 120.0) -> AsyncIterator[Server]:
    protocol = http_protocol(30.0, 0, (), stall_s)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    seen = Seen()
    config = uvicorn.Config(make_app(seen), http=protocol, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server._serve(sockets=[sock]))  # _serve: no signal handlers
    try:
        await until(lambda: server.started or task.done(), 10, "the server to start")
        assert not task.done(), task.result()
        yield Server(sock.getsockname()[1], protocol.limits, seen)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def request(path: str = "/", headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: x", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def status_of(server: Server, data: bytes, piece: int | None = None) -> int:
    """The status the server answers `data` with, sent in one write or in pieces of `piece` bytes."""
    reader, writer = await server.connect()
    try:
        with contextlib.suppress(ConnectionError):
            for i in range(0, len(data), piece or len(data)):
                writer.write(data[i:i + (piece or len(data))])
                await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split()[1])
    finally:
        writer.close()


def sync(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test on a fresh event loop, bounded (the file's other tests do the same)."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 60))  # type: ignore[arg-type]
    return run


LARGE = [("x-large", "a" * 64 * 1024)]  # one 64 KiB header
MANY = [(f"x-h{i}", "1") for i in range(10_000)]  # 10,000 headers, about 100 KiB


@pytest.mark.parametrize("headers", [LARGE, MANY], ids=["64 KiB header", "10,000 headers"])
@pytest.mark.parametrize("piece", [None, 4096, 1000], ids=["one write", "4 KiB pieces", "1,000-byte pieces"])
@sync
async def test_a_header_over_the_bounds_is_refused_however_its_bytes_arrive(headers: list[tuple[str, str]],
                                                                            piece: int | None) -> None:
    async with serving() as server:
        assert await status_of(server, request(headers=headers), piece) == 431
        assert server.limits.stats().oversized == 1
        assert server.seen.answered == []  # the app never saw it


@sync
async def test_headers_up_to_the_bounds_are_served() -> None:
    # MAX_HEADERS lines in all (two are host and content-length), and a header block of
    # nearly MAX_HEADER_BYTES sent in pieces whose boundaries fall inside the terminator.
    at_count = [(f"x-h{i}", "1") for i in range(MAX_HEADERS - 2)]
    filler = "b" * (MAX_HEADER_BYTES - 200)
    async with serving() as server:
        assert await status_of(server, request(headers=at_count)) == 200
        assert await status_of(server, request(headers=at_count + [("x-one-more", "1")])) == 431
        assert await status_of(server, request(headers=[("x-fill", filler)], body=b"{}"), piece=7) == 200
        assert server.limits.stats().oversized == 1


@sync
async def test_a_body_sent_with_the_headers_does_not_count_as_headers() -> None:
    async with serving() as server:
        assert await status_of(server, request(body=b"y" * 200_000)) == 200
        assert server.seen.answered == ["/"]


@sync
async def test_a_pipelined_request_is_held_to_the_same_bounds() -> None:
    async with serving() as server:
        reader, writer = await server.connect()
        writer.write(request("/first") + request("/second", headers=LARGE))
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert first.startswith(b"HTTP/1.1 200")
        rest = await asyncio.wait_for(reader.read(), 10)  # the first's body, then the 431 and EOF
        assert b"HTTP/1.1 431" in rest
        writer.close()
        assert server.seen.answered == ["/first"]


@sync
async def test_an_answer_its_client_does_not_read_is_cut_after_the_stall_time() -> None:
    async with serving(stall_s=0.3) as server:
        reader, writer = await server.connect()
        writer.write(request("/big"))
        await writer.drain()
        # The client reads nothing: the send buffer fills, the clock runs out, the connection
        # is aborted and the app hears that its client left.
        await until(lambda: server.limits.stats().stalled == 1, 20, "the unread answer to be cut")
        await until(lambda: server.seen.left or server.seen.answered, 20, "the app to stop sending")
        assert server.seen.left == ["/big"] and server.seen.answered == []  # cut, not finished
        got = 0
        with contextlib.suppress(ConnectionError):
            while chunk := await asyncio.wait_for(reader.read(2**20), 10):
                got += len(chunk)
        writer.close()
        assert got < BIG  # what the kernel had buffered, then the end


@sync
async def test_a_client_that_reads_its_answer_is_never_cut() -> None:
    async with serving(stall_s=0.3) as server:
        reader, writer = await server.connect()
        writer.write(request("/big"))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        got = 0
        while got < BIG:
            got += len(await asyncio.wait_for(reader.read(2**20), 10))
        writer.close()
        await until(lambda: server.seen.answered == ["/big"], 10, "the answer to be sent whole")
        assert server.limits.stats().stalled == 0
