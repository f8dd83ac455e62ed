"""Driving the engine in tests, on the fakes: the engine core one loop iteration at a time
(Core, make, Recorder), the engine thread through its public API (limits, started, collect,
run), and the turns a test may inspect where the HTTP side holds only a handle (turns_of)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from appliance.engine.core import EngineCore
from appliance.engine.engine import Engine, EngineOptions, EngineState, Handle
from appliance.engine.events import Delta, Done, Event, Failed, Report
from appliance.engine.inbox import Command, Inbox, Submit
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.engine.turn import Turn
from appliance.sampling import SamplingParams
from helpers.fakes import FakeClock, FakeModel


# -- the core, synchronously ------------------------------------------------------------
class Recorder:
    """A turn's sink: every event it was sent, in order."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Delta))

    @property
    def end(self) -> Done | Failed:
        assert self.events and isinstance(self.events[-1], (Done, Failed)), self.events[-3:]
        return self.events[-1]


@dataclass
class Core:
    core: EngineCore
    clock: FakeClock
    rid: int = 0

    def submit(self, prompt: list[int], max_tokens: int = 20, client: str = "c", session: str | None = None,
               params: SamplingParams | None = None, public_len: int = 0,
               progress: Report | bool = False, system_len: int = 0, **fields: Any) -> tuple[Turn, Recorder]:
        self.rid += 1
        rec = Recorder()
        turn = Turn(rid=self.rid, prompt=list(prompt), params=params or SamplingParams(max_tokens=max_tokens,
                                                                                       temperature=0.0),
                    arrival=self.clock(), sink=rec, client=client, session=session or f"anon-{self.rid}",
                    named=session is not None, public_len=public_len, progress=Report(int(progress)), system_len=system_len,
                    **fields)
        self.core.inbox.submit(turn)
        return turn, rec

    def step(self) -> bool:
        """One iteration of Engine._run: commands, iterate, hand out the events."""
        for cmd in self.core.inbox.take():
            self.core.handle(cmd)
        busy = self.core.iterate()
        events, self.core.events = self.core.events, []
        for sink, ev in events:
            sink(ev)
        return busy

    def run(self) -> None:
        for _ in range(10_000):
            if not self.step() and not self.core.sched.waiting:
                return
        raise AssertionError("the engine did not go idle")

    def leaked_ids(self) -> set[int]:
        c = self.core.cache
        held = {e.seq_id for e in c.entries.values() if e.seq_id >= 0}
        held |= {t.seq_id for t in self.core.sched.running}
        return set(range(self.core.kv.policy.n_seq)) - set(c.free_ids) - held


def make(model: FakeModel, *, slots: int = 1, n_seq: int = 0, kv_tokens: int = 4096, ctx_limit: int = 1024,
         batch_tokens: int = 256, spec_budget: int = 0, prefill_chunk: int = 0, prefill_group: int = 0,
         tools_tokens: int = 0, **policy: Any) -> Core:
    clock = FakeClock()
    limits = Limits(slots=slots, batch_tokens=batch_tokens, kv_tokens=kv_tokens, ctx_limit=ctx_limit,
                    max_wait_s=0.0, max_queue=64, queue_timeout_s=30.0, prefill_chunk=prefill_chunk,
                    prefill_group=prefill_group, tools_tokens=tools_tokens)
    core = EngineCore(model, limits, CachePolicy(n_seq=n_seq or slots + 1, **policy), Inbox(64, 0), clock=clock,
                      spec_budget=spec_budget)
    core.warm_up()
    core.open_commons()  # common_prompts=N in **policy: system prompts made public once common
    return Core(core, clock)


# -- the engine thread --------------------------------------------------------------------
def limits(**kw: Any) -> Limits:
    base: dict[str, Any] = dict(slots=4, batch_tokens=64, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.0,
                                max_queue=8, queue_timeout_s=30.0)
    base.update(kw)
    return Limits(**base)


async def started(model: FakeModel, **kw: Any) -> Engine:
    eng = Engine(lambda: model, EngineOptions(limits(**kw)))
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 5)
    assert eng.state is EngineState.READY
    return eng


async def collect(h: Handle) -> tuple[str, Done | Failed]:
    text = []
    async for ev in h.events():
        if isinstance(ev, Delta):
            text.append(ev.text)
        elif isinstance(ev, (Done, Failed)):  # a Progress (asked for) is neither text nor an end
            return "".join(text), ev
    raise AssertionError("stream ended without Done/Failed")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


def turns_of(eng: Engine) -> dict[int, Turn]:
    """Every turn the engine thread takes from now on, by request id: engine state a test
    may look at (once the snapshot shows what it checks), where the HTTP side holds only a
    handle. Call once the engine is ready (its core exists)."""
    core = eng.core
    assert core is not None, "the engine is not ready"
    turns: dict[int, Turn] = {}
    handle = core.handle

    def take(cmd: Command) -> None:
        if isinstance(cmd, Submit):
            turns[cmd.turn.rid] = cmd.turn
        handle(cmd)

    core.handle = take  # type: ignore[method-assign]
    return turns
