"""Malformed HTTP on a raw socket against the real appliance: truncated requests, broken
chunked encoding, header floods, invalid UTF-8 in headers and bodies. Each gets a clean 4xx
or a closed connection, never a 5xx or a hang, and the server keeps serving."""

from __future__ import annotations

import socket
import time

import pytest
from helpers.live import Live

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
BODY = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}'


def exchange(port: int, data: bytes, half_close: bool = True, timeout: float = 10) -> bytes:
    """Send `data`, optionally end our side, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server gave up on us before we finished: allowed
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                part = s.recv(65536)
            except ConnectionResetError:  # closed while our bytes were unread: a reset after the answer
                return out
            except TimeoutError:
                break
            if not part:
                return out
            out += part
        raise AssertionError(f"the server neither answered nor closed within {timeout} s: {out[:200]!r}")


def status(reply: bytes) -> int | None:
    """The reply's status, or None for a connection closed without a response."""
    if not reply:
        return None
    assert reply.startswith(b"HTTP/1.1 "), reply[:200]
    return int(reply[9:12])


def clean(reply: bytes, *, answered: bool = False) -> int | None:
    code = status(reply)
    assert code is not None or not answered, "closed without an answer"
    assert code is None or 400 <= code < 500, reply[:400]
    return code


CASES: dict[str, tuple[bytes, bool]] = {
    # name: (bytes sent, must it be answered with a 4xx rather than just closed)
    "truncated request line": (b"POST /v1/chat/completions HTT", False),
    "truncated headers": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le", False),
    "truncated body": (CHAT + b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n" + BODY[:20], False),
    "truncated chunked body": (CHAT + b"Transfer-Encoding: chunked\r\n\r\n10\r\n" + BODY[:5], False),
    "chunk size not hex": (CHAT + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n", True),
    "chunk longer than its size": (CHAT + b"Transfer-Encoding: chunked\r\n\r\n5\r\n" + BODY + b"\r\n0\r\n\r\n", True),
    "chunk size overflow": (CHAT + b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\nabc\r\n0\r\n\r\n", True),
    "chunked and content-length": (CHAT + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n", True),
    "unknown transfer-encoding": (CHAT + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", True),
    "negative content-length": (CHAT + b"Content-Length: -5\r\n\r\n" + BODY, True),
    "header flood (count)": (CHAT + b"".join(b"X-H%d: v\r\n" % i for i in range(5000)) + b"\r\n", True),
    "header flood (one huge)": (CHAT + b"X-Big: " + b"a" * 200_000 + b"\r\n\r\n", True),
    "NUL in a header": (CHAT + b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n", True),
    "invalid UTF-8 header name": (CHAT + b"X-\xff\xfe: v\r\nContent-Length: 0\r\n\r\n", True),
    "invalid UTF-8 in Host": (b"GET /health HTTP/1.1\r\nHost: \xff\xfe.example\r\nConnection: close\r\n\r\n", True),
    "invalid UTF-8 in the path": (b"GET /v1/\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", True),
    "invalid UTF-8 session id": (CHAT + b"X-Session-Id: \xff\xfe" + b"a" * 30 + b"\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY, True),
    "invalid UTF-8 API key": (CHAT + b"Authorization: Bearer \xff\xfe\xfd\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 0\r\n\r\n", True),
    "invalid UTF-8 Origin": (CHAT + b"Origin: http://\xff\xfe\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY, True),
}
BAD_BODIES = [
    b'{"messages":[{"role":"user","content":"\xff\xfe"}]}',
    b'{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}',  # an encoded lone surrogate
    b'{"messages":[{"role":"us\xc3',  # cut inside a UTF-8 sequence
    b"\xef\xbb\xbf\xff" * 100,
]


def test_malformed_http_gets_a_4xx_or_a_close_and_the_server_keeps_serving(server: Live,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    logged = len(server.log())
    t0 = time.monotonic()
    results = {name: clean(exchange(server.port, data), answered=answered) for name, (data, answered) in CASES.items()}
    for path in (b"/v1/chat/completions", b"/v1/completions", b"/api/chat", b"/api/generate", b"/infill"):
        for body in BAD_BODIES:
            req = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % (path, len(body)) + body)
            results[f"{path.decode()} {body[:12]!r}"] = clean(exchange(server.port, req), answered=True)
    with capsys.disabled():
        print(f"\nraw socket: {len(results)} malformed requests in {time.monotonic() - t0:.1f} s: "
              f"{sum(r is None for r in results.values())} closed, the rest answered "
              f"{sorted({r for r in results.values() if r})}")

    # Still serving: a real answer on a fresh connection, and nothing crashed in between.
    r = server.chat([{"role": "user", "content": "Say OK."}], max_tokens=2, temperature=0)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert server.health()["status"] == "ok"
    log = server.log()[logged:]
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
