"""The inbox: the one place that counts the queue and each client's open requests."""

from __future__ import annotations

from itertools import count

import pytest

from appliance.engine.inbox import Cancel, DeleteSession, Inbox, Submit
from appliance.engine.turn import Turn
from appliance.errors import QueueFull, Unavailable
from appliance.sampling import SamplingParams

_rid = count(1)


def turn(client: str = "") -> Turn:
    return Turn(rid=next(_rid), prompt=[1, 2], params=SamplingParams(), arrival=0.0, client=client)


def test_full_queue_raises_429() -> None:
    box = Inbox(max_queue=2)
    box.submit(turn())
    box.submit(turn())
    with pytest.raises(QueueFull) as e:
        box.submit(turn())
    assert e.value.status == 429 and e.value.retry_after and e.value.code == "queue_full"
    # Admitting one frees a place in the queue (the request still counts as open).
    box.dequeued()
    box.submit(turn())
    assert box.n_open == 3


def test_per_client_cap_counts_running_and_queued_per_identity() -> None:
    box = Inbox(max_queue=10, max_per_client=2)
    a1, a2 = turn("a"), turn("a")
    box.submit(a1)
    box.submit(a2)
    box.dequeued(2)  # both running now: still counted for client a
    with pytest.raises(QueueFull) as e:
        box.submit(turn("a"))
    assert e.value.code == "client_cap"
    box.submit(turn("b"))  # another client is not affected
    box.finished(a1)
    box.submit(turn("a"))
    assert box.n_open == 3


def test_take_returns_commands_in_order_and_empties() -> None:
    box = Inbox(max_queue=10)
    t = turn()
    box.submit(t)
    box.put(Cancel(t.rid))
    d = DeleteSession("s")
    box.put(d)
    got = box.take()
    assert [type(c) for c in got] == [Submit, Cancel, DeleteSession] and got[0].turn is t
    assert box.take() == []


def test_close_refuses_new_requests_and_hands_back_the_rest() -> None:
    box = Inbox(max_queue=10)
    t = turn()
    box.submit(t)
    pending = box.close()
    assert [c.turn for c in pending if isinstance(c, Submit)] == [t]
    with pytest.raises(Unavailable):
        box.submit(turn())
