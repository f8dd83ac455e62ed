"""Scheduler and session cache behaviour on the real model, over real HTTP."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.live import Live, live_server
from helpers.polling import wait_until
from helpers.sse import events_of

from appliance.bench import sse

pytestmark = pytest.mark.integration

# ~160 tokens: long enough that computing it 8 times would show in the counters.
SYSTEM = {"role": "system", "content": (
    "You are the office assistant of a small architecture firm. Answer briefly and politely. "
    "The office opens at 8 and closes at 18. The printer on the second floor is out of toner; "
    "the one by the kitchen works. Meeting rooms are booked through the shared calendar. "
    "Lunch is ordered every Friday, and the vegetarian option must be chosen by Thursday noon. "
    "Visitors sign in at the front desk and wear a badge. The Wi-Fi network for guests is called "
    "Atelier-Guest. Expense reports are due on the last working day of each month, with receipts. "
    "If someone asks about holidays, point them to the HR handbook in the shared drive. "
    "Never share passwords, and never guess facts you do not know: say you are not sure.")}


def metric(live: Live, name: str) -> float:
    for line in live.client.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not found")


@pytest.fixture(scope="module")
def big(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_server(tmp_path_factory.mktemp("big"), model=bundled_model, slots=8, max_wait_ms=300) as live:
        yield live


def test_shared_system_prompt_is_prefilled_once_for_eight(big: Live) -> None:
    questions = ["Where can I print?", "When does the office open?", "What is the guest Wi-Fi?",
                 "When are expenses due?", "How do I book a room?", "What about lunch on Friday?",
                 "Where do visitors go?", "Can you tell me the admin password?"]
    received0 = metric(big, "appliance_prompt_tokens_received_total")
    computed0 = metric(big, "appliance_prompt_tokens_computed_total")

    def one(i: int) -> dict[str, Any]:
        r = big.client.post("/v1/chat/completions", headers={"X-Session-Id": f"office-session-{i:04d}"},
                            json={"messages": [SYSTEM, {"role": "user", "content": questions[i]}],
                                  "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text
        return dict(r.json())

    with cf.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    received = metric(big, "appliance_prompt_tokens_received_total") - received0
    computed = metric(big, "appliance_prompt_tokens_computed_total") - computed0
    prompt_lens = [a["usage"]["prompt_tokens"] for a in answers]
    cached = sorted(a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers)
    assert received == sum(prompt_lens)
    # One request computed the ~160-token system prompt; the other seven copied it.
    assert cached[0] == 0 and all(c >= 150 for c in cached[1:]), cached
    assert computed == received - sum(cached)
    assert computed < received - 7 * 150


def test_long_paste_never_stalls_a_generating_stream(big: Live) -> None:
    stream_started = threading.Event()
    events: list[Any] = []

    def generate() -> None:
        for ev in big.stream([{"role": "user", "content": "Count from 1 to 200, separated by commas."}],
                             max_tokens=300, temperature=0):
            events.append(ev)
            if len(events) == 3:
                stream_started.set()

    t = threading.Thread(target=generate)
    t.start()
    assert stream_started.wait(540)
    before = len(big.client.get("/debug/steps").json()["steps"])
    paste = "The quarterly report covers revenue, costs and staffing in detail. " * 250  # ~3,000 tokens
    r = big.client.post("/v1/chat/completions", timeout=540, json={  # CI's slower cores: over 120 s
        "messages": [{"role": "user", "content": paste + "\nSummarise this in one sentence."}],
        "max_tokens": 8})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 2500
    steps = big.client.get("/debug/steps").json()["steps"][before:]
    t.join(540)
    assert events[-1] == "[DONE]"
    long_steps = [s for s in steps if s[2] >= 40]  # steps carrying a chunk of the paste
    assert sum(s[2] for s in long_steps) >= 2500
    # Every one of them also advanced the stream that was already generating.
    assert all(decode >= 1 for decode, *_ in long_steps), long_steps


def test_tiny_queue_gives_429_and_accepted_requests_complete(start_server: Callable[..., Live]) -> None:
    live = start_server(slots=1, max_queue=1, max_wait_ms=0)
    try:
        live.wait_ready()

        def one(i: int) -> httpx.Response:
            return live.client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"Say the number {i}."}], "max_tokens": 12})

        with cf.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(one, range(6)))
        codes = [r.status_code for r in results]
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
        for r in results:
            if r.status_code == 429:
                assert r.headers["retry-after"] and r.json()["error"]["type"] == "rate_limit_error"
            else:
                assert r.json()["choices"][0]["message"]["content"]
        assert metric(live, 'appliance_rejected_requests_total{reason="queue_full"}') == codes.count(429)
        live.wait_idle()
    finally:
        assert live.stop() == 0


class Hold(threading.Thread):
    """A ~3,000-token prompt holds a 1-slot server for many seconds, whatever the model says.
    Its own client waits as long as the test may (on CI's slower cores the prompt took over the
    default 120 s); done() joins it and says whether it was answered."""

    def __init__(self, live: Live) -> None:
        super().__init__()
        self.live, self.status = live, 0

    def run(self) -> None:
        paste = "The quarterly report covers revenue, costs and staffing in detail. " * 250
        r = self.live.client.post("/v1/chat/completions", timeout=540, json={
            "messages": [{"role": "user", "content": paste + "Summarise."}], "max_tokens": 5})
        self.status = r.status_code

    def done(self) -> bool:
        self.join(540)
        return self.status == 200


def hold_the_only_slot(live: Live) -> Hold:
    hold = Hold(live)
    hold.start()
    # On the slot before the caller sends anything (a fixed sleep lost this race on a busy machine).
    live.wait_health(lambda h: h["slots"]["busy"] == 1, 120, what="the holding request on the slot")
    return hold


def test_queued_stream_hears_its_position(start_server: Callable[..., Live]) -> None:
    # The queue's own timeout is out of the way: on a machine busy with other work the held
    # slot's ~3,000-token prompt took over the default 120 s, and this test is about the note.
    live = start_server(slots=1, max_wait_ms=0, queue_timeout_s=540)
    try:
        live.wait_ready()
        hold = hold_the_only_slot(live)
        body = {"messages": [{"role": "user", "content": "Say hi."}], "stream": True, "max_tokens": 5}
        with live.client.stream("POST", "/v1/chat/completions", json=body) as r:
            events = list(events_of(r, comments=True))
        assert hold.done()
        assert sse.Comment("queued 1") in events
        assert [e for e in events if not isinstance(e, sse.Comment)][-1] == sse.DONE
    finally:
        assert live.stop() == 0


def test_second_turn_prefills_only_its_new_tokens(big: Live) -> None:
    history = [SYSTEM, {"role": "user", "content": "Which printer works?"}]
    r1 = big.client.post("/v1/chat/completions", headers={"X-Session-Id": "turns-session-0001"},
                         json={"messages": history, "max_tokens": 30, "temperature": 0}).json()
    history += [r1["choices"][0]["message"], {"role": "user", "content": "And on which floor is the other one?"}]
    r2 = big.client.post("/v1/chat/completions", headers={"X-Session-Id": "turns-session-0001"},
                         json={"messages": history, "max_tokens": 10, "temperature": 0}).json()
    u1, u2 = r1["usage"], r2["usage"]
    new_tokens = u2["prompt_tokens"] - u1["prompt_tokens"] - u1["completion_tokens"]
    computed = u2["prompt_tokens"] - u2["prompt_tokens_details"]["cached_tokens"]
    # Only the new user turn (+ the template's few glue tokens) is computed.
    assert computed <= new_tokens + 4, (computed, new_tokens)
    info = big.client.get("/v1/sessions/turns-session-0001").json()
    assert info["state"] == "cached" and info["cached_tokens"] >= u2["prompt_tokens"]


def test_deleted_session_cache_is_gone(big: Live) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "Tell me about lunch."}]
    r = big.client.post("/v1/chat/completions", headers={"X-Session-Id": "delete-me-session-01"},
                        json={"messages": msgs, "max_tokens": 8})
    assert r.status_code == 200
    assert big.client.get("/v1/sessions/delete-me-session-01").status_code == 200
    assert big.client.delete("/v1/sessions/delete-me-session-01").status_code == 204
    wait_until(lambda: big.client.get("/v1/sessions/delete-me-session-01").status_code == 404, 10,
               "the deleted session gone")
    assert big.client.delete("/v1/sessions/delete-me-session-01").status_code == 404
    r = big.client.post("/v1/chat/completions", headers={"X-Session-Id": "delete-me-session-01"},
                        json={"messages": msgs, "max_tokens": 8}).json()
    # Only the shared system prompt can be reused now, not the deleted conversation.
    shared = r["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert shared < r["usage"]["prompt_tokens"] - 5


def test_more_conversations_than_slots_keep_their_history(start_server: Callable[..., Live]) -> None:
    # 2 slots and room for 1 idle session in the KV cache: 5 users must be parked in RAM
    # between turns, and restored instead of recomputed.
    live = start_server(slots=2, cached_sessions=1, restore_min_tokens=32, park_ram_mb=256)
    try:
        live.wait_ready()
        users = [f"user-{i}" for i in range(5)]
        hist = {u: [SYSTEM, {"role": "user", "content": f"My name is {u}. Remember it and say hello."}]
                for u in users}
        overhead: list[int] = []

        def turn(u: str, text: str) -> None:
            r = live.client.post("/v1/chat/completions", headers={"X-Session-Id": f"{u}-session-0000"},
                                 json={"messages": hist[u], "max_tokens": 12, "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            hist[u] = hist[u] + [body["choices"][0]["message"], {"role": "user", "content": text}]
            usage = body["usage"]
            overhead.append(usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"])

        with cf.ThreadPoolExecutor(5) as pool:
            list(pool.map(lambda u: turn(u, "What is my name?"), users))
        first = list(overhead)
        overhead.clear()
        for text in ("And what did I ask first?", "Thanks, bye."):
            before = len(overhead)
            with cf.ThreadPoolExecutor(5) as pool:
                list(pool.map(lambda u: turn(u, text), users))
            # Later turns compute only their new user message and the template glue.
            assert max(overhead[before:]) <= 30, overhead
        assert min(first) > 10  # the first turns had everything but the system prompt to do
        h = live.health()["sessions"]
        assert h["parked"] + h["cached"] >= 5 - 2
        assert h["restored"] >= 3, h
    finally:
        assert live.stop() == 0


def _two_turns_across_restart(start_server: Callable[..., Live], tmp: Path, damage: Any = None) -> tuple[dict[str, Any], Live]:
    state = tmp / "state"
    history = [SYSTEM, {"role": "user", "content": "Please remember the code word: pelican. Say OK."}]
    live = start_server(state_dir=state)
    live.wait_ready()
    r1 = live.client.post("/v1/chat/completions", headers={"X-Session-Id": "restart-me-session-01"},
                          json={"messages": history, "max_tokens": 10, "temperature": 0}).json()
    assert live.stop() == 0
    files = list(state.glob("*.kv"))
    assert len(files) == 1 and "restart-me-session-01" not in files[0].name  # ids never become file names
    if damage is not None:
        damage(files[0])
    history += [r1["choices"][0]["message"], {"role": "user", "content": "What was the code word?"}]
    live = start_server(state_dir=state)
    live.wait_ready()
    r2 = live.client.post("/v1/chat/completions", headers={"X-Session-Id": "restart-me-session-01"},
                          json={"messages": history, "max_tokens": 10, "temperature": 0})
    assert r2.status_code == 200, r2.text
    return {"turn1": r1["usage"], "turn2": r2.json()["usage"]}, live


def test_restart_keeps_a_conversations_cache(start_server: Callable[..., Live], tmp_path: Path) -> None:
    usage, live = _two_turns_across_restart(start_server, tmp_path)
    try:
        u1, u2 = usage["turn1"], usage["turn2"]
        assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"] + u1["completion_tokens"] - 1
        assert live.health()["sessions"]["restored"] == 1
    finally:
        assert live.stop() == 0


def test_truncated_state_file_is_discarded_cleanly(start_server: Callable[..., Live], tmp_path: Path) -> None:
    def truncate(p: Path) -> None:
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])

    usage, live = _two_turns_across_restart(start_server, tmp_path, truncate)
    try:
        u2 = usage["turn2"]
        # Nothing of the conversation was restored; it was recomputed and answered.
        assert u2["prompt_tokens_details"]["cached_tokens"] == 0
        assert "discarding session state" in live.log() and "truncated" in live.log()
        assert live.health()["sessions"]["restored"] == 0
    finally:
        assert live.stop() == 0


def test_corrupt_state_payload_is_discarded_cleanly(start_server: Callable[..., Live], tmp_path: Path) -> None:
    def flip(p: Path) -> None:
        data = bytearray(p.read_bytes())
        data[-100] ^= 0xFF  # same size, damaged payload: only the checksum can tell
        p.write_bytes(bytes(data))

    usage, live = _two_turns_across_restart(start_server, tmp_path, flip)
    try:
        assert usage["turn2"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert "checksum mismatch" in live.log()
    finally:
        assert live.stop() == 0


def test_queue_timeout_is_503_or_an_in_stream_error(start_server: Callable[..., Live]) -> None:
    live = start_server(slots=1, max_wait_ms=0, queue_timeout_s=1.5)
    try:
        live.wait_ready()
        hold = hold_the_only_slot(live)
        # Not streamed: a plain 503 with Retry-After.
        r = live.chat([{"role": "user", "content": "Say hi."}], max_tokens=5)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["type"] == "server_unavailable"
        # Streamed: the 200 is already sent, so the error arrives as one event, then the end.
        events = list(live.stream([{"role": "user", "content": "Say hi."}], max_tokens=5))
        assert isinstance(events[-1], dict) and events[-1]["error"]["type"] == "server_unavailable"
        assert "[DONE]" not in events
        assert hold.done()
        assert live.wait_idle()["engine"]["finished"]["queue_timeout"] == 2
    finally:
        assert live.stop() == 0
