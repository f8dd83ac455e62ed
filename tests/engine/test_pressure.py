"""Memory and heat: the readers in cpu.py over fake /proc and /sys trees (cgroup v2, v1 in a
hybrid layout, none), the parking budget that follows free memory and pressure, and
session saving bounded in time."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from helpers.fakes import FakeClock, FakeModel
from helpers.polling import until

from appliance.cpu import Memory, Sensors, Thermal, cgroup_memory_limit, read_memory, read_thermal
from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.events import Delta
from appliance.engine.kv import persist
from appliance.engine.kv.store import PARK_RESERVE_MIN, CachePolicy, park_budget
from appliance.engine.scheduler import Limits
from appliance.sampling import SamplingParams

GiB, MiB = 1 << 30, 1 << 20
PSI_IDLE = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def psi(some: float) -> str:
    return f"some avg10={some:.2f} avg60=1.00 avg300=0.50 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def proc_tree(root: Path, cgroup: str, mem_total_kb: int = 8 << 20, available_kb: int = 6 << 20,
              pressure: str = PSI_IDLE) -> Path:
    proc = root / "proc"
    write(proc, {"meminfo": f"MemTotal:       {mem_total_kb} kB\nMemFree:          100000 kB\n"
                            f"MemAvailable:   {available_kb} kB\nBuffers:           1000 kB\n",
                 "self/cgroup": cgroup, "pressure/memory": pressure})
    return proc


# -- reading memory ------------------------------------------------------------------------
def test_no_cgroup_limit_means_the_machine(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path, "0::/user.slice/session-1.scope\n", pressure=psi(3.5))
    cg = tmp_path / "cg"
    write(cg, {"cgroup.controllers": "cpu memory", "user.slice/session-1.scope/memory.max": "max\n",
               "user.slice/memory.max": "max\n"})
    m = read_memory(proc, cg)
    assert m == Memory(total=8 * GiB, available=6 * GiB, pressure=3.5, cgroup_limit=0)


def test_cgroup_v2_limit_binds_before_the_machine(tmp_path: Path) -> None:
    # systemd's MemoryMax=1G on the service, MemoryHigh= on its slice lower still.
    proc = proc_tree(tmp_path, "0::/system.slice/appliance.service\n")
    cg = tmp_path / "cg"
    svc = "system.slice/appliance.service"
    write(cg, {"cgroup.controllers": "cpu memory",
               f"{svc}/memory.max": f"{GiB}\n", f"{svc}/memory.high": "max\n",
               "system.slice/memory.max": "max\n", "system.slice/memory.high": f"{900 * MiB}\n",
               f"{svc}/memory.current": f"{700 * MiB}\n",
               f"{svc}/memory.stat": f"anon {500 * MiB}\nfile {200 * MiB}\ninactive_file {100 * MiB}\n",
               f"{svc}/memory.pressure": psi(12.0)})
    m = read_memory(proc, cg)
    # Headroom = the lowest limit minus the working set (current - inactive file pages).
    assert m.cgroup_limit == 900 * MiB and m.total == 900 * MiB
    assert m.available == 900 * MiB - (700 - 100) * MiB
    assert m.pressure == 12.0  # the cgroup's pressure, above the machine's


def test_cgroup_v1_hybrid_layout(tmp_path: Path) -> None:
    # This very VM's layout: memory on v1, PSI on the unified hierarchy.
    proc = proc_tree(tmp_path, "4:memory:/box/a\n1:cpu,cpuacct:/box/a\n0::/box/a\n", available_kb=6 << 20)
    cg = tmp_path / "cg"
    write(cg, {"memory/box/a/memory.limit_in_bytes": "9223372036854771712\n",  # none of its own...
               "memory/box/a/memory.stat": f"cache 0\nhierarchical_memory_limit {GiB}\ntotal_inactive_file {50 * MiB}\n",
               "memory/box/a/memory.usage_in_bytes": f"{650 * MiB}\n",  # ...but its parent's 1 GiB
               "unified/box/a/memory.pressure": psi(0.5)})
    m = read_memory(proc, cg)
    assert m == Memory(total=GiB, available=GiB - 600 * MiB, pressure=0.5, cgroup_limit=GiB)


def test_cgroup_memory_limit_v1_and_v2(tmp_path: Path) -> None:
    # What `appliance tune` plans for (tune.Machine.detect): the tightest limit on the path.
    proc = tmp_path / "proc"
    write(proc, {"self/cgroup": "4:memory:/box/board\n0::/\n"})
    fs = tmp_path / "fs"
    write(fs, {"memory/box/memory.limit_in_bytes": str(4 * 2**30), "memory/box/board/memory.limit_in_bytes": str(2**30)})
    assert cgroup_memory_limit(proc, fs) == 2**30
    write(proc, {"self/cgroup": "0::/svc\n"})
    write(fs, {"cgroup.controllers": "cpu memory\n", "svc/memory.max": "max\n"})
    assert cgroup_memory_limit(proc, fs) is None
    write(fs, {"svc/memory.max": f"{768 * MiB}\n"})
    assert cgroup_memory_limit(proc, fs) == 768 * MiB


def test_readers_survive_missing_files(tmp_path: Path) -> None:
    m = read_memory(tmp_path / "no-proc", tmp_path / "no-cgroups")
    assert m == Memory(0, 0, 0.0, 0)
    assert read_thermal(tmp_path / "no-thermal") == Thermal((), False)
    real = read_memory()  # this machine: something sensible
    assert 0 < real.available <= real.total


# -- reading heat --------------------------------------------------------------------------
def thermal_tree(root: Path, temp_mc: int, cooling_state: int = 0) -> Path:
    write(root, {"thermal_zone0/type": "cpu-thermal\n", "thermal_zone0/temp": f"{temp_mc}\n",
                 "thermal_zone0/trip_point_0_type": "passive\n", "thermal_zone0/trip_point_0_temp": "80000\n",
                 "thermal_zone0/trip_point_1_type": "critical\n", "thermal_zone0/trip_point_1_temp": "110000\n",
                 "thermal_zone1/type": "cpu-thermal\n", "thermal_zone1/temp": "41000\n",
                 "cooling_device0/type": "cpufreq-cpu0\n", "cooling_device0/cur_state": f"{cooling_state}\n",
                 "cooling_device1/type": "intel_powerclamp\n", "cooling_device1/cur_state": "-1\n"})
    return root


def test_thermal_zones_and_throttling(tmp_path: Path) -> None:
    cool = read_thermal(thermal_tree(tmp_path / "a", 52300))
    assert cool == Thermal((("cpu-thermal", 52.3), ("cpu-thermal/thermal_zone1", 41.0)), False)
    # Past the passive trip point (a Pi 5 at 80 C), or a CPU cooling device engaged.
    assert read_thermal(thermal_tree(tmp_path / "b", 81000)).throttled
    assert read_thermal(thermal_tree(tmp_path / "c", 60000, cooling_state=2)).throttled


def test_sensors_read_at_most_once_per_interval() -> None:
    calls = itertools.count()

    def mem() -> Memory:
        return Memory(GiB, next(calls), 0.0)

    clock = FakeClock()
    s = Sensors(max_age_s=0.2, memory=mem, thermal=lambda: Thermal(), clock=clock)
    assert s.read()[0].available == 0 and s.read()[0].available == 0
    clock.advance(0.25)
    assert s.read()[0].available == 1


# -- the parking budget --------------------------------------------------------------------
def test_park_budget_rule() -> None:
    ceiling = 512 * MiB
    reserve = 100 * MiB  # a tenth of 1000 MiB
    m = Memory(total=1000 * MiB, available=500 * MiB, pressure=0.0)
    # Room beyond the reserve: may grow by half of it, never past the ceiling.
    assert park_budget(ceiling, 0, m, False) == (500 * MiB - reserve) // 2
    assert park_budget(100 * MiB, 0, m, False) == 100 * MiB
    # Below the reserve: shrink by the shortfall.
    short = Memory(total=1000 * MiB, available=reserve - 30 * MiB, pressure=0.0)
    assert park_budget(ceiling, 80 * MiB, short, False) == 50 * MiB
    assert park_budget(ceiling, 10 * MiB, short, False) == 0
    # Under pressure: halved whatever is free.
    assert park_budget(ceiling, 80 * MiB, Memory(1000 * MiB, 900 * MiB, 40.0), True) == 40 * MiB
    # A small machine's reserve is never below 64 MiB.
    tiny = Memory(total=256 * MiB, available=PARK_RESERVE_MIN + 2 * MiB, pressure=0.0)
    assert park_budget(ceiling, 0, tiny, False) == 1 * MiB


class FakeMemory:
    def __init__(self) -> None:
        self.now = Memory(total=GiB, available=GiB, pressure=0.0)

    def __call__(self) -> Memory:
        return self.now


async def parked_engine(mem: FakeMemory) -> tuple[Engine, dict[str, list[int]]]:
    limits = Limits(slots=1, batch_tokens=64, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.0)
    eng = Engine(lambda: FakeModel(reply="r"), EngineOptions(limits, CachePolicy(n_seq=2, park_bytes=10**6, memory=mem)))
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 5)
    # One slot, two sequence ids: each new session pushes the oldest idle one out, parked.
    hist = {s: list(range(10 * i + 100, 10 * i + 130)) for i, s in enumerate("abcd")}
    for s in "abcd":
        h = eng.submit(hist[s], SamplingParams(max_tokens=2), session=s)
        async for ev in h.events():
            assert isinstance(ev, Delta) or ev.finish_reason == "stop"
    return eng, hist


def states(eng: Engine) -> dict[str, str | None]:
    return {s: (i["state"] if (i := eng.session_info(s)) else None) for s in "abcd"}


def test_parked_sessions_give_memory_back_when_it_runs_short() -> None:
    async def main() -> None:
        mem = FakeMemory()
        eng, _ = await parked_engine(mem)
        assert states(eng) == {"a": "parked", "b": "parked", "c": "cached", "d": "cached"}
        assert eng.snapshot.park_budget == 10**6  # plenty free: the ceiling
        # The machine runs short: less than the reserve (a tenth) is left.
        mem.now = Memory(total=GiB, available=GiB // 10 - 100, pressure=0.0)
        await until(lambda: eng.snapshot.cache_events["parked_shed"] == 2, 3.0, "two parked sessions shed", every=0.02)
        assert states(eng) == {"a": None, "b": None, "c": "cached", "d": "cached"}
        assert eng.snapshot.parked_bytes == 0 and eng.snapshot.park_budget < 100
        eng.stop()
    asyncio.run(asyncio.wait_for(main(), 20))


def test_memory_pressure_halves_parking_at_most_every_ten_seconds() -> None:
    async def main() -> None:
        mem = FakeMemory()
        eng, _ = await parked_engine(mem)
        parked = eng.snapshot.parked_bytes
        mem.now = Memory(total=GiB, available=GiB, pressure=35.0)  # free memory, but reclaim stalls
        await until(lambda: eng.snapshot.cache_events["parked_shed"] == 1, 3.0, "one parked session shed", every=0.02)
        assert states(eng)["a"] is None and states(eng)["b"] == "parked"  # the least recently used went
        assert eng.snapshot.park_budget <= parked // 2
        await asyncio.sleep(1.5)  # still under pressure, but avg10 trails: no second cut yet
        assert eng.snapshot.cache_events["parked_shed"] == 1 and states(eng)["b"] == "parked"
        eng.stop()
    asyncio.run(asyncio.wait_for(main(), 20))


# -- saving at shutdown, bounded in time ---------------------------------------------------
def test_saving_stops_at_its_deadline_keeping_the_most_recent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    clock = itertools.count(1000.0, 1.0)  # every look at the clock: one second later (a slow SD card)
    monkeypatch.setattr(persist.time, "monotonic", lambda: next(clock))
    records = [(str(i) * 64, [1, 2, 3], 0, float(idle), b"state") for i, idle in enumerate([30, 10, 20, 40])]
    n = persist.save_all(tmp_path / "state", "fp", records, 1 << 30, deadline=1001.5)  # looks at 1000, 1001, then 1002: late
    assert n == 2
    saved = {s.key for s in persist.scan(tmp_path / "state", "fp")}
    assert saved == {records[1][0], records[2][0]}  # idle 10 s and 20 s: the most recent two
    assert "ran out of time after 2 files" in caplog.text


def test_engine_saves_within_save_timeout(tmp_path: Path) -> None:
    async def main(timeout_s: float) -> int:
        limits = Limits(slots=1, batch_tokens=64, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.0)
        policy = CachePolicy(n_seq=4, state_dir=str(tmp_path / f"s{timeout_s}"), save_timeout_s=timeout_s)
        eng = Engine(lambda: FakeModel(reply="r"), EngineOptions(limits, policy))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        for s in "abc":
            h = eng.submit(list(range(100, 120)), SamplingParams(max_tokens=2), session=s)
            async for _ in h.events():
                pass
        await asyncio.to_thread(eng.stop)
        return len(persist.scan(tmp_path / f"s{timeout_s}", "fake-model|kv f16"))
    assert asyncio.run(main(15.0)) == 3
    assert asyncio.run(main(0.0)) == 0  # out of time before the first: nothing kept, and no hang
