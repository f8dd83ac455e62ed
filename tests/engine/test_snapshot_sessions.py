"""The snapshot's sessions view (EngineCore._sessions_view): reused while no session
changes, rebuilt when one does."""

from __future__ import annotations

from helpers.engines import make
from helpers.fakes import FakeModel


def test_the_sessions_view_is_reused_while_no_session_changes() -> None:
    c = make(FakeModel(reply="hi"), slots=2, n_seq=4)
    c.submit(list(range(100, 120)), client="A", session="s1")
    c.run()
    first = c.core.snapshot().sessions
    assert set(first) == {"s1"} and first["s1"].state == "cached"
    c.clock.advance(1)
    c.step()  # an idle iteration: nothing changes a session
    again = c.core.snapshot()
    assert again.sessions is first  # the same mapping, not rebuilt
    assert again.taken_at == c.clock()  # the rest of the snapshot is new


def test_the_sessions_view_is_rebuilt_when_a_session_changes() -> None:
    c = make(FakeModel(reply="hi"), slots=2, n_seq=4)
    c.submit(list(range(100, 120)), client="A", session="s1")
    c.run()
    before = c.core.snapshot().sessions
    c.clock.advance(1)
    c.submit(list(range(200, 220)), client="B", session="s2")  # a new session
    c.run()
    after = c.core.snapshot().sessions
    assert after is not before and set(after) == {"s1", "s2"}
    assert set(before) == {"s1"}  # a view handed out never changes
    c.clock.advance(1)
    c.submit(list(range(100, 120)) + [1, 2, 3], client="A", session="s1")  # s1 used again
    c.step()  # admitted and running: its entry is busy
    running = c.core.snapshot().sessions
    assert running is not after and running["s1"].state == "active"
    c.run()
    done = c.core.snapshot().sessions
    assert done["s1"].state == "cached" and done["s1"].last_used > after["s1"].last_used
    assert c.core.kv.drop_session("s2")
    assert set(c.core.snapshot().sessions) == {"s1"}
