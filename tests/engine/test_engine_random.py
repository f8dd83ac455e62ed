"""Randomised workloads against the engine with the fake model: many sessions on few slots
and sequence ids, shared prefixes, edits, cancels at any point, deletes, parking, KV
pressure. The fake model asserts that every decode continues each sequence's positions
exactly, so any KV bookkeeping slip fails loudly. Afterwards nothing may be left running,
leaked or inconsistent."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from helpers.fakes import FakeModel

from appliance.engine.engine import Engine, EngineOptions, EngineState, Handle
from appliance.engine.events import Delta, Done, Failed
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.model.prompt import Prompt
from appliance.sampling import SamplingParams


async def drive(seed: int) -> tuple[Any, dict[str, int]]:
    rng = random.Random(seed)
    model = FakeModel(reply="abcdefghijklmnopqrstuvwxyz" * 4, delay=0.0005, capacity=900)
    limits = Limits(slots=3, batch_tokens=48, kv_tokens=900, ctx_limit=300, max_wait_s=0.002,
                    max_queue=50, queue_timeout_s=30, prefill_chunk=16)
    eng = Engine(lambda: model, EngineOptions(limits, CachePolicy(n_seq=5, park_bytes=20_000, restore_min_tokens=4,
                                                    min_shared=4)))
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 5)
    assert eng.state is EngineState.READY
    system = list(range(1, 25))
    history: dict[str, list[int]] = {}
    outcomes: list[str] = []

    async def user(i: int) -> None:
        for _ in range(rng.randint(1, 4)):
            sid = f"s{rng.randint(0, 9)}"
            base = history.get(sid, system)
            if rng.random() < 0.2:
                base = base[: rng.randint(1, len(base))]  # an edited history
            prompt = base + [rng.randint(100, 999) for _ in range(rng.randint(1, 40))]
            params = SamplingParams(max_tokens=rng.randint(1, 30))
            h: Handle = eng.submit(Prompt(prompt, 0, public_len=len(system)), params, client=str(i), session=sid)
            cancel_after = rng.choice([None, None, 0, 1, 3, 10])
            text = []
            n = 0
            if cancel_after == 0:
                h.cancel()
            async for ev in h.events():
                if isinstance(ev, Delta):
                    text.append(ev.text)
                    n += 1
                    if cancel_after is not None and n >= cancel_after:
                        h.cancel()
                elif isinstance(ev, Done):
                    outcomes.append(ev.finish_reason)
                    if ev.finish_reason != "cancelled":
                        history[sid] = prompt + [ord(c) for c in "".join(text)]
                else:
                    assert isinstance(ev, Failed)
                    outcomes.append(f"failed {ev.error.status}")
            if rng.random() < 0.1:
                await eng.delete_session(sid)
                history.pop(sid, None)
            await asyncio.sleep(rng.random() * 0.01)

    await asyncio.gather(*(user(i) for i in range(8)))
    await asyncio.sleep(0.05)
    # Nothing stuck, nothing leaked.
    assert eng.state is EngineState.READY
    assert not eng.core.sched.running and not eng.core.sched.waiting and eng.n_active == 0
    assert eng.core.sched.reserved == 0
    held = sorted(e.seq_id for e in eng.core.cache.entries.values() if e.seq_id >= 0)
    assert sorted(held + eng.core.cache.free_ids) == list(range(5)), "a sequence id leaked or is held twice"
    assert not any(e.busy for e in eng.core.cache.entries.values())
    for sid in range(5):  # the KV cache holds only what the cache entries say it holds
        entry = next((e for e in eng.core.cache.entries.values() if e.seq_id == sid), None)
        assert model.kv.get(sid, []) == (list(range(entry.n_tokens)) if entry else []), sid
    # Every request ended, and none with a server error.
    assert outcomes and not [o for o in outcomes if o.startswith("failed 500")], outcomes
    eng.stop()
    return dict(eng.snapshot.cache_events), dict(eng.snapshot.counters.finished)


def test_random_workloads_leave_a_consistent_engine() -> None:
    stats = [asyncio.run(asyncio.wait_for(drive(seed), 60)) for seed in range(12)]
    # Guard the test itself: together the workloads must reach every path they claim to.
    total = {k: sum(c[k] for c, _ in stats) for k in
             ("hits", "shared_hits", "evicted", "parked", "restored")}
    assert all(v > 0 for v in total.values()), total
    finished = {k: sum(f.get(k, 0) for _, f in stats) for k in ("cancelled", "length")}
    assert all(v > 0 for v in finished.values()), finished
