"""Connection-level limits: a deadline for each request's headers and body, and a cap on
open connections per client address.

uvicorn times nothing between accepting a connection and the end of a request body (its
keep-alive timeout only runs between requests, after a response), so a client that opens
sockets and sends nothing, or trickles a header line a minute, holds a file descriptor for
ever. `http_protocol` returns uvicorn's h11 protocol with two additions, for
`uvicorn.Config(http=...)`:

- **Deadline.** A request's headers and body must arrive within `deadline_s` of the
  connection opening and, on a keep-alive connection, of the end of the previous response.
  The clock only runs while the server waits for the client: it stops once the body is
  complete, and while the server itself is not reading (the app has not yet asked for more
  of a large body, say while it waits for a parse slot; or a client waits for
  `100 Continue`), so nobody is dropped for the server's own slowness. When it runs out the
  connection is closed, after a 408 if a request had begun and no response has started.
  uvicorn's keep-alive timeout still closes idle keep-alive connections first.
- **Cap.** At most `max_per_address` open connections per peer address (0 = no cap); one
  more is answered 429 and closed at once, before anything is read. Peers in `trusted` (the
  `trusted_proxies`, which carry many clients' connections) are exempt.
- **Headers.** A request's line and headers may take at most `MAX_HEADER_BYTES` and
  `MAX_HEADERS` lines however the bytes arrive: h11 bounds only a header block that is still
  incomplete, so a 64 KiB header sent in one write was served while the same bytes in 4 KiB
  pieces were a 400. Over either, a 431 and the connection closed.
- **Unread answers.** A response whose client takes none of it for `stall_s` (the send
  buffer full, 64 KiB, and not drained) is cut: the connection is aborted, which frees the
  buffer and tells the app the client left (its answer is cancelled at the next step).
  A client reading one byte a second otherwise held its connection and its buffered answer
  without bound.

The address here is the TCP peer, not the client identity of `identity.py`: what is limited
is sockets, and behind a proxy those are the proxy's. One `ConnLimits` per server holds the
counts (`protocol.limits`); every dropped connection is one debug line (address only,
never request content) and the totals are logged at info at most once a minute.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from dataclasses import dataclass
from typing import ClassVar

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from appliance.http.identity import Network

log = logging.getLogger(__name__)

SUMMARY_EVERY_S = 60.0
ABORT_AFTER_S = 1.0  # a closed connection whose client does not take the last bytes
# h11's own bound on an incomplete header block (uvicorn keeps its default), now also for a
# complete one; and Python's http.client's cap on header lines (_MAXHEADERS).
MAX_HEADER_BYTES = 16 * 1024
MAX_HEADERS = 100


def _response(status: str, error_type: str, code: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}connection: close\r\n\r\n")
    return head.encode("ascii") + body


def _normal_address(host: str) -> tuple[str, ipaddress.IPv4Address | ipaddress.IPv6Address | None]:
    """The peer address as one key per machine: '::ffff:10.0.0.5' is 10.0.0.5."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host, None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), ip


@dataclass
class ConnStats:
    open: int  # connections counted against the cap now
    addresses: int  # distinct addresses with an open counted connection
    timed_out: int  # closed by the deadline, since start
    refused: int  # closed at once over the per-address cap, since start
    oversized: int = 0  # 431: headers over MAX_HEADER_BYTES or MAX_HEADERS, since start
    stalled: int = 0  # cut: the client read none of its answer for stall_s, since start


