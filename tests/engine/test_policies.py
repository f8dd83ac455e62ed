"""The scheduler's policies alone (engine/policy/), each without the Scheduler: the
admission window, fair shares, the background lane, chunked prefill. test_scheduler.py
covers them as the Scheduler composes them."""

from __future__ import annotations

from itertools import count

from helpers.fakes import FakeClock

from appliance.engine.events import Report
from appliance.engine.plan import Limits, Step
from appliance.engine.policy.admission import Window
from appliance.engine.policy.chunking import Chunking
from appliance.engine.policy.fairness import Fairness
from appliance.engine.policy.lanes import BACKGROUND_ALONE_ROWS, Lanes
from appliance.engine.turn import Lane, State, Turn
from appliance.sampling import SamplingParams

_rid = count(1)


def limits(**kw: object) -> Limits:
    base: dict[str, object] = dict(slots=8, batch_tokens=64, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.05)
    base.update(kw)
    return Limits(**base)  # type: ignore[arg-type]


def turn(at: float, client: str = "c", n_prompt: int = 10, lane: Lane = Lane.PEOPLE) -> Turn:
    return Turn(rid=next(_rid), prompt=list(range(1, n_prompt + 1)), params=SamplingParams(max_tokens=8),
                arrival=at, client=client, lane=lane)


def test_window_holds_an_idle_engine_until_enough_arrive_or_time_is_up() -> None:
    clock = FakeClock()
    w = Window(limits(slots=4, min_batch=2), clock)
    first = turn(clock())
    assert w.closes([first], running=False) == clock() + 0.05
    assert w.closes([first], running=True) is None  # busy: no window
    assert w.closes([first, turn(clock())], running=False) is None  # min_batch reached
    clock.advance(0.06)
    assert w.closes([first], running=False) is None  # closed


def test_window_holds_background_work_alone_longer() -> None:
    clock = FakeClock()
    w = Window(limits(background_hold_s=0.5), clock)
    title = turn(clock(), lane=Lane.BACKGROUND)
    assert w.closes([title], running=False) == clock() + 0.5
    assert w.closes([title, turn(clock())], running=False) == clock() + 0.05  # a person came


def test_fairness_takes_clients_in_turn() -> None:
    clock = FakeClock()
    f = Fairness(limits(), clock)
    a1, a2, a3 = (turn(clock() + i, "A") for i in range(3))
    b1 = turn(clock() + 5, "B")
    assert f.order([a1, a2, a3, b1], [], clock()) == [a1, b1, a2, a3]
    assert f.order([a1, a2], [], clock()) == [a1, a2]  # one client: its own order


def test_fairness_puts_a_client_with_a_backlog_after_a_fresh_one() -> None:
    clock = FakeClock()
    f = Fairness(limits(), clock)
    served = turn(clock(), "A")
    f.admitted(served, clock())
    backlog = turn(clock() + 1, "A")  # sent while A's first turn runs
    fresh = turn(clock() + 2, "B")  # arrived later, but B waits on nothing
    assert f.order([backlog, fresh], [served], clock() + 3) == [fresh, backlog]


def test_fairness_remembers_when_a_client_went_idle_and_forgets_absent_clients() -> None:
    clock = FakeClock()
    f = Fairness(limits(), clock)
    one, two = turn(clock(), "A"), turn(clock(), "A")
    f.admitted(one, clock())
    f.admitted(two, clock())
    f.ended(one, [two])  # A still runs `two`: not idle
    assert ("A", Lane.PEOPLE) not in f.idle_since
    clock.advance(1)
    f.ended(two, [])
    assert f.idle_since[("A", Lane.PEOPLE)] == clock()
    f.forget([], [])
    assert f.last_admitted == {} and f.idle_since == {}


def test_lanes_keep_slots_for_people() -> None:
    lanes = Lanes(limits(slots=8))  # kept_for_people 2, background_cap 1
    bg = turn(0.0, lane=Lane.BACKGROUND)
    assert not lanes.holds_back(bg, free=3, running=[])
    assert lanes.holds_back(bg, free=2, running=[])  # the last two free slots are people's
    assert lanes.holds_back(bg, free=5, running=[turn(0.0, lane=Lane.BACKGROUND)])  # at its cap
    assert not lanes.holds_back(turn(0.0), free=1, running=[])  # people are never held back


def test_lanes_give_background_work_a_tenth_of_peoples_rows() -> None:
    lanes = Lanes(limits(batch_tokens=64, prefill_chunk=32))
    assert lanes.background_rows(Step()) == min(32, BACKGROUND_ALONE_ROWS)  # alone: short steps
    people = Step(decode=[turn(0.0) for _ in range(25)])
    assert lanes.background_rows(people) == 2
    assert lanes.background_rows(Step(decode=[turn(0.0)])) == 1  # at least one


def test_chunking_finishes_short_prompts_together_and_chunks_long_ones_beside_streams() -> None:
    c = Chunking(limits(batch_tokens=64, prefill_chunk=8, prefill_group=20))
    short, other, long = turn(0.0, n_prompt=6), turn(0.0, n_prompt=10), turn(0.0, n_prompt=300)
    assert c.budget(0, [short, other, long]) == 16  # nobody streams: the group, finished now
    assert c.budget(3, [short, other, long]) == 16 + 8  # streams: the group, then one chunk
    assert c.budget(3, [long]) == 8
    assert c.budget(0, [long]) == 64  # nobody streams, no group: a full step


def test_chunking_reads_a_long_paste_in_about_prefill_steps_pieces() -> None:
    c = Chunking(limits(batch_tokens=512, prefill_chunk=64, prefill_steps=4))
    assert c.chunk([turn(0.0, n_prompt=700)]) == 175
    assert c.chunk([turn(0.0, n_prompt=4000)]) == 256  # at most half a step
    assert c.chunk([turn(0.0, n_prompt=100)]) == 64  # never below prefill_chunk


def test_chunking_gives_a_reporting_long_prompt_a_short_first_step() -> None:
    c = Chunking(limits(batch_tokens=64, prefill_chunk=8))
    long = turn(0.0, n_prompt=300)
    assert c.first(long) == long.prefill_left  # no one hears its progress
    long.progress = Report.LONG
    assert c.first(long) == 8
    long.n_cached = 8
    long.state = State.PREFILL
    assert c.first(long) == long.prefill_left  # its first step is done
