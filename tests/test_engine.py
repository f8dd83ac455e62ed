"""The engine thread with a fake model: batching, finishing, cancelling, failing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from appliance.engine import Engine, EngineState, Handle
from appliance.errors import QueueFull
from appliance.sampling import SamplingParams
from appliance.scheduler import Limits
from appliance.sequence import Delta, Done, Failed
from fakes import FakeModel


def limits(**kw: Any) -> Limits:
    base: dict[str, Any] = dict(slots=4, batch_tokens=64, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.0,
                                max_queue=8, queue_timeout_s=30.0)
    base.update(kw)
    return Limits(**base)


async def started(model: FakeModel, **kw: Any) -> Engine:
    eng = Engine(lambda: model, limits(**kw))
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 5)
    assert eng.state is EngineState.READY
    return eng


async def collect(h: Handle) -> tuple[str, Done | Failed]:
    text = []
    async for ev in h.events():
        if isinstance(ev, Delta):
            text.append(ev.text)
        else:
            return "".join(text), ev
    raise AssertionError("stream ended without Done/Failed")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_one_request_streams_reply_then_done() -> None:
    async def main() -> None:
        model = FakeModel(reply="hello")
        eng = await started(model)
        text, end = await collect(eng.submit([1, 2, 3], SamplingParams(max_tokens=50)))
        assert text == "hello"
        assert isinstance(end, Done) and end.finish_reason == "stop"
        assert (end.prompt_tokens, end.completion_tokens) == (3, 5)
        eng.stop()
        assert model.closed and not model.kv  # the finished sequence's cells are gone
    run(main())


def test_max_tokens_and_stop_strings() -> None:
    async def main() -> None:
        eng = await started(FakeModel(reply="abcdefghij"))
        text, end = await collect(eng.submit([1], SamplingParams(max_tokens=4)))
        assert (text, end.finish_reason) == ("abcd", "length")
        text, end = await collect(eng.submit([1], SamplingParams(max_tokens=50, stop=("def",))))
        assert (text, end.finish_reason) == ("abc", "stop")
        eng.stop()
    run(main())


def test_newcomer_joins_running_batch_at_next_step() -> None:
    async def main() -> None:
        model = FakeModel(reply="x" * 40, delay=0.01)
        eng = await started(model)
        a = eng.submit([5] * 4, SamplingParams(max_tokens=40))
        first = await a.events().__anext__()  # a is generating
        assert isinstance(first, Delta)
        b = eng.submit([7] * 6, SamplingParams(max_tokens=3))
        (ta, ea), (tb, eb) = await asyncio.gather(collect(a), collect(b))
        assert eb.finish_reason == "length" and len(tb) == 3
        # Some single decode call carried a's next token *and* b's whole prompt.
        # (b's prompt is six 7s; a's decode token is its last sampled 'x'.)
        mixed = [c for c in model.calls if c[0].count(7) == 6 and ord("x") in c[0]]
        assert mixed, "b's prefill was not batched with a's decode"
        assert eng.stats.peak_seqs_per_step == 2
        eng.stop()
    run(main())


def test_window_batches_requests_submitted_together() -> None:
    async def main() -> None:
        model = FakeModel(reply="yz")
        eng = Engine(lambda: model, limits(max_wait_s=0.2))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        hs = [eng.submit([3] * 5, SamplingParams(max_tokens=8)) for _ in range(4)]
        await asyncio.gather(*(collect(h) for h in hs))
        prefill_call = model.calls[1]  # [0] is the warm-up
        assert sorted(set(prefill_call[2])) == [0, 1, 2, 3] and len(prefill_call[0]) == 20
        eng.stop()
    run(main())


def test_cancel_while_generating_frees_slot_and_cache() -> None:
    async def main() -> None:
        model = FakeModel(reply="z" * 500)
        eng = await started(model, slots=1)
        h = eng.submit([1, 2], SamplingParams(max_tokens=500))
        await h.events().__anext__()
        h.cancel()
        _, end = await collect(h)
        assert isinstance(end, Done) and end.finish_reason == "cancelled"
        assert not eng.sched.running and eng.sched.n_free_slots == 1 and not model.kv
        text, end = await collect(eng.submit([1], SamplingParams(max_tokens=2)))
        assert text == "zz"  # the slot serves the next request
        eng.stop()
    run(main())


def test_cancel_while_queued() -> None:
    async def main() -> None:
        gate = threading.Event()
        model = FakeModel(reply="q" * 100)
        eng = await started(model, slots=1)
        model.gate = gate
        a = eng.submit([1], SamplingParams(max_tokens=100))
        b = eng.submit([2], SamplingParams(max_tokens=5))
        b.cancel()
        gate.set()
        _, end_b = await collect(b)
        assert isinstance(end_b, Done) and end_b.finish_reason == "cancelled" and end_b.completion_tokens == 0
        a.cancel()
        await collect(a)
        assert eng.n_active == 0
        eng.stop()
    run(main())


def test_decode_failure_fails_that_step_and_engine_keeps_serving() -> None:
    async def main() -> None:
        model = FakeModel(reply="ok", fail_on_call=1)  # call 0 is the warm-up
        eng = await started(model)
        _, end = await collect(eng.submit([1, 2], SamplingParams(max_tokens=5)))
        assert isinstance(end, Failed) and end.error.status == 500
        text, end = await collect(eng.submit([1, 2], SamplingParams(max_tokens=5)))
        assert text == "ok" and isinstance(end, Done)
        assert eng.sched.n_free_slots == 4
        eng.stop()
    run(main())


def test_full_queue_is_rejected_at_submit() -> None:
    async def main() -> None:
        gate = threading.Event()
        model = FakeModel(reply="w" * 50)
        eng = await started(model, slots=1, max_queue=2)
        model.gate = gate  # hold the engine inside decode
        hs = [eng.submit([1], SamplingParams(max_tokens=50)) for _ in range(2)]
        with pytest.raises(QueueFull):
            eng.submit([1], SamplingParams(max_tokens=5))
        gate.set()
        for h in hs:
            _, end = await collect(h)
            assert isinstance(end, Done)
        eng.stop()
    run(main())


def test_stop_fails_streams_still_running() -> None:
    async def main() -> None:
        model = FakeModel(reply="s" * 1000)
        eng = await started(model)
        h = eng.submit([1], SamplingParams(max_tokens=1000))
        await h.events().__anext__()
        await asyncio.to_thread(eng.stop)
        _, end = await collect(h)
        assert isinstance(end, Failed) and end.error.status == 503
    run(main())


def test_load_failure_is_reported_not_raised() -> None:
    async def main() -> None:
        def broken() -> FakeModel:
            raise RuntimeError("no such model")
        eng = Engine(broken, limits())
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        assert eng.state is EngineState.FAILED and "no such model" in eng.load_error
    run(main())
