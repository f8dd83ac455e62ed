"""The engine thread with a fake model: batching, finishing, cancelling, failing."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from helpers.engines import collect, limits, run, started
from helpers.fakes import FakeModel
from helpers.polling import until

from appliance.engine.engine import Engine, EngineOptions, EngineState
from appliance.engine.events import Delta, Done, Failed
from appliance.errors import QueueFull
from appliance.sampling import SamplingParams


def test_one_request_streams_reply_then_done() -> None:
    async def main() -> None:
        model = FakeModel(reply="hello")
        eng = await started(model)
        text, end = await collect(eng.submit([1, 2, 3], SamplingParams(max_tokens=50)))
        assert text == "hello"
        assert isinstance(end, Done) and end.finish_reason == "stop"
        assert (end.prompt_tokens, end.completion_tokens) == (3, 5)
        # The finished turn's KV stays as its session's cache entry (prompt + answer).
        (entry,) = eng.core.cache.entries.values()
        assert entry.tokens == [1, 2, 3, *map(ord, "hello")] and not entry.busy
        assert model.kv[entry.seq_id] == list(range(8))
        eng.stop()
        assert model.closed
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
        assert eng.snapshot.counters.peak_seqs_per_step == 2
        eng.stop()
    run(main())


def test_window_batches_requests_submitted_together() -> None:
    async def main() -> None:
        model = FakeModel(reply="yz")
        eng = Engine(lambda: model, EngineOptions(limits(max_wait_s=0.2)))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        n_start = len(model.calls)  # the warm-up and the public prefix
        hs = [eng.submit([3] * 5, SamplingParams(max_tokens=8)) for _ in range(4)]
        await asyncio.gather(*(collect(h) for h in hs))
        prefill_call = model.calls[n_start]
        assert sorted(set(prefill_call[2])) == [0, 1, 2, 3] and len(prefill_call[0]) == 20
        eng.stop()
    run(main())


def test_cancel_while_generating_frees_slot_and_cache() -> None:
    async def main() -> None:
        model = FakeModel(reply="z" * 500, delay=0.005)
        eng = await started(model, slots=1)
        h = eng.submit([1, 2], SamplingParams(max_tokens=500), session="s1")
        await h.events().__anext__()
        h.cancel()
        _, end = await collect(h)
        assert isinstance(end, Done) and end.finish_reason == "cancelled"
        assert not eng.core.sched.running and (eng.snapshot.slots - eng.snapshot.running) == 1
        # What was computed stays cached for the session's next turn.
        assert eng.session_info("s1")["state"] == "cached"
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


def test_queue_positions_come_from_the_snapshot_and_a_handle_holds_no_turn() -> None:
    async def main() -> None:
        gate = threading.Event()
        model = FakeModel(reply="p" * 100, delay=0.005)
        eng = await started(model, slots=1)
        a = eng.submit([1], SamplingParams(max_tokens=100))
        await a.events().__anext__()  # a is running
        assert eng.snapshot.taken == a.rid and a.position == 0
        model.gate = gate  # the engine thread stops in a's next decode
        b = eng.submit([2], SamplingParams(max_tokens=5))
        c = eng.submit([3], SamplingParams(max_tokens=5))
        assert not hasattr(b, "turn")
        # Still in the inbox: behind everyone the snapshot shows waiting (nobody yet).
        assert (b.position, c.position) == (1, 1)
        gate.set()
        await until(lambda: (a.position, b.position, c.position) == (0, 1, 2), what="b and c queued behind a")
        c.cancel()
        _, end_c = await collect(c)
        assert isinstance(end_c, Done) and end_c.finish_reason == "cancelled"
        assert c.position == 0
        a.cancel()
        await asyncio.gather(collect(a), collect(b))
        assert (a.position, b.position) == (0, 0)
        eng.stop()
    run(main())


def test_a_turn_admitted_hears_busy_through_the_step_that_reads_it() -> None:
    # The snapshot is published once turns are admitted, before the step: through a long
    # step (a pasted page's chunk takes ~1 s) the admitted turn is not told it is queued.
    async def main() -> None:
        model = FakeModel(reply="q" * 50, delay=0.005)
        eng = await started(model, slots=2)
        a = eng.submit([1], SamplingParams(max_tokens=50))
        await a.events().__anext__()  # a is running
        first, second = threading.Event(), threading.Event()
        model.gate = first
        await until(lambda: model.gated == 1, what="the engine stopped in a's step")
        b = eng.submit([2] * 8, SamplingParams(max_tokens=5))
        model.gate = second  # the next step (it takes b from the inbox) stops too
        first.set()
        await until(lambda: model.gated == 2, what="the engine stopped in the step that reads b")
        # Without the publish after admission, the snapshot would be the one before b was
        # taken: b would hear `queued 1` for the whole step.
        assert b.position == 0 and eng.snapshot.step_ends > 0
        second.set()
        a.cancel()
        await asyncio.gather(collect(a), collect(b))
        eng.stop()
    run(main())


def test_decode_failure_fails_that_step_and_engine_keeps_serving() -> None:
    async def main() -> None:
        model = FakeModel(reply="ok", fail_on_call=2)  # calls 0 and 1: the warm-up and the public prefix
        eng = await started(model)
        _, end = await collect(eng.submit([1, 2], SamplingParams(max_tokens=5)))
        assert isinstance(end, Failed) and end.error.status == 500
        text, end = await collect(eng.submit([1, 2], SamplingParams(max_tokens=5)))
        assert text == "ok" and isinstance(end, Done)
        assert (eng.snapshot.slots - eng.snapshot.running) == 4
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
        model = FakeModel(reply="s" * 1000, delay=0.005)
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
        eng = Engine(broken, EngineOptions(limits()))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        assert eng.state is EngineState.FAILED and "no such model" in eng.load_error
    run(main())


# -- the session cache -------------------------------------------------------------------
from appliance.engine.kv.store import IDLE_PARK_AFTER_S, CachePolicy  # noqa: E402
from appliance.model.prompt import Prompt  # noqa: E402


async def cached_engine(model: FakeModel, slots: int = 2, n_seq: int = 3, park: int = 0,
                        restore_min: int = 0, **kw: Any) -> Engine:
    eng = Engine(lambda: model, EngineOptions(limits(slots=slots, **kw),
                 CachePolicy(n_seq=n_seq, park_bytes=park, restore_min_tokens=restore_min, min_shared=4)))
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 5)
    return eng


def computed(eng: Engine) -> int:
    return eng.snapshot.counters.prompt_tokens_computed


def test_second_turn_prefills_only_new_tokens() -> None:
    async def main() -> None:
        model = FakeModel(reply="ab")
        eng = await cached_engine(model)
        turn1 = list(range(100, 120))
        await collect(eng.submit(turn1, SamplingParams(max_tokens=5), session="u1"))
        assert computed(eng) == 20
        # Turn 2 = turn 1 + the answer "ab" + 6 new tokens.
        turn2 = turn1 + [ord("a"), ord("b")] + list(range(200, 206))
        _, end = await collect(eng.submit(turn2, SamplingParams(max_tokens=5), session="u1"))
        # KV held turn1 + "ab" (EOS ended the answer and is never decoded): 22 reused.
        assert end.cached_tokens == 22 and computed(eng) == 20 + 6
        assert eng.snapshot.cache_events["hits"] == 1
        # An edited history reuses exactly the part that still matches.
        edited = turn1[:10] + [999] * 5
        _, end = await collect(eng.submit(edited, SamplingParams(max_tokens=5), session="u1"))
        assert end.cached_tokens == 10 and computed(eng) == 26 + 5
        eng.stop()
    run(main())


def test_other_clients_reuse_nothing_private_and_the_same_client_reuses_all() -> None:
    async def main() -> None:
        model = FakeModel(reply="a")
        eng = await cached_engine(model, n_seq=4)
        system = list(range(1, 11))  # a private system prompt (no public entry holds it)
        p1 = Prompt(system + [50, 51, 52, 53], 0, public_len=10)
        await collect(eng.submit(p1, SamplingParams(max_tokens=3), client="alice", session="a1"))
        # Bob's prompt matches Alice's well beyond the system prompt: he gets nothing.
        p2 = Prompt(system + [50, 51, 52, 99], 0, public_len=10)
        _, end = await collect(eng.submit(p2, SamplingParams(max_tokens=3), client="bob", session="b1"))
        assert end.cached_tokens == 0 and not model.copies
        # Alice's other conversation reuses all she has in common with her first one.
        _, end = await collect(eng.submit(p2, SamplingParams(max_tokens=3), client="alice", session="a2"))
        assert end.cached_tokens == 13
        assert model.copies and model.copies[-1][2] == 13
        eng.stop()
    run(main())


def test_anonymous_second_turn_continues_the_clients_first() -> None:
    async def main() -> None:
        model = FakeModel(reply="ab")
        eng = await cached_engine(model)
        turn1 = list(range(100, 120))
        await collect(eng.submit(turn1, SamplingParams(max_tokens=5), client="alice"))
        turn2 = turn1 + [ord("a"), ord("b")] + list(range(200, 206))
        _, other = await collect(eng.submit(turn2, SamplingParams(max_tokens=5), client="bob"))
        assert other.cached_tokens == 0
        _, end = await collect(eng.submit(turn2, SamplingParams(max_tokens=5), client="alice"))
        assert end.cached_tokens == 22 and eng.snapshot.cache_events["hits"] == 1
        # Taken over, not copied: alice's conversation is one cache entry, not two.
        assert len([v for v in eng.snapshot.sessions.values() if v.cached_tokens >= 22]) == 2  # alice, bob
        eng.stop()
    run(main())


def test_presets_are_shared_by_every_client_private_prompts_by_none() -> None:
    async def main() -> None:
        model = FakeModel(reply="ok")
        preset = "You answer in French."
        eng = Engine(lambda: model, EngineOptions(limits(slots=2), CachePolicy(n_seq=4, min_shared=4), presets=(preset,)))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        computed_at_start = computed(eng)

        async def ask(client: str, system: str, user: str) -> Done:
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            prompt = await eng.prepare(msgs, 5)
            _, end = await collect(eng.submit(prompt, SamplingParams(max_tokens=5), client=client))
            assert isinstance(end, Done)
            return end

        head = len(f"<|im_start|>system\n{preset}<|im_end|>\n<|im_start|>user\n")
        a = await ask("alice", preset, "Hello there")
        b = await ask("bob", preset, "Good morning")
        assert a.cached_tokens == b.cached_tokens == head  # both copied the preset
        secret = "The launch code is 1234. Never reveal it."
        await ask("alice", secret, "Hi")
        c = await ask("carol", secret, "Hi")
        assert c.cached_tokens == 0  # nothing of alice's private system prompt
        d = await ask("bob", secret, "Hi")  # only what bob's own first turn had in common
        assert d.cached_tokens == len("<|im_start|>system\n")
        assert computed_at_start == 0  # public prefixes are not counted as users' prompts
        eng.stop()
    run(main())


def test_requests_arriving_together_compute_shared_prefix_once() -> None:
    async def main() -> None:
        model = FakeModel(reply="xy", delay=0.002)
        eng = Engine(lambda: model, EngineOptions(limits(slots=4, batch_tokens=256, max_wait_s=0.2),
                     CachePolicy(n_seq=8, min_shared=4)))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        system = list(range(1, 41))
        hs = [eng.submit(Prompt(system + [200 + i] * 5, 0, public_len=40), SamplingParams(max_tokens=4),
                         session=f"s{i}") for i in range(4)]
        ends = [(await collect(h))[1] for h in hs]
        assert computed(eng) == 40 + 4 * 5  # the system prompt once, then each user's part
        assert sorted(e.cached_tokens for e in ends) == [0, 40, 40, 40]
        eng.stop()
    run(main())


def test_lru_eviction_and_parking_restore_instead_of_recompute() -> None:
    async def main() -> None:
        model = FakeModel(reply="r")
        # One slot, two sequence ids: every other session must leave the KV cache.
        eng = await cached_engine(model, slots=1, n_seq=2, park=10**6)
        hist = {s: list(range(10 * i + 100, 10 * i + 130)) for i, s in enumerate("abc")}
        for s in "abc":
            await collect(eng.submit(hist[s], SamplingParams(max_tokens=2), session=s))
        assert eng.snapshot.cache_events["evicted"] == 1 and eng.snapshot.cache_events["parked"] == 1
        assert eng.session_info("a")["state"] == "parked"
        before = computed(eng)
        follow = hist["a"] + [ord("r"), 7, 8, 9]
        _, end = await collect(eng.submit(follow, SamplingParams(max_tokens=2), session="a"))
        assert eng.snapshot.cache_events["restored"] == 1
        assert end.cached_tokens == 31 and computed(eng) - before == 3
        eng.stop()
    run(main())


def test_short_parked_history_is_recomputed() -> None:
    async def main() -> None:
        model = FakeModel(reply="r")
        eng = await cached_engine(model, slots=1, n_seq=2, park=10**6, restore_min=50)
        for s in "abc":
            await collect(eng.submit(list(range(1, 20)), SamplingParams(max_tokens=2), client=s, session=s))
        # 'a' (20 tokens) was evicted without parking: below the restore threshold.
        assert eng.session_info("a") is None and eng.snapshot.cache_events["parked"] == 0
        eng.stop()
    run(main())


def test_delete_session_drops_its_cache() -> None:
    async def main() -> None:
        model = FakeModel(reply="d")
        eng = await cached_engine(model)
        await collect(eng.submit([1, 2, 3, 4], SamplingParams(max_tokens=2), session="gone"))
        sid = eng.core.cache.entries["gone"].seq_id
        assert await eng.delete_session("gone") is True
        for _ in range(100):
            if eng.session_info("gone") is None:
                break
            await asyncio.sleep(0.01)
        assert eng.session_info("gone") is None and sid not in model.kv
        assert await eng.delete_session("gone") is False
        eng.stop()
    run(main())


def test_restore_makes_room_in_a_full_cache() -> None:
    async def main() -> None:
        # 3 sessions of ~31 cells on a 100-cell cache with 2 ids: the parked one can only
        # come back if idle sessions give way first.
        model = FakeModel(reply="r", capacity=100)
        eng = await cached_engine(model, slots=1, n_seq=2, park=10**6, kv_tokens=100, ctx_limit=100)
        hist = {s: list(range(10 * i + 100, 10 * i + 130)) for i, s in enumerate("abc")}
        for s in "abc":
            await collect(eng.submit(hist[s], SamplingParams(max_tokens=2), session=s))
        assert eng.session_info("a")["state"] == "parked"
        _, end = await collect(eng.submit(hist["a"] + [ord("r"), 5], SamplingParams(max_tokens=2), session="a"))
        assert eng.snapshot.cache_events["restored"] == 1 and eng.snapshot.cache_events["recomputed"] == 0
        assert end.cached_tokens == 31
        eng.stop()
    run(main())


def test_failed_restore_recomputes_and_never_copies_from_an_evicted_donor() -> None:
    async def main() -> None:
        model = FakeModel(reply="r")
        eng = await cached_engine(model, slots=1, n_seq=2, park=10**6)
        system = list(range(1, 21))
        for s in "abc":
            await collect(eng.submit(Prompt(system + [ord(s)] * 10, 0, public_len=20),
                                     SamplingParams(max_tokens=2), session=s))
        (parked,) = [s for s in "abc" if eng.session_info(s)["state"] == "parked"]
        model.fail_restore = True
        text, end = await collect(eng.submit(Prompt(system + [ord(parked)] * 10 + [ord("r"), 9], 0, public_len=20),
                                             SamplingParams(max_tokens=2), session=parked))
        assert isinstance(end, Done) and text == "r"
        assert eng.snapshot.cache_events["recomputed"] == 1 and eng.state is EngineState.READY
        # Whatever donor it used still existed: every copy came from a live sequence.
        assert all(src >= 0 for src, _, _ in model.copies)
        eng.stop()
    run(main())


def test_a_restore_refused_with_room_to_spare_evicts_no_one_else() -> None:
    async def main() -> None:
        model = FakeModel(reply="r")
        eng = await cached_engine(model, slots=1, n_seq=3, park=10**6)
        for s in "abcd":  # three ids: 'a' is parked when 'd' comes
            await collect(eng.submit([ord(s)] * 30, SamplingParams(max_tokens=2), session=s))
        assert eng.session_info("a")["state"] == "parked"
        model.fail_restore = True  # a state the model will not take, with the cache nearly empty
        text, end = await collect(eng.submit([ord("a")] * 30 + [ord("r"), 9], SamplingParams(max_tokens=2),
                                             session="a"))
        assert isinstance(end, Done) and text == "r" and eng.snapshot.cache_events["recomputed"] == 1
        # 'b' gave up its id for the restore; 'c' and 'd' had nothing to do with it and keep their KV.
        assert [eng.session_info(s)["state"] for s in "cd"] == ["cached", "cached"]
        eng.stop()
    run(main())


def test_anonymous_sessions_are_parked_like_named_ones() -> None:
    async def main() -> None:
        model = FakeModel(reply="r")
        eng = await cached_engine(model, slots=1, n_seq=2, park=10**6)
        for client in "abc":  # one turn each from three clients, ids made up by the server
            await collect(eng.submit(list(range(1, 30)), SamplingParams(max_tokens=2), client=client,
                                     session=f"anon-{client}", named=False))
        assert eng.snapshot.cache_events["evicted"] == 1 and eng.snapshot.cache_events["parked"] == 1
        assert eng.session_info("anon-a")["state"] == "parked"
        eng.stop()
    run(main())


def test_idle_conversations_beyond_idle_kv_tokens_are_parked_and_restored() -> None:
    async def main() -> None:
        model = FakeModel(reply="r")
        shift = [0.0]  # how far the engine's clock runs ahead of the real one
        eng = Engine(lambda: model, EngineOptions(limits(slots=2),
                     CachePolicy(n_seq=6, park_bytes=10**6, min_shared=4, idle_kv_tokens=40),
                     clock=lambda: time.monotonic() + shift[0]))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        first = {c: [ord(c)] * 30 for c in "abc"}  # three clients, no session ids: 31 cells each
        for c, prompt in first.items():
            await collect(eng.submit(prompt, SamplingParams(max_tokens=2), client=c))
        # Just finished: more likely users typing their next turn than gone, so not parked yet.
        assert eng.snapshot.cache_events["parked"] == 0
        shift[0] = IDLE_PARK_AFTER_S + 1  # then idle long enough
        deadline = time.monotonic() + 5
        while eng.snapshot.cache_events["parked"] < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        # Only the newest fits within 40 idle cells; the older two went to RAM, not away.
        assert eng.snapshot.cache_events["parked"] == 2 and eng.snapshot.cache_events["recomputed"] == 0
        # Client a's next turn continues its parked conversation: restored, not recomputed.
        before = computed(eng)
        turn2 = first["a"] + [ord("r")] + [5, 6, 7]  # its prompt, the answer "r", a new message
        _, end = await collect(eng.submit(turn2, SamplingParams(max_tokens=2), client="a"))
        assert isinstance(end, Done) and end.cached_tokens == 31
        assert computed(eng) - before == len(turn2) - 31
        assert eng.snapshot.cache_events["restored"] == 1
        # Client b's parked conversation is not client d's to continue.
        _, other = await collect(eng.submit(first["b"] + [1, 2], SamplingParams(max_tokens=2), client="d"))
        assert isinstance(other, Done) and other.cached_tokens == 0
        eng.stop()
    run(main())


def test_no_parking_budget_leaves_idle_conversations_in_the_kv_cache() -> None:
    async def main() -> None:
        model = FakeModel(reply="r")
        eng = Engine(lambda: model, EngineOptions(limits(slots=2),
                                                  CachePolicy(n_seq=6, park_bytes=0, min_shared=4, idle_kv_tokens=40)))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        for c in "abc":
            await collect(eng.submit([ord(c)] * 30, SamplingParams(max_tokens=2), client=c))
        # Nothing can hold them in RAM: dropping them would only mean recomputing later.
        assert eng.snapshot.cache_events["evicted"] == 0
        _, end = await collect(eng.submit([ord("a")] * 30 + [ord("r"), 9], SamplingParams(max_tokens=2), client="a"))
        assert isinstance(end, Done) and end.cached_tokens == 31
        eng.stop()
    run(main())


def test_delete_during_a_first_turn_leaves_nothing_cached() -> None:
    async def main() -> None:
        model = FakeModel(reply="z" * 200, delay=0.003)
        eng = await cached_engine(model)
        h = eng.submit([1, 2, 3], SamplingParams(max_tokens=200), session="new")
        await h.events().__anext__()  # streaming its first answer; no cache entry yet
        assert await eng.delete_session("new") is True
        h.cancel()
        await collect(h)
        await asyncio.sleep(0.05)
        assert eng.session_info("new") is None
        assert all(len(v) == 0 for sid, v in model.kv.items() if sid < 3)  # 3 ids; the public prefix beyond
        eng.stop()
    run(main())
