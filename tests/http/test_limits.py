"""Per-client limits before any work: the parse gate (shares and FIFO) and the rate limiter."""

from __future__ import annotations

import asyncio

from appliance.http.throttle import ParseGate, RateLimiter


def test_parse_gate_caps_each_client_and_all_together() -> None:
    async def run() -> list[tuple[str, int, int]]:
        gate = ParseGate(total=3, per_client=2)
        seen: list[tuple[str, int, int]] = []
        inside: dict[str, int] = {}

        async def work(client: str) -> None:
            async with gate.permit(client):
                inside[client] = inside.get(client, 0) + 1
                seen.append((client, inside[client], gate.busy))
                await asyncio.sleep(0.01)
                inside[client] -= 1

        await asyncio.gather(*(work("a") for _ in range(6)), *(work("b") for _ in range(3)))
        assert gate.busy == 0 and not gate._mine  # nothing left behind
        return seen

    seen = asyncio.run(run())
    assert len(seen) == 9
    assert max(n for _, n, _ in seen) == 2  # never more than 2 of one client at once
    assert max(busy for _, _, busy in seen) == 3  # never more than 3 in all
    # b's first request did not wait behind all six of a's.
    assert [c for c, _, _ in seen].index("b") < 3


def test_rate_limiter_bucket_and_forgetting() -> None:
    now = [0.0]
    r = RateLimiter(2.0, lambda: now[0])
    assert [r.check("a") for _ in range(3)] == [None, None, 1]
    assert r.check("b") is None
    now[0] += 0.5
    assert r.check("a") is None and r.check("a") == 1
    now[0] += 120
    r.check("c")
    assert set(r._buckets) == {"c"}  # idle, refilled buckets are forgotten
    assert RateLimiter(0, lambda: 0.0).check("a") is None  # off


def test_slow_rates_wait_whole_seconds() -> None:
    now = [0.0]
    r = RateLimiter(0.2, lambda: now[0])
    assert r.check("a") is None
    assert r.check("a") == 5


def test_a_body_being_read_holds_only_its_own_clients_places() -> None:
    """Slow senders (their bodies still arriving) fill their own places and wait there; the
    shared pool stays free for everyone else, and a slow client's next request waits behind
    its own, not anyone else's."""
    async def run() -> None:
        gate = ParseGate(total=4, per_client=2)
        arriving = asyncio.Event()  # the slow bodies never finish during the test
        held: list[str] = []

        async def slow(client: str) -> None:
            async with gate.own(client):
                held.append(client)
                await arriving.wait()  # reading a trickled body
                async with gate.shared():
                    pass

        slowpokes = [asyncio.create_task(slow(c)) for c in ("mallory", "mallory", "trudy", "trudy", "mallory")]
        while len(held) < 4:
            await asyncio.sleep(0)
        assert gate.busy == 0 and gate.reading == 4
        done = []
        for _ in range(8):  # another client, one request after another: never waits on them
            async with gate.own("alice"), gate.shared():
                assert gate.busy == 1
                done.append(1)
        assert len(done) == 8 and held.count("mallory") == 2  # the fifth waits on mallory's own places
        arriving.set()
        await asyncio.gather(*slowpokes)
        assert gate.busy == 0 and gate.reading == 0 and not gate._mine

    asyncio.run(asyncio.wait_for(run(), 10))