class ConnLimits:
    """The per-server state: open connections per address and the drop counters."""

    def __init__(self, deadline_s: float, max_per_address: int, trusted: tuple[Network, ...],
                 stall_s: float = 120.0) -> None:
        if deadline_s <= 0 or stall_s <= 0:
            raise ValueError("deadline_s and stall_s must be > 0")
        if max_per_address < 0:
            raise ValueError("max_per_address must be >= 0")
        self.deadline_s = deadline_s
        self.stall_s = stall_s
        self.max_per_address = max_per_address
        self.trusted = trusted
        self._open: dict[str, int] = {}
        self.timed_out = 0
        self.refused = 0
        self.oversized = 0
        self.stalled = 0
        self._logged = (0, 0, 0, 0)
        self._logged_at = float("-inf")

    def admit(self, host: str) -> str | None:
        """Count a new connection from `host`: its key for `release`, or None when over the cap."""
        key, ip = _normal_address(host)
        if self.max_per_address and not (ip is not None and any(ip in net for net in self.trusted)):
            if self._open.get(key, 0) >= self.max_per_address:
                self.refused += 1
                log.debug("connection from %s refused: %d open (max_conns_per_client)", key, self._open[key])
                self._summary()
                return None
        self._open[key] = self._open.get(key, 0) + 1
        return key

    def release(self, key: str) -> None:
        n = self._open.get(key, 0) - 1
        if n > 0:
            self._open[key] = n
        else:
            self._open.pop(key, None)

    def timed_out_one(self, key: str | None, had_request: bool) -> None:
        self.timed_out += 1
        log.debug("connection from %s closed: %s within %g s (request_deadline_s)", key or "?",
                  "request not complete" if had_request else "no request", self.deadline_s)
        self._summary()

    def oversized_one(self, key: str | None, why: str) -> None:
        self.oversized += 1
        log.debug("connection from %s closed: %s", key or "?", why)
        self._summary()

    def stalled_one(self, key: str | None) -> None:
        self.stalled += 1
        log.debug("connection from %s cut: its answer was not read for %g s (response_stall_s)", key or "?",
                  self.stall_s)
        self._summary()

    def stats(self) -> ConnStats:
        return ConnStats(open=sum(self._open.values()), addresses=len(self._open),
                         timed_out=self.timed_out, refused=self.refused, oversized=self.oversized,
                         stalled=self.stalled)

    def _summary(self) -> None:
        now = time.monotonic()
        counts = (self.timed_out, self.refused, self.oversized, self.stalled)
        if now - self._logged_at < SUMMARY_EVERY_S or counts == self._logged:
            return
        self._logged_at, self._logged = now, counts
        log.info("connections closed since start: %d past request_deadline_s, %d over max_conns_per_client, "
                 "%d with headers too large, %d whose answer went unread for response_stall_s", *counts)


