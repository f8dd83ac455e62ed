"""Fair shares through the engine thread (fake model): one client's backlog does not hold
up another client's first request."""

from __future__ import annotations

import asyncio

import pytest
from helpers.engines import collect, limits, run, started, turns_of
from helpers.fakes import FakeModel
from helpers.polling import until

from appliance.engine.engine import Engine, EngineOptions, Handle
from appliance.engine.events import Done
from appliance.errors import QueueFull
from appliance.sampling import SamplingParams

A, B = "10.0.0.1", "10.0.0.2"


async def finish_order(handles: list[Handle]) -> list[Handle]:
    order: list[Handle] = []

    async def one(h: Handle) -> None:
        _, end = await collect(h)
        assert isinstance(end, Done), end
        order.append(h)

    await asyncio.gather(*(one(h) for h in handles))
    return order


def waiting(eng: Engine, h: Handle) -> bool:
    return h.rid in eng.snapshot.waiting


@pytest.mark.parametrize("slots", [1, 2])
def test_a_backlog_of_20_does_not_delay_another_clients_first_request(slots: int) -> None:
    async def main() -> None:
        model = FakeModel(reply="x" * 200, delay=0.002)
        eng = await started(model, slots=slots, max_queue=32)
        turns = turns_of(eng)
        # a's first ones run long enough (150 steps) for b to be seen queued behind them.
        a = [eng.submit([1, 2, 3], SamplingParams(max_tokens=150 if i < slots else 8), client=A)
             for i in range(20)]
        await until(lambda: eng.snapshot.running == slots and len(eng.snapshot.waiting) == 20 - slots, every=0.001)
        b = eng.submit([4, 5, 6], SamplingParams(max_tokens=8), client=B)
        await until(lambda: waiting(eng, b), every=0.001)
        assert b.position == 1  # `: queued 1`, not 20 - slots + 1
        assert all(turns[h.rid].state.name != "WAITING" for h in a[:slots])
        order = await finish_order([*a, b])
        # Every slot was busy with a's: b took the next one that freed, before any of a's
        # queued requests (with 2 slots both free in the same step: b first, a[2] with it).
        assert order[:slots] == a[:slots]
        assert order[slots] is b
        assert turns[b.rid].admitted_at <= turns[a[slots].rid].admitted_at
        # No cap by default: every one of a's 20 got its answer, in a's own order.
        assert [h for h in order if h is not b] == a
        eng.stop()
    run(main())


def test_clients_take_turns_and_each_keeps_its_order() -> None:
    async def main() -> None:
        model = FakeModel(reply="y" * 20, delay=0.001)
        eng = await started(model, slots=1, max_queue=32)
        first = eng.submit([9], SamplingParams(max_tokens=20), client="z")
        await until(lambda: eng.snapshot.running == 1, every=0.001)
        a = [eng.submit([1], SamplingParams(max_tokens=3), client=A) for _ in range(4)]
        b = [eng.submit([2], SamplingParams(max_tokens=3), client=B) for _ in range(2)]
        order = await finish_order([first, *a, *b])
        assert order == [first, a[0], b[0], a[1], b[1], a[2], a[3]]
        eng.stop()
    run(main())


def test_max_per_client_counts_each_identity() -> None:
    async def main() -> None:
        model = FakeModel(reply="z" * 50, delay=0.002)
        eng = Engine(lambda: model, EngineOptions(limits(slots=1, max_queue=32), max_per_client=2))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        a = [eng.submit([1], SamplingParams(max_tokens=5), client=A) for _ in range(2)]
        with pytest.raises(QueueFull) as refused:
            eng.submit([1], SamplingParams(max_tokens=5), client=A)
        assert refused.value.status == 429
        b = eng.submit([2], SamplingParams(max_tokens=5), client=B)  # another identity: its own share
        assert set(await finish_order([*a, b])) == {*a, b}
        eng.stop()
    run(main())
