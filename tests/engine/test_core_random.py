"""A randomised workload on EngineCore, checked after every loop iteration: speculation, four
clients with named and anonymous conversations, a public prefix, bursts of one prompt,
cancels, deletes, parking on a small budget, idle-cell limits, KV pressure and decodes that
fail halfway (earlier rows written, as llama.cpp leaves them). Every sequence id is free or
held once; every sequence's KV is what its entry or turn says; queue and per-client counts
and reservations add up; greedy text is the model's own; nothing is reused from another
client but the public prefix; every turn ends exactly once."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import pytest
from helpers.engines import Core, Recorder, make
from helpers.fakes import RuleModel

from appliance.engine.events import Done, Failed
from appliance.engine.inbox import Cancel, DeleteSession
from appliance.engine.turn import State, Turn
from appliance.model.prompt import common_prefix
from appliance.sampling import SamplingParams

ALPHA = "abcdefghijklmnopqrstuvwxyz"
PUBLIC = [ord(c) for c in "SYSTEM PROMPT: be nice."]
N_SEQ = 6


@dataclass
class FlakyModel(RuleModel):
    """RuleModel whose decodes sometimes fail after writing a random number of rows, and
    that refuses batches over n_batch as llm.LLM does."""

    n_batch: int = 64
    fail_p: float = 0.01
    rng: random.Random = field(default_factory=random.Random)

    def decode(self, tokens: list[int], pos: list[int], seq_ids: list[int], logits: list[bool]) -> None:
        assert len(tokens) <= self.n_batch, f"batch of {len(tokens)} over n_batch {self.n_batch}"
        if self.rng.random() < self.fail_p:
            k = self.rng.randint(0, len(tokens))
            if k:
                super().decode(tokens[:k], pos[:k], seq_ids[:k], logits[:k])
            raise RuntimeError("injected decode failure")
        super().decode(tokens, pos, seq_ids, logits)

    @staticmethod
    def parked_positions(data: bytes) -> list[int]:
        return list(eval(data.decode()))  # FakeModel.seq_state's own format


def invariants(c: Core, model: FlakyModel, turns: list[Turn]) -> list[str]:
    core, cache = c.core, c.core.cache
    bad = []
    idle = {e.seq_id: e for e in cache.entries.values() if e.seq_id >= 0 and not e.busy}
    running = {t.seq_id: t for t in core.sched.running if t.seq_id >= 0}
    if sorted([*cache.free_ids, *idle, *running]) != list(range(N_SEQ)):
        bad.append(f"ids: free {sorted(cache.free_ids)}, idle {sorted(idle)}, running {sorted(running)}")
    bad += [f"idle seq {s}: KV {len(model.kv.get(s, []))} cells, entry {e.n_tokens}"
            for s, e in idle.items() if model.kv.get(s, []) != list(range(e.n_tokens))]
    bad += [f"running seq {s}: KV {len(model.kv.get(s, []))} cells, n_cached {t.n_cached}"
            for s, t in running.items() if model.kv.get(s, []) != list(range(t.n_cached))]
    bad += [f"free seq {s} holds cells" for s in cache.free_ids if model.kv.get(s)]
    bad += ["a parked state disagrees with its tokens" for e in cache.entries.values()
            if e.parked is not None and model.parked_positions(e.parked) != list(range(e.n_tokens))]
    bad += ["a busy entry without its turn" for e in cache.entries.values() if e.busy and e.seq_id not in running]
    open_: dict[str, int] = {}
    for t in turns:
        if t.state is not State.FINISHED:
            open_[t.client] = open_.get(t.client, 0) + 1
    if open_ != core.inbox._open or core.inbox._queued != len(core.sched.waiting):
        bad.append(f"inbox counts: open {core.inbox._open} vs {open_}, queued {core.inbox._queued}")
    # The budget is the sum of the turns' holdings, and each holds what it may come to hold.
    if core.sched.reserved != sum(t.reserved for t in core.sched.running) or any(
            t.reserved < t.kv_reserve(core.limits.ctx_limit) for t in core.sched.running):
        bad.append("reservations")
    # The snapshot's sessions view is rebuilt only when the table's version moves: never stale.
    snap = core.snapshot()
    fresh = {s: (e.state, e.n_tokens, len(e.parked or b""), e.last_used) for s, e in cache.entries.items()}
    shown = {s: (v.state, v.cached_tokens, v.parked_bytes, v.last_used) for s, v in snap.sessions.items()}
    if shown != fresh or snap.parked_bytes != cache.parked_bytes:
        bad.append("a stale sessions view in the snapshot")
    return bad


def check_finished(t: Turn, rec: Recorder, c: Core, sent: dict[str, list[list[int]]]) -> list[str]:
    bad = []
    if isinstance(rec.end, Failed) and "could not start" in rec.end.error.message:
        bad.append(f"request {t.rid} failed to start: {rec.end.error.message}")
    if isinstance(rec.end, Done) and rec.end.finish_reason != "cancelled" and t.params.greedy:
        toks, want, x = [ord(ch) for ch in rec.text], [], t.prompt[-1]
        for _ in toks:
            x = RuleModel.rule(x)
            want.append(x)
        if toks != want:
            bad.append(f"request {t.rid}: not the model's greedy text")
        if rec.end.finish_reason == "length" and len(toks) != min(t.params.max_tokens, c.core.ctx_cap - t.n_prompt):
            bad.append(f"request {t.rid}: 'length' after {len(toks)} tokens")
    if t.n_reused:  # only the client's own history or the public prefix
        own = max([common_prefix(q, t.prompt) for q in sent[t.client] if q is not t.prompt] + [0])
        if t.n_reused > max(own, min(common_prefix(PUBLIC, t.prompt), t.public_len)):
            bad.append(f"request {t.rid} reused {t.n_reused} tokens not its client's")
    return bad


def workload(seed: int) -> list[str]:
    rng = random.Random(seed)
    model = FlakyModel(capacity=1500, rng=random.Random(seed + 1000))
    c = make(model, slots=3, n_seq=N_SEQ, kv_tokens=1500, ctx_limit=200, batch_tokens=64, spec_budget=16,
             prefill_chunk=16, prefill_group=32, park_bytes=rng.choice([0, 300, 2000]), restore_min_tokens=4,
             min_shared=4, idle_kv_tokens=rng.choice([0, 200]))
    c.core.add_public(PUBLIC)
    turns: list[Turn] = []
    recs: dict[int, Recorder] = {}
    history: dict[str, list[int]] = {}  # conversation -> its last finished turn's tokens
    sent: dict[str, list[list[int]]] = {}  # client -> every sequence it sent or was answered
    keys: dict[int, str] = {}
    seen: set[int] = set()
    for it in range(1500):
        if rng.random() < 0.25 and sum(t.state is not State.FINISHED for t in turns) < 10:
            client = f"c{rng.randint(0, 3)}"
            session = f"{client}-s{rng.randint(0, 2)}" if rng.random() < 0.5 else None
            key = session or f"{client}-anon"
            base = history.get(key) if rng.random() < 0.7 else None
            if base is None:
                base = PUBLIC + [ord(x) for x in rng.choice(["", " I am " + client])] if rng.random() < 0.8 else []
            elif rng.random() < 0.2:
                base = base[:rng.randint(1, len(base))]  # an edited history
            tail = "".join(rng.choice(ALPHA) for _ in range(3))
            body = (ALPHA * 2)[rng.randint(0, 25):][:rng.randint(0, 30)] if rng.random() < 0.6 else tail
            prompt = (base + [ord(x) for x in body + tail])[:150]
            params = SamplingParams(max_tokens=rng.randint(1, 60), temperature=rng.choice([0.0, 0.0, 1.0]),
                                    seed=rng.randint(0, 9))
            public_len = len(PUBLIC) if common_prefix(prompt, PUBLIC) == len(PUBLIC) else 0
            for burst in range(2 if rng.random() < 0.15 else 1):  # n choices: the same prompt again
                t, rec = c.submit(prompt, client=client, session=session if not burst else None, params=params,
                                  public_len=public_len)
                keys[t.rid], recs[t.rid] = (key if not burst else f"{client}-anon"), rec
                turns.append(t)
                sent.setdefault(client, []).append(prompt)
        live = [t for t in turns if t.state is not State.FINISHED]
        if live and rng.random() < 0.05:
            c.core.inbox.put(Cancel(rng.choice(live).rid))
        if rng.random() < 0.01:
            c.core.inbox.put(DeleteSession(f"c{rng.randint(0, 3)}-s{rng.randint(0, 2)}"))
        c.clock.advance(rng.choice([0.01, 0.01, 0.5, 3.0]))
        ended = {rid: len(r.events) for rid, r in recs.items() if r.events and isinstance(r.events[-1], (Done, Failed))}
        c.step()
        problems = [f"request {rid}: an event after its end" for rid, n in ended.items() if len(recs[rid].events) != n]
        for t in turns:
            if t.state is State.FINISHED and t.rid not in seen:
                seen.add(t.rid)
                rec = recs[t.rid]
                problems += check_finished(t, rec, c, sent)
                if isinstance(rec.end, Done) and rec.end.finish_reason != "cancelled":
                    history[keys[t.rid]] = t.prompt + [ord(ch) for ch in rec.text]
                    sent[t.client].append(history[keys[t.rid]])
        problems += invariants(c, model, turns)
        if problems:
            return [f"seed {seed}, iteration {it}: {p}" for p in problems]
    return []


@pytest.mark.parametrize("seed", range(16))
def test_core_invariants_hold_after_every_iteration(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL)  # the injected failures log errors
    assert workload(seed) == []
