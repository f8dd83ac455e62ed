"""Fair shares on the real model over real HTTP: one client's backlog of long requests does
not hold up another client's first request (the security issue's fairness test)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

import pytest
from helpers.live import Live
from helpers.sse import events_of

from appliance.bench import sse

pytestmark = pytest.mark.integration

A, B = 0, 1  # simulated users: each its own loopback source address, so its own identity


class Stream(threading.Thread):
    """One streamed request; records when its first text and its end arrived, and the
    `: queued N` notes it heard. Stops early (closing the stream: the server cancels the
    request) once `stop` is set."""

    def __init__(self, live: Live, user: int, content: str, max_tokens: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.live, self.user, self.stop = live, user, stop
        self.body = {"messages": [{"role": "user", "content": content}], "stream": True,
                     "max_tokens": max_tokens, "temperature": 0}
        self.first_text_at = 0.0
        self.done_at = 0.0
        self.notes: list[str] = []
        self.status = 0

    def run(self) -> None:
        client = self.live.user_client(self.user)
        with client.stream("POST", "/v1/chat/completions", json=self.body) as r:
            self.status = r.status_code
            if r.status_code != 200:
                return
            for ev in events_of(r, comments=True):
                if isinstance(ev, sse.Comment):
                    self.notes.append(ev.text)
                elif ev == sse.DONE:
                    self.done_at = time.monotonic()
                    return
                elif isinstance(ev, dict) and sse.content(ev) and not self.first_text_at:
                    self.first_text_at = time.monotonic()
                if self.stop.is_set():
                    return


def test_one_clients_backlog_does_not_delay_anothers_first_request(start_server: Callable[..., Live]) -> None:
    live = start_server(slots=1, max_wait_ms=0)
    stop = threading.Event()
    a: list[Stream] = []
    try:
        live.wait_ready()
        # Client A queues 20 long requests (the model counts on and on: 64 tokens each,
        # about 2 s of the only slot each on 2 cores).
        for i in range(20):
            s = Stream(live, A, f"Count from {i + 1} to {i + 300}, separated by commas.", 64, stop)
            s.start()
            a.append(s)
        live.wait_health(lambda h: h["slots"]["busy"] == 1 and h["queue"] == 19, 30, "A's first running, 19 queued")
        # Then client B sends one.
        b = Stream(live, B, "Say hello.", 8, stop)
        b.start()
        b.join(45)
        assert b.status == 200 and b.done_at, "B's request did not finish"
        # B was admitted at the next free slot: after the one of A's that was running when
        # it arrived, before any of A's 19 queued ones (one slot: the admission order is the
        # order of first tokens, and B finished before another of A's started).
        before_b = [s for s in a if s.first_text_at and s.first_text_at < b.first_text_at]
        assert len(before_b) == 1, [s.first_text_at for s in a]
        assert not any(s.first_text_at and s.first_text_at < b.done_at for s in a if s not in before_b)
        # While it waited, B heard it was next (`: queued 1`), not 20th (then perhaps
        # `: busy`: admitted, first token not out yet). A note may carry the wait estimate
        # (`queued 1 eta 3`) once the queue has a pace.
        assert b.notes and all(re.fullmatch(r"queued 1( eta \d+)?|busy", n) for n in b.notes), b.notes
        assert all(s.status == 200 for s in a)  # no per-client cap by default: all 20 accepted
    finally:
        stop.set()  # A's streams close: the server cancels what is left of the backlog
        for s in a:
            s.join(30)
        try:
            live.wait_idle()
        finally:
            assert live.stop() == 0
