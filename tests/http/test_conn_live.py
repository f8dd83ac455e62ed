"""Idle sockets against the real appliance: 500 from one address and 500 more from ten others
do not keep anyone out and are all closed by the server, the ones beyond
max_conns_per_client at once, the rest after request_deadline_s."""

from __future__ import annotations

import os
import resource
import select
import socket
import time
from pathlib import Path

import pytest
from helpers.live import Live, start

pytestmark = pytest.mark.integration

# Long enough that opening the 1,001 sockets (half of it) and the checks below fit before it on
# a machine kept busy by neighbours (3 s left 1.5 s to open them); the test checks the server,
# not this machine's pace.
DEADLINE = 8.0
CAP = 64  # the default max_conns_per_client


def open_idle(port: int, src: str, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        socks.append(s)
    return socks


_received: dict[socket.socket, bytes] = {}  # what a still-open socket has sent so far
_ended: dict[socket.socket, bytes] = {}  # what a closed socket sent in all


def closed_by_server(socks: list[socket.socket]) -> list[bytes | None]:
    """Per socket: what the server sent before closing it, or None while it is still open.

    Bytes are remembered across calls: a 408 is written one loop turn before the FIN, and a
    socket closed at an earlier call reads as empty at a later one."""
    poll = select.poll()  # select() stops at descriptor 1024
    for s in socks:
        if s not in _ended:
            poll.register(s, select.POLLIN)
    ready = {fd for fd, _ in poll.poll(0)}
    out: list[bytes | None] = []
    for s in socks:
        if s in _ended:
            out.append(_ended[s])
            continue
        if s.fileno() not in ready:
            out.append(None)
            continue
        data = _received.pop(s, b"")
        try:
            while chunk := s.recv(65536):
                data += chunk
        except BlockingIOError:
            _received[s] = data  # data but no end yet
            out.append(None)
            continue
        except ConnectionResetError:
            pass
        _ended[s] = data
        out.append(data)
    return out


def fds(live: Live) -> int:
    return len(os.listdir(f"/proc/{live.proc.pid}/fd"))


def test_idle_sockets_neither_exhaust_the_server_nor_stay_open(bundled_model: Path, tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:  # the server inherits this too
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    live = start(bundled_model, tmp_path, "--request-deadline-s", str(DEADLINE), "--slots", "2",
                 "--kv-tokens", "4096", "--ctx-per-slot", "1024", "--cached-sessions", "2")
    socks: list[socket.socket] = []
    try:
        live.wait_ready()
        before = fds(live)
        t0 = time.monotonic()
        one = open_idle(live.port, "127.0.0.5", 500)
        many = [s for i in range(10) for s in open_idle(live.port, f"127.0.0.{6 + i}", 50)]
        # And one that starts a chat request and stops half-way through the body.
        half = socket.create_connection(("127.0.0.1", live.port), source_address=("127.0.0.20", 0))
        half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     b"content-length: 200\r\n\r\n{\"messages\": [")
        half.setblocking(False)
        socks = one + many + [half]
        opened = time.monotonic()
        assert opened - t0 < DEADLINE / 2, "opening the sockets took too long for this test"

        # Beyond the cap from 127.0.0.5: refused at once with a 429; everything else held.
        time.sleep(0.5)
        state = closed_by_server(one)
        refused = [d for d in state if d is not None]
        assert len(refused) == 500 - CAP
        assert all(d.startswith(b"HTTP/1.1 429 ") for d in refused)
        assert all(d is None for d in closed_by_server(many))
        assert fds(live) - before <= CAP + 500 + 8  # the held sockets, not all 1,000

        # The server answers everyone else meanwhile.
        r = live.client.get("/health")  # before the deadline (checked below): not starved by the held sockets
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert sum(d is None for d in closed_by_server(socks)) == CAP + 500 + 1  # the held ones, still open
        assert time.monotonic() - opened < DEADLINE - 0.5, "the checks took longer than the deadline"
        r = live.chat([{"role": "user", "content": "Say hi."}], max_tokens=2)
        assert r.status_code == 200, r.text

        # After the deadline every held socket is closed by the server, without a response.
        first_close = None
        state = closed_by_server(socks)
        while None in state and time.monotonic() - t0 < DEADLINE + 5:
            if first_close is None and state.count(None) < CAP + 500 + 1:
                first_close = time.monotonic()
            time.sleep(0.05)
            state = closed_by_server(socks)
        still_open = state.count(None)
        assert still_open == 0, f"{still_open} sockets still open {time.monotonic() - t0:.1f} s after opening"
        assert first_close is None or first_close - t0 >= DEADLINE - 0.1  # not before the deadline
        assert state[500:-1] == [b""] * 500
        assert (state[-1] or b"").startswith(b"HTTP/1.1 408 "), state[-1]

        for s in socks:
            s.close()
        socks = []
        time.sleep(0.2)
        assert fds(live) <= before + 2
        assert live.client.get("/health").status_code == 200
    finally:
        for s in socks:
            s.close()
        _received.clear()
        _ended.clear()
        code = live.stop()
    log = live.log()
    assert code == 0, log[-3000:]
    # The half-sent body makes the app's body reader raise ClientDisconnect, which server.py does
    # not catch yet: two tracebacks (its own and uvicorn's). Any other traceback is a failure.
    assert log.count("Traceback") == log.count("starlette.requests.ClientDisconnect") <= 2
    assert "past request_deadline_s" in log  # the info line with the counts
