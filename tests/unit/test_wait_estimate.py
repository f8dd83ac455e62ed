"""The queue notes' wait estimate (`: queued N eta S`): the pace answers have ended lately."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from appliance.http.state import PACE_WINDOW_S, App
from appliance.http.validate import RequestBounds


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def app_at(clock: Clock, slots: int = 16) -> App:
    engine = cast(Any, SimpleNamespace(snapshot=SimpleNamespace(slots=slots)))
    app = App(engine, "m", RequestBounds(default_max_tokens=32, max_tokens_limit=64, ctx_limit=512))
    app.clock = clock
    return app


def test_no_answers_yet_no_estimate() -> None:
    assert app_at(Clock()).wait_estimate(3) is None


def test_position_times_the_pace_answers_ended_at() -> None:
    clock = Clock()
    app = app_at(clock)
    for _ in range(8):  # one answer ending every 2 s, each having streamed 10 s
        clock.now += 2.0
        app.note_served(clock.now - 10.0)
    # 8 answers in the 16 s since the first: 2 s apart. Third in the queue: 6 s. The old
    # guess (10 s held / 16 slots per place) would have said 2.
    assert app.wait_estimate(3) == 6
    assert app.wait_estimate(1) == 2


def test_the_pace_slows_while_nothing_ends() -> None:
    clock = Clock()
    app = app_at(clock)
    for _ in range(4):
        clock.now += 1.0
        app.note_served(clock.now - 5.0)
    assert app.wait_estimate(2) == 2
    clock.now += 8.0  # nothing ended since: 4 answers in 11 s
    assert app.wait_estimate(2) == 6


def test_after_a_lull_the_served_times_guess_until_the_pace_is_known_again() -> None:
    clock = Clock()
    app = app_at(clock, slots=4)
    for _ in range(6):
        clock.now += 1.0
        app.note_served(clock.now - 8.0)
    clock.now += PACE_WINDOW_S + 1  # a quiet hour's minute: those ends are forgotten
    app.note_served(clock.now - 8.0)
    assert app.wait_estimate(2) == 4  # 2 places x 8 s held / 4 slots
