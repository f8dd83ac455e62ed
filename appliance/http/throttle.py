"""Per-client throttles taken before any real work: a request rate, and how many requests
each client (and all together) may have being read, parsed and tokenized at once.
Both run on the event loop only (no locks); both forget clients that went quiet.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """A token bucket per client: `rate` requests per second, bursts of up to max(1, rate)."""

    FORGET_S = 60.0

    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._swept = clock()

    def check(self, client: str) -> int | None:
        """None if allowed (and counted), else whole seconds until the next request may come."""
        if self.rate <= 0:
            return None
        now = self.clock()
        self._sweep(now)
        b = self._buckets.get(client)
        if b is None:
            b = self._buckets[client] = _Bucket(self.burst, now)
        b.tokens = min(self.burst, b.tokens + (now - b.at) * self.rate)
        b.at = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - b.tokens) / self.rate))

    def _sweep(self, now: float) -> None:
        # A full bucket is the same as no bucket: drop those, so idle clients cost nothing.
        if now - self._swept < self.FORGET_S:
            return
        self._swept = now
        full = now - self.burst / self.rate
        self._buckets = {k: b for k, b in self._buckets.items() if b.at > full}


class ParseGate:
    """At most `per_client` of one client's requests being read, parsed and tokenized at once
    (its own places), and at most `total` being parsed and tokenized in all (the shared pool).

    A body is read under the client's own places only; the shared pool is taken once the
    body is in. A client that trickles its bodies (a phone on weak Wi-Fi, or on purpose) so
    holds nothing another client needs: four slow senders from two addresses held all four
    shared places for the whole 30 s request deadline when the pool was taken first, and
    another client's first token took 29.1 s instead of 0.13 s. Memory for bodies being
    read is bounded per client by per_client x the body limit (4 MiB), and per address by
    the connection cap. Waiting is FIFO; a client over its share waits for its own turn
    before it takes a place in the shared pool, so it cannot crowd others out."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self._shared = asyncio.Semaphore(total)
        self._mine: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}  # client -> (semaphore, [users])
        self.busy = 0  # shared places held right now (for /health and tests)
        self.reading = 0  # own places held by requests not in the pool (mostly: bodies arriving)

    @asynccontextmanager
    async def own(self, client: str) -> AsyncIterator[None]:
        """One of the client's own places, for its body and its parse."""
        sem, users = self._mine.setdefault(client, (asyncio.Semaphore(self.per_client), [0]))
        users[0] += 1
        try:
            async with sem:
                self.reading += 1
                try:
                    yield
                finally:
                    self.reading -= 1
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._mine[client]

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """A place in the shared pool, for the CPU work of parsing and tokenizing; taken inside `own`."""
        async with self._shared:
            self.busy += 1
            self.reading -= 1
            try:
                yield
            finally:
                self.reading += 1
                self.busy -= 1

    @asynccontextmanager
    async def permit(self, client: str) -> AsyncIterator[None]:
        """Both at once, for work whose input is already read."""
        async with self.own(client), self.shared():
            yield
