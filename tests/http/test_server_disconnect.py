"""A client that gives up on a whole (non-streamed) answer leaves nothing in the log: the
request is cancelled quietly (pipeline.collect), with no asyncio "exception was never
retrieved" traceback for the gathered choices. Found by the reliability suite
(tests/ops/test_reliability_live.py), checked here over the fake model in a second."""

from __future__ import annotations

import gc
import logging

import httpx
import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, USER, Served, is_idle


def test_a_whole_answer_given_up_logs_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    model = FakeModel(reply="x" * 300, delay=0.005)
    caplog.set_level(logging.ERROR)
    with Served(lambda: model, slots=1) as srv:
        for n in (1, 2):  # n=2 choices: gathered, the case that logged
            with pytest.raises(httpx.ReadTimeout):
                srv.user(0, timeout=0.2).post(CHAT, json={"messages": USER, "max_tokens": 300, "n": n})
            srv.health(is_idle)
        h = srv.health(is_idle)
        assert h["engine"]["finished"] == {"cancelled": 3}
    gc.collect()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
