"""The published step log: a snapshot shares the log's frozen blocks and copies the open one."""

from __future__ import annotations

import pytest

from appliance.engine.snapshot import StepLog, StepLogView


def rows(a: int, b: int) -> list[tuple[int, int, int, int]]:
    return [(i, 0, 0, 0) for i in range(a, b)]


def test_a_view_reads_the_last_rows_oldest_first_and_stays_as_it_was() -> None:
    log = StepLog(size=8, block=4)
    for r in rows(0, 6):
        log.append(r)
    view = log.view()
    assert list(view) == rows(0, 6) and len(view) == 6
    for r in rows(6, 13):
        log.append(r)
    assert list(view) == rows(0, 6)  # published: later steps do not reach it
    later = log.view()
    # Two frozen blocks are kept (size 8), the oldest dropped whole, and the open block.
    assert list(later) == rows(4, 13)


def test_a_view_is_a_sequence_with_indexes_and_slices() -> None:
    log = StepLog(size=8, block=4)
    for r in rows(0, 7):
        log.append(r)
    view = log.view()
    assert view[0] == (0, 0, 0, 0) and view[4] == (4, 0, 0, 0) and view[-1] == (6, 0, 0, 0)
    assert view[5:] == tuple(rows(5, 7)) and view[len(view):] == ()
    with pytest.raises(IndexError):
        view[7]
    assert list(StepLogView()) == [] and len(StepLogView()) == 0


def test_the_frozen_blocks_are_shared_between_views_not_copied() -> None:
    log = StepLog(size=8, block=4)
    for r in rows(0, 5):
        log.append(r)
    a, b = log.view(), log.view()
    assert a._blocks[0] is b._blocks[0]
