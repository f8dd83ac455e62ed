"""pace.StepClock: the forecast of the engine's steps from the calls it just ran (the queue
notes' wait estimate reads it)."""

from __future__ import annotations

import pytest

from appliance.engine.pace import CallCost, StepClock
from appliance.engine.scheduler import Step
from appliance.engine.turn import Turn
from appliance.sampling import SamplingParams


def turn() -> Turn:
    return Turn(rid=1, prompt=[1, 2, 3], params=SamplingParams(max_tokens=4), arrival=0.0)


def test_nothing_seen_nothing_forecast() -> None:
    assert CallCost().predict(20) == 0.0
    assert StepClock().forecast([Step(decode=[turn()])]) == 0.0


def test_a_fixed_cost_and_a_cost_per_row_are_learned() -> None:
    # A stream call costs the pass over the weights (~60 ms here) plus ~8 ms a row.
    cost = CallCost()
    for rows in (4, 9, 12, 17, 6, 20, 11) * 4:
        cost.observe(rows, 0.060 + 0.008 * rows)
    assert cost.predict(10) == pytest.approx(0.140, rel=0.01)
    assert cost.predict(24) == pytest.approx(0.252, rel=0.01)


def test_calls_of_one_size_give_the_mean_per_row() -> None:
    cost = CallCost()
    for _ in range(5):
        cost.observe(118, 0.80)
    assert cost.predict(118) == pytest.approx(0.80)
    assert cost.predict(236) == pytest.approx(1.60)


def test_recent_calls_weigh_most() -> None:
    cost = CallCost()
    for _ in range(50):
        cost.observe(100, 1.0)
    for _ in range(50):  # the machine got busier (or the cache fuller): 2x slower
        cost.observe(100, 2.0)
    assert cost.predict(100) == pytest.approx(2.0, rel=0.1)


def test_a_split_step_is_forecast_as_its_two_calls() -> None:
    clock = StepClock()
    t = turn()
    streams, chunk = Step(decode=[t] * 9), Step(prefill=[(t, 118)])
    for _ in range(10):
        clock.called(streams, 9, 0.145)
        clock.called(chunk, 118, 0.790)
        clock.stepped(0.95)
    assert clock.forecast([chunk, streams]) == pytest.approx(0.935, rel=0.01)
    assert clock.forecast([streams]) == pytest.approx(0.145, rel=0.01)
    assert clock.step_s == pytest.approx(0.95)
