"""The queue notes' wait estimate (`: queued N eta S`): the step in progress, the places the
next admission takes, the pace answers have ended lately beyond them, and the first step."""

from __future__ import annotations

import dataclasses
from collections import deque

from appliance.engine.pace import PACE_WINDOW_S, wait_estimate
from appliance.engine.snapshot import Snapshot


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Board:
    """What the engine publishes for the estimate (answers' ends and serving times, the step
    in progress), and the estimate read from it as the HTTP side reads it."""

    def __init__(self, clock: Clock, slots: int, admissible: int, step_s: float, step_ends: float) -> None:
        self.clock = clock
        self.snap = Snapshot(slots=slots, admissible=admissible, step_s=step_s, step_ends=step_ends)
        self.finished: deque[float] = deque(maxlen=32)
        self.served: deque[float] = deque(maxlen=32)

    @property
    def step_ends(self) -> float:
        return self.snap.step_ends

    @step_ends.setter
    def step_ends(self, value: float) -> None:
        self.snap = dataclasses.replace(self.snap, step_ends=value)

    def note_served(self, started: float) -> None:
        """An answer that started at `started` ended now (as engine/figures.py records it)."""
        self.finished.append(self.clock.now)
        self.served.append(self.clock.now - started)

    def wait_estimate(self, position: int) -> int | None:
        snap = dataclasses.replace(self.snap, finished_at=tuple(self.finished), served_s=tuple(self.served))
        return wait_estimate(snap, position, self.clock.now)

    @property
    def engine(self) -> Board:  # the tests below set the step in progress as app.engine.step_ends
        return self


def app_at(clock: Clock, slots: int = 16, admissible: int = 0, step_s: float = 0.0, step_ends: float = 0.0) -> Board:
    return Board(clock, slots, admissible, step_s, step_ends)


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


def test_a_place_the_next_admission_takes_waits_for_the_step_in_progress_and_its_own() -> None:
    # An office at capacity on 24 slots: slots are free, and a newcomer waits for the step
    # in progress (a pasted page's chunk: 1.4 s more) and then the step that reads its
    # prompt (0.5 s). Counting answers said 1 s where people waited 2.
    clock = Clock()
    app = app_at(clock, admissible=3, step_s=0.5, step_ends=clock.now + 1.4)
    for _ in range(8):  # answers ending every 1 s: not what this place waits for
        clock.now += 1.0
        app.note_served(clock.now - 10.0)
    app.engine.step_ends = clock.now + 1.4
    assert app.wait_estimate(1) == 2  # ceil(1.4 + 0.5)
    assert app.wait_estimate(3) == 2
    # The fourth place needs an answer to end first: 1 s apart.
    assert app.wait_estimate(4) == 3  # ceil(1.4 + 1 + 0.5)
    assert app.wait_estimate(6) == 5
    app.engine.step_ends = 0.0  # between steps: the next one starts now
    assert app.wait_estimate(1) == 1


def test_a_step_already_late_counts_as_ending_now() -> None:
    clock = Clock()
    app = app_at(clock, admissible=1, step_s=0.8, step_ends=clock.now - 2.0)
    assert app.wait_estimate(1) == 1


def test_nothing_run_yet_no_estimate_even_with_slots_free() -> None:
    assert app_at(Clock(), admissible=4).wait_estimate(1) is None
