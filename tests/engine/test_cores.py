"""cores.CoreShare: one llama.cpp thread fewer per core other processes keep busy."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from helpers.engines import Core, make
from helpers.fakes import FakeClock, FakeModel

from appliance.cpu import busy_seconds, cpu_seconds
from appliance.engine.core import EngineCore
from appliance.engine.inbox import Inbox
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.engine.threads import FREE, INTERVAL_S, TAKE, CoreShare


class Machine:
    """Our cores' busy seconds and this process's CPU seconds, advanced by hand."""

    def __init__(self) -> None:
        self.busy, self.own = 1000.0, 10.0

    def run(self, seconds: float, ours: float, others: float) -> None:
        """`seconds` of wall time in which we used `ours` cores and others `others`."""
        self.busy += seconds * (ours + others)
        self.own += seconds * ours

    def read(self) -> tuple[float, float]:
        return self.busy, self.own


def share(n_cpus: int = 2, max_threads: int = 2) -> tuple[CoreShare, Machine, FakeClock]:
    m, clock = Machine(), FakeClock()
    return CoreShare(n_cpus, max_threads, m.read, clock), m, clock


def tick(cs: CoreShare, m: Machine, clock: FakeClock, ours: float, others: float) -> int:
    m.run(INTERVAL_S, ours, others)
    clock.advance(INTERVAL_S)
    return cs.update()


def test_a_busy_core_is_given_up_and_taken_back_once_it_is_free() -> None:
    cs, m, clock = share()
    assert cs.update() == 2  # the first sample only sets the baseline
    assert tick(cs, m, clock, ours=2.0, others=0.02) == 2  # daemons' crumbs
    assert tick(cs, m, clock, ours=1.5, others=0.5) == 1  # another process shares a core
    assert cs.others == pytest.approx(0.5)
    assert tick(cs, m, clock, ours=1.0, others=1.0) == 1  # it now has the core to itself
    assert tick(cs, m, clock, ours=1.0, others=0.5) == 1  # still using half of it
    assert tick(cs, m, clock, ours=1.0, others=0.02) == 2  # gone


def test_hysteresis_between_take_and_free() -> None:
    cs, _, _ = share()
    assert cs.decide(TAKE - 0.01) == 0 and cs.decide(TAKE + 0.01) == 1
    cs.taken = 1
    assert cs.decide(FREE + 0.01) == 1 and cs.decide(FREE - 0.01) == 0


def test_four_cores_give_up_one_per_busy_core_and_always_keep_one() -> None:
    cs, m, clock = share(4, 4)
    cs.update()
    assert tick(cs, m, clock, ours=3.0, others=1.0) == 3
    assert tick(cs, m, clock, ours=2.0, others=2.0) == 2
    assert tick(cs, m, clock, ours=1.0, others=3.0) == 1
    assert tick(cs, m, clock, ours=1.0, others=3.9) == 1  # never none
    assert tick(cs, m, clock, ours=3.0, others=1.0) == 3


def test_never_more_threads_than_configured() -> None:
    cs, m, clock = share(4, 2)  # e.g. two physical cores of four logical CPUs
    cs.update()
    assert tick(cs, m, clock, ours=2.0, others=0.0) == 2
    assert tick(cs, m, clock, ours=2.0, others=1.0) == 2  # three free CPUs still hold two threads
    assert tick(cs, m, clock, ours=1.0, others=3.0) == 1


def test_samples_at_most_every_interval_and_not_across_an_idle_spell() -> None:
    cs, m, clock = share()
    cs.update()
    calls = 0

    def counting() -> tuple[float, float]:
        nonlocal calls
        calls += 1
        return m.read()

    cs.read = counting
    clock.advance(INTERVAL_S / 3)
    cs.update()
    assert calls == 0  # too soon
    # An idle minute (no steps, so no samples) in which others were busy, then a step: the
    # minute is not judged (it says nothing about the cores while we decode), the next is.
    m.run(60, ours=0.0, others=1.0)
    clock.advance(60)
    assert cs.update() == 2 and calls == 1
    assert tick(cs, m, clock, ours=1.5, others=0.5) == 1


def test_unreadable_cpu_times_keep_the_configured_threads() -> None:
    clock = FakeClock()
    cs = CoreShare(2, 2, lambda: (0.0, 0.0), clock)  # what cpu.cpu_seconds returns then
    for _ in range(4):
        clock.advance(INTERVAL_S)
        assert cs.update() == 2


def test_busy_time_is_every_field_but_idle_and_iowait_and_includes_steal() -> None:
    t = SimpleNamespace(user=100, nice=10, system=20, idle=5000, iowait=7, irq=1, softirq=2, steal=3, guest=0)
    assert busy_seconds(t) == 100 + 10 + 20 + 1 + 2 + 3  # no idle, no iowait
    busy, own = cpu_seconds([0])
    assert busy > 0
    t2 = os.times()
    assert 0 < own <= t2.user + t2.system + 0.05


def test_the_engine_runs_its_steps_with_the_chosen_count_and_publishes_it() -> None:
    m, clock = Machine(), FakeClock()
    model = FakeModel(reply="x" * 400)
    limits = Limits(slots=1, batch_tokens=256, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.0)
    core = EngineCore(model, limits, CachePolicy(n_seq=2), Inbox(64, 0), clock=clock,
                      cores=CoreShare(2, 2, m.read, clock))
    c = Core(core, clock)
    assert core.snapshot().threads == 2
    _, rec = c.submit([1, 2, 3], max_tokens=300)
    c.step()

    def steps(n: int, ours: float, others: float) -> None:
        for _ in range(n):
            m.run(INTERVAL_S, ours, others)
            clock.advance(INTERVAL_S)
            c.step()

    steps(4, ours=1.4, others=0.6)
    assert model.threads == [1] and core.snapshot().threads == 1
    assert core.snapshot().cores_others == pytest.approx(0.6)
    steps(3, ours=1.0, others=0.0)
    assert model.threads == [1, 2] and core.snapshot().threads == 2
    c.run()
    assert rec.text == "x" * 300  # the answer is untouched by the switches


def test_without_core_sharing_the_thread_count_is_never_touched() -> None:
    model = FakeModel(reply="abc")
    c = make(model)
    c.submit([1, 2, 3])
    c.run()
    assert model.threads == [] and c.core.snapshot().threads == 0