class _Flow(FlowControl):
    """uvicorn's flow control, telling the protocol when the server stops or resumes reading."""

    def __init__(self, transport: asyncio.Transport, changed: GuardedH11Protocol) -> None:
        super().__init__(transport)
        self._changed = changed

    def pause_reading(self) -> None:
        super().pause_reading()
        self._changed.update_clock()

    def resume_reading(self) -> None:
        super().resume_reading()
        self._changed.update_clock()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._changed.writing_paused(True)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._changed.writing_paused(False)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadline and the per-address cap of `limits`."""

    limits: ClassVar[ConnLimits]

    _key: str | None = None  # counted under this address
    _timer: asyncio.TimerHandle | None = None
    _left = 0.0  # seconds left on the clock for the current request
    _since = 0.0  # loop time the clock last started
    _begun = False  # bytes of the current request have arrived
    _lost = False
    _head: bytearray | None = None  # the current request's header bytes so far; None once they ended
    _stall: asyncio.TimerHandle | None = None  # runs while the client reads none of its answer

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self)
        if self.client is not None:
            self._key = self.limits.admit(self.client[0])
            if self._key is None:
                transport.write(_response("429 Too Many Requests", "rate_limit_error", "too_many_connections",
                                          "too many open connections from this address (max_conns_per_client)",
                                          "retry-after: 1\r\n"))
                transport.abort()  # at once: the point is to free the descriptor
                return
        self._restart_clock()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._stop_timer()
        self.writing_paused(False)
        if self._key is not None:
            self.limits.release(self._key)
            self._key = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._begun = True
        if self._head is not None and not self._headers_fit(data):
            return
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        self.update_clock()

    def on_response_complete(self) -> None:
        # Before uvicorn's: it may go on to a pipelined request that is already complete.
        self._restart_clock()
        super().on_response_complete()
        self.update_clock()

    def _should_upgrade_to_ws(self) -> bool:
        return False  # no websocket routes; an upgrade would leave this class uncounted

    # -- the header bounds --------------------------------------------------------------------
    def _headers_fit(self, data: bytes) -> bool:
        """Count `data` into the current request's header block; False (431 sent, closing)
        when the block is over the bounds. Only the header bytes are kept, at most
        MAX_HEADER_BYTES + 4, so the cost is bounded whatever arrives."""
        head = self._head
        assert head is not None
        start = max(0, len(head) - 3)  # the terminator may straddle two writes
        head += data[: MAX_HEADER_BYTES + 4 - len(head)]
        end = head.find(b"\r\n\r\n", start)
        block = head if end < 0 else head[:end]
        if len(block) > MAX_HEADER_BYTES:
            return self._refuse_headers(f"request headers over {MAX_HEADER_BYTES} bytes")
        if block.count(b"\n") > MAX_HEADERS:  # the request line's end, then one per header line
            return self._refuse_headers(f"more than {MAX_HEADERS} request headers")
        if end >= 0:
            self._head = None  # complete and within bounds: the rest is body or the next request
        return True

    def _refuse_headers(self, why: str) -> bool:
        self._head = None
        self.limits.oversized_one(self._key, why)
        self.transport.write(_response("431 Request Header Fields Too Large", "invalid_request_error",
                                       "headers_too_large", f"{why} (at most {MAX_HEADERS} lines, "
                                       f"{MAX_HEADER_BYTES} bytes)"))
        self.transport.close()
        self.loop.call_later(ABORT_AFTER_S, self._abort)
        return False

    # -- unread answers -------------------------------------------------------------------------
    def writing_paused(self, paused: bool) -> None:
        """The send buffer filled (paused) or drained: start or stop the stall clock."""
        if paused and self._stall is None and not self._lost:
            self._stall = self.loop.call_later(self.limits.stall_s, self._stalled)
        elif not paused and self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        self._stall = None
        if self._lost:
            return
        self.limits.stalled_one(self._key)
        self.transport.abort()  # close() would wait for a client that does not read

    # -- the clock --------------------------------------------------------------------------
    def _waiting_for_client(self) -> bool:
        if self._lost or self.transport.is_closing():
            return False
        if self.flow.read_paused:
            return False  # the server is not reading: not the client's time
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return True  # waiting for a request's headers
        if cycle.waiting_for_100_continue:
            return False  # the client waits for us
        return cycle.more_body

    def update_clock(self) -> None:
        """Start or stop the clock as the connection starts or stops waiting for the client."""
        waiting = self._waiting_for_client()
        if waiting and self._timer is None:
            self._since = self.loop.time()
            self._timer = self.loop.call_at(self._since + self._left, self._expired)
        elif not waiting and self._timer is not None:
            self._stop_timer()
            self._left -= self.loop.time() - self._since

    def _restart_clock(self) -> None:
        self._stop_timer()
        self._left = self.limits.deadline_s
        pipelined = bytes(self.conn.trailing_data[0])  # a pipelined request already buffered
        self._begun = bool(pipelined)
        self._head = bytearray()
        if pipelined and not self._headers_fit(pipelined):
            return
        self.update_clock()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        responding = cycle is not None and cycle.response_started and not cycle.response_complete
        if self._begun and not responding:
            self.transport.write(_response("408 Request Timeout", "invalid_request_error", "request_timeout",
                                           f"the request did not arrive within {self.limits.deadline_s:g} s"))
        self.limits.timed_out_one(self._key, self._begun)
        # close() sends what is buffered (the 408; over TLS, close_notify too), but waits for a
        # client that does not read: abort() soon after keeps the descriptor from staying.
        self.transport.close()
        self.loop.call_later(ABORT_AFTER_S, self._abort)

    def _abort(self) -> None:
        if not self._lost:
            self.transport.abort()


def http_protocol(deadline_s: float, max_per_address: int, trusted: tuple[Network, ...],
                  stall_s: float = 120.0) -> type[GuardedH11Protocol]:
    """A protocol class for `uvicorn.Config(http=...)`, with its own `ConnLimits`: call once per server."""
    shared = ConnLimits(deadline_s, max_per_address, trusted, stall_s)

    class Protocol(GuardedH11Protocol):
        limits = shared

    return Protocol
