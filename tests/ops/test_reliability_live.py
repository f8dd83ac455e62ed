"""The reliability suite (issue 12, part 3) against the real server on the bundled model:
overload, a soak at capacity, and faults (a failing decode, SIGKILL while saving sessions,
a state_dir that cannot be written, clients that vanish in every state).

Each test prints one line of figures (`pytest -s` shows them); docs/RELIABILITY.md records
them with the command that produced them. No assertion is about speed: the deadlines only
catch a hang, and are generous because other work may share the cores.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import resource
import secrets
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.live import Live
from helpers.polling import wait_until
from helpers.sse import content_of, events_of

from appliance.bench import sse, user_address
from appliance.library.store import FILE_NAME as LIBRARY_FILE
from appliance.usage.store import FILE_NAME as USAGE_FILE

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence."}
QUESTIONS = ["Name a colour.", "Name a city in France.", "What is 3+4?", "Say hello in Spanish.",
             "Name a tree.", "What day follows Monday?", "Name a metal.", "Name a planet.",
             "What is the opposite of hot?", "Name a fruit.", "Name an ocean.", "What is 10-7?"]
HANG_S = 300  # a request with no outcome after this long is lost (hung): far beyond any real wait


# -- helpers -------------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def metrics(live: Live) -> dict[str, float]:
    """The /metrics samples by name (with labels), e.g. 'appliance_requests_total{outcome="stop"}'."""
    r = live.client.get("/metrics")
    assert r.status_code == 200, r.text
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def parks(live: Live) -> int:
    """Sessions parked so far (an event count; /health's sessions.parked is the current count)."""
    return int(metrics(live).get('appliance_session_events_total{event="parked"}', 0))


def finished(live: Live) -> Counter[str]:
    return Counter(live.health()["engine"]["finished"])


def assert_idle(live: Live, timeout: float = 60) -> dict[str, Any]:
    """No slot busy and nothing queued, in /health and /metrics alike, and no session running."""
    h = live.wait_idle(timeout)
    m = metrics(live)
    assert m["appliance_slots_active"] == 0 and m["appliance_queue_depth"] == 0, m
    assert m["appliance_slots_idle"] == h["slots"]["total"]
    return h


def served(live: Live, user: int | None = None) -> str:
    """The next request is served: a complete answer."""
    r = live.chat([SYSTEM, {"role": "user", "content": "Say OK."}], as_user=user, max_tokens=8, temperature=0)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] and choice["finish_reason"] in ("stop", "length"), choice
    return str(choice["message"]["content"])


def no_crash(live: Live) -> None:
    log = live.log()
    assert "Traceback" not in log and "engine loop crashed" not in log, log[-3000:]


def refusal(r: httpx.Response) -> str:
    """'429' or '503' for a clear refusal with an OpenAI-style error body; 'lost' otherwise."""
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return "lost"
    if r.status_code in (429, 503) and err.get("message") and err.get("type") in ("rate_limit_error",
                                                                                    "server_unavailable"):
        return str(r.status_code)
    return "lost"


def ask(client: httpx.Client, body: dict[str, Any], headers: dict[str, str] | None = None
        ) -> tuple[str, str, httpx.Headers | None]:
    """One chat request to its end: ('answered', text, headers), ('429' | '503', message, headers)
    or ('lost', why, None). A stream counts as answered only with content, a finish_reason and
    [DONE]; an in-stream error event for a queue timeout is a 503 (the 200 was already sent)."""
    try:
        if not body.get("stream"):
            r = client.post("/v1/chat/completions", json=body, headers=headers)
            if r.status_code != 200:
                kind = refusal(r)
                return kind, r.text[:200], r.headers
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] or ""
            if text.strip() and choice["finish_reason"] in ("stop", "length"):
                return "answered", text, r.headers
            return "lost", f"incomplete answer {choice}", None
        with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                r.read()
                return refusal(r), r.text[:200], r.headers
            text, reason, done, error = "", None, False, None
            for ev in events_of(r):
                if ev == sse.DONE:
                    done = True
                elif isinstance(ev, dict) and "error" in ev:
                    error = ev["error"]
                elif isinstance(ev, dict):
                    text += sse.content(ev)
                    for ch in ev.get("choices") or []:
                        reason = ch.get("finish_reason") or reason
            if error is not None:
                if error.get("type") == "server_unavailable" and error.get("message") and not done:
                    return "503", str(error["message"]), r.headers
                return "lost", f"error event {error}", None
            if done and reason in ("stop", "length") and text.strip():
                return "answered", text, r.headers
            return "lost", f"stream ended without an answer: done={done} reason={reason} text={text!r}", None
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return "lost", repr(e), None


class Raw:
    """One chat request on a raw socket, so the test drops the connection exactly when it
    chooses (a client that goes away: a closed laptop, a killed script)."""

    def __init__(self, live: Live, body: dict[str, Any], user: int, session: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", live.port), timeout=30,
                                             source_address=(user_address(user), 0))
        data = json.dumps(body).encode()
        head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n" + (f"X-Session-Id: {session}\r\n" if session else "") + "\r\n")
        self.sock.sendall(head.encode() + data)
        self.received = b""

    def read_until(self, enough: Callable[[bytes], bool], timeout: float = 120) -> bytes:
        deadline = time.monotonic() + timeout
        while not enough(self.received):
            assert time.monotonic() < deadline, f"no such reply within {timeout} s: {self.received[-300:]!r}"
            self.sock.settimeout(max(0.1, deadline - time.monotonic()))
            part = self.sock.recv(65536)
            assert part, f"the server closed: {self.received[-300:]!r}"
            self.received += part
        return self.received

    def drop(self) -> None:
        self.sock.close()


def content_chunks(data: bytes) -> int:
    return len(re.findall(rb'"delta":\{"content":"[^"]', data))


def cancelled_lines(live: Live, user: int) -> list[tuple[int, int, int]]:
    """(prompt, reused, output) of each request of `user` the log says was cancelled."""
    pat = re.compile(rf"client {re.escape(user_address(user))}: cancelled, prompt (\d+) \(reused (\d+)\), output (\d+)")
    return [(int(a), int(b), int(c)) for a, b, c in pat.findall(live.log())]


# -- overload ------------------------------------------------------------------------------
OVERLOAD_SLOTS = 4
OVERLOAD_CLIENTS = 4 * OVERLOAD_SLOTS
OVERLOAD_PER_CLIENT = 4


def test_overload_every_request_is_answered_or_clearly_refused(start_server: Callable[..., Live]) -> None:
    """4x the slot count in concurrent clients, a fixed number of requests each, streamed and
    not: each ends in a complete answer or a 429/503 with an OpenAI error body, and the
    server's own counters agree with what the clients saw."""
    live = start_server(slots=OVERLOAD_SLOTS, max_queue=8, queue_timeout_s=6, kv_tokens=8192, ctx_per_slot=1024)
    before = finished(live)
    peak_queue = 0
    stop_watch = threading.Event()

    def watch() -> None:
        nonlocal peak_queue
        while not stop_watch.wait(0.2):
            peak_queue = max(peak_queue, live.health()["queue"])

    def client(i: int) -> list[tuple[str, str]]:
        out = []
        for k in range(OVERLOAD_PER_CLIENT):
            q = QUESTIONS[(i + k) % len(QUESTIONS)]
            body = {"messages": [SYSTEM, {"role": "user", "content": q}], "max_tokens": 24, "temperature": 0,
                    "stream": (i + k) % 2 == 0}
            kind, detail, _ = ask(live.user_client(i), body)
            out.append((kind, detail))
            if kind in ("429", "503"):
                time.sleep(0.5)  # a polite client backs off a little, then asks its next question
        return out

    t0 = time.monotonic()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with cf.ThreadPoolExecutor(OVERLOAD_CLIENTS) as pool:
        futures = [pool.submit(client, i) for i in range(OVERLOAD_CLIENTS)]
        results = [x for f in futures for x in f.result(timeout=HANG_S * OVERLOAD_PER_CLIENT)]
    stop_watch.set()
    watcher.join()
    elapsed = time.monotonic() - t0
    kinds = Counter(kind for kind, _ in results)
    lost = [detail for kind, detail in results if kind == "lost"]

    h = assert_idle(live)
    m = metrics(live)
    after = finished(live)
    print(f"\noverload: {len(results)} requests from {OVERLOAD_CLIENTS} clients on {OVERLOAD_SLOTS} slots "
          f"(max_queue 8, queue_timeout 6 s) in {elapsed:.0f} s: {kinds['answered']} answered, "
          f"{kinds['429']} refused 429, {kinds['503']} refused 503, {len(lost)} lost; peak queue {peak_queue}; "
          f"after: {h['slots']['busy']} busy, {h['queue']} queued")
    assert len(results) == OVERLOAD_CLIENTS * OVERLOAD_PER_CLIENT
    assert not lost, lost[:5]
    assert kinds["answered"] > 0 and kinds["429"] > 0  # 16 arriving at once exceed 4 running + 8 queued
    # The server's view matches the clients': every admitted request finished once, as seen.
    delta = after - before
    assert delta["stop"] + delta["length"] == kinds["answered"], (delta, kinds)
    assert delta["queue_timeout"] == kinds["503"], (delta, kinds)
    assert set(delta) <= {"stop", "length", "queue_timeout"}, delta
    assert m['appliance_rejected_requests_total{reason="queue_full"}'] == kinds["429"], m
    served(live)
    no_crash(live)


# -- soak ----------------------------------------------------------------------------------
SOAK_SLOTS = 4
# The warm-up ends once memory is in its steady state: the parking budget (24 MiB, reached
# in about 30 s) binds and the oldest parked conversations are shed. With a 64 MiB budget
# parked bytes were still growing at the end, and RSS minus parked rose for ~100 s (726 ->
# 761 MiB) before it levelled, the allocator taking on the parks' buffers, then stayed flat.
SOAK_WARMUP_S = 60.0
SOAK_S = 180.0  # in all, warm-up included
TURNS_PER_CONVERSATION = 4  # then the conversation starts over (its history stays bounded)


def test_soak_at_capacity_memory_stays_flat_and_counters_return_to_idle(start_server: Callable[..., Live]) -> None:
    """SOAK_SLOTS clients (capacity) for SOAK_S over 2 conversations each, one named by
    X-Session-Id and one not. Few idle sessions fit in the KV cache, so conversations are
    parked and restored all along. RSS minus parked bytes grows < 5% from warm-up to the
    end; afterwards nothing runs or waits, and once every conversation is deleted the
    session counters are back at the values of a fresh start."""
    live = start_server(slots=SOAK_SLOTS, cached_sessions=2, park_ram_mb=24, kv_tokens=8192, ctx_per_slot=2048)
    fresh = live.health()["sessions"]
    assert (fresh["cached"], fresh["parked"], fresh["parked_bytes"]) == (0, 0, 0)
    pid = live.proc.pid
    t_end = time.monotonic() + SOAK_S
    seen_ids: dict[int, set[str]] = {u: set() for u in range(SOAK_SLOTS)}
    tally: Counter[str] = Counter()
    lost: list[str] = []
    lock = threading.Lock()

    def worker(u: int) -> None:
        named = f"soak-{u}-{secrets.token_hex(12)}"
        histories: dict[bool, list[dict[str, str]]] = {True: [SYSTEM], False: [SYSTEM]}
        k = 0
        while time.monotonic() < t_end:
            use_named = k % 2 == 0
            msgs = histories[use_named]
            if len(msgs) > 2 * TURNS_PER_CONVERSATION:
                msgs = histories[use_named] = [SYSTEM]
            q = QUESTIONS[(u * 5 + k) % len(QUESTIONS)]
            body = {"messages": [*msgs, {"role": "user", "content": q}], "max_tokens": 32, "temperature": 0,
                    "stream": k % 3 != 0}
            kind, text, headers = ask(live.user_client(u), body, {"X-Session-Id": named} if use_named else None)
            with lock:
                tally[kind] += 1
                if kind == "lost":
                    lost.append(text)
                if headers is not None and "x-session-id" in headers:
                    seen_ids[u].add(headers["x-session-id"])
            if kind == "answered":
                msgs.extend([{"role": "user", "content": q}, {"role": "assistant", "content": text}])
            k += 1

    samples: list[tuple[float, int, int]] = []  # (t, RSS, parked bytes)

    def sample() -> tuple[float, int, int]:
        s = (time.monotonic(), rss_bytes(pid), int(live.health()["sessions"]["parked_bytes"]))
        samples.append(s)
        return s

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(SOAK_SLOTS) as pool:
        futures = [pool.submit(worker, u) for u in range(SOAK_SLOTS)]
        time.sleep(SOAK_WARMUP_S)
        warm = sample()
        while time.monotonic() < t_end - 5:
            time.sleep(min(15.0, max(0.0, t_end - 5 - time.monotonic())))
            sample()
        last = sample()  # still under load, like the warm-up sample
        for f in futures:
            f.result(timeout=HANG_S)
    elapsed = time.monotonic() - t0

    h = assert_idle(live)
    events = {"parked": parks(live), "restored": h["sessions"]["restored"]}
    after = finished(live)
    net = [(rss - parked) for _, rss, parked in samples]
    growth = (last[1] - last[2]) / (warm[1] - warm[2]) - 1
    # Every conversation still known is idle (cached or parked), never left running.
    states: Counter[str] = Counter()
    for u, ids in seen_ids.items():
        for sid in ids:
            r = live.user_client(u).get(f"/v1/sessions/{sid}")
            if r.status_code == 200:
                states[r.json()["state"]] += 1
    # Deleting every conversation takes the counters back to a fresh start's.
    deleted = sum(live.user_client(u).delete(f"/v1/sessions/{sid}").status_code == 204
                  for u, ids in seen_ids.items() for sid in ids)
    empty = live.health()["sessions"]
    print(f"\nsoak: {SOAK_SLOTS} clients on {SOAK_SLOTS} slots for {elapsed:.0f} s ({SOAK_WARMUP_S:.0f} s warm-up), "
          f"{sum(tally.values())} requests: {tally['answered']} answered, {tally['429'] + tally['503']} refused, "
          f"{len(lost)} lost; {events['parked']} parks / {events['restored']} restores; "
          f"RSS {warm[1] / 2**20:.0f} -> {last[1] / 2**20:.0f} MiB, parked {warm[2] / 2**20:.1f} -> "
          f"{last[2] / 2**20:.1f} MiB, RSS minus parked {growth * 100:+.1f}% (min {min(net) / 2**20:.0f}, "
          f"max {max(net) / 2**20:.0f} MiB over {len(samples)} samples); after: {h['slots']['busy']} busy, "
          f"{h['queue']} queued, sessions {dict(states)}, {deleted} deleted -> cached {empty['cached']}, "
          f"parked {empty['parked']}, parked bytes {empty['parked_bytes']}")
    assert not lost, lost[:5]
    assert tally["answered"] > 0 and tally["429"] + tally["503"] == 0  # at capacity, never beyond it
    assert events["parked"] > 0 and events["restored"] > 0  # parking was exercised all along
    assert growth < 0.05, samples
    assert set(states) <= {"cached", "parked"} and states, states
    assert h["sessions"]["cached"] <= SOAK_SLOTS + 2  # at most every sequence id but the public one
    assert after["stop"] + after["length"] == tally["answered"] and set(after) <= {"stop", "length"}, after
    assert deleted == sum(states.values())
    assert (empty["cached"], empty["parked"], empty["parked_bytes"]) == (0, 0, 0), empty
    m = metrics(live)
    assert m["appliance_sessions_cached"] == 0 and m["appliance_sessions_parked"] == 0
    assert m["appliance_parked_bytes"] == 0
    served(live)
    no_crash(live)


# -- faults: a failing decode step -----------------------------------------------------------
def test_a_failing_decode_step_fails_only_its_requests(start_server: Callable[..., Live]) -> None:
    """The 7th decode after start-up raises. 2 slots, 4 streams: the (at most 2) running in
    that step get one in-stream error event and their stream closes; the queued ones and
    every later request are served."""
    live = start_server(slots=2, kv_tokens=4096, ctx_per_slot=1024, env={"APPLIANCE_FAULT": "decode-fail@6"})

    def stream(i: int) -> tuple[str, list[Any]]:
        body = {"messages": [SYSTEM, {"role": "user", "content": "Count from 1 to 30."}], "max_tokens": 48,
                "temperature": 0, "stream": True}
        events: list[Any] = []
        with live.user_client(i).stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            events = list(events_of(r))
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        if errors:
            # One error event, last: the stream closed right after it, without [DONE].
            assert len(errors) == 1 and events[-1] is errors[0], events[-3:]
            assert errors[0]["error"]["type"] == "server_error"
            assert "injected decode failure" in errors[0]["error"]["message"]
            return "failed", events
        assert events[-1] == sse.DONE and content_of(events).strip(), events[-3:]
        return "answered", events

    with cf.ThreadPoolExecutor(4) as pool:
        outcomes = Counter(kind for kind, _ in pool.map(stream, range(4), timeout=HANG_S))
    h = assert_idle(live)
    after = [served(live, user=10 + i) for i in range(3)]
    fin = finished(live)
    print(f"\nfaults/decode: 1 decode failure injected into 4 streams on 2 slots: {outcomes['failed']} failed "
          f"with the error event, {outcomes['answered']} answered; then {len(after)} of 3 requests served; "
          f"after: {h['slots']['busy']} busy, {h['queue']} queued, engine finished {dict(fin)}")
    assert 1 <= outcomes["failed"] <= 2 and outcomes["failed"] + outcomes["answered"] == 4, outcomes
    assert fin["error"] == outcomes["failed"]
    assert "decode of" in live.log() and "injected decode failure" in live.log()
    assert live.health()["status"] == "ok"
    assert "engine loop crashed" not in live.log()


# -- faults: SIGKILL while saving sessions -------------------------------------------------
def test_sigkill_while_saving_then_a_restart_discards_the_incomplete_and_serves(
        start_server: Callable[..., Live], tmp_path: Path) -> None:
    """Three conversations, then a stop; saving each file after the first waits 60 s
    before its rename (APPLIANCE_FAULT=save-slow), and SIGKILL lands in that wait. The
    restart removes the temporary file with a log line, keeps the one complete file (its
    conversation continues from it) and serves the others by recomputing."""
    state = tmp_path / "kill-state"
    live = start_server(slots=2, kv_tokens=4096, ctx_per_slot=1024, env={"APPLIANCE_FAULT": "save-slow:60@1"},
                        state=state)
    sids = [f"kill-{i}-{secrets.token_hex(12)}" for i in range(3)]
    users = [30, 31, 32]  # one client each: no conversation can reuse another's prefix
    history, first_prompt = {}, {}
    for i, sid in enumerate(sids):
        msgs = [SYSTEM, {"role": "user", "content": f"{QUESTIONS[i]} Then name an animal."}]
        r = live.user_client(users[i]).post("/v1/chat/completions", headers={"X-Session-Id": sid},
                                            json={"messages": msgs, "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text
        history[sid] = [*msgs, r.json()["choices"][0]["message"]]
        first_prompt[sid] = r.json()["usage"]["prompt_tokens"]
    live.proc.send_signal(signal.SIGINT)
    wait_until(lambda: state.is_dir() and any(n.endswith(".tmp") for n in os.listdir(state))
               and "waits 60.0 s" in live.log(), 60,
               "a session file written under its temporary name")
    live.proc.send_signal(signal.SIGKILL)
    assert live.proc.wait(30) == -signal.SIGKILL
    left = sorted(os.listdir(state))
    assert len([n for n in left if n.endswith(".kv")]) == 1 and len([n for n in left if n.endswith(".tmp")]) == 1, left

    again = start_server(slots=2, kv_tokens=4096, ctx_per_slot=1024, state=state)
    log = again.log()
    assert "removed 1 temporary session files left by an interrupted save" in log, log[-2000:]
    assert "1 saved sessions found" in log
    assert not [n for n in os.listdir(state) if n.endswith(".tmp")]
    # The most recent conversation was saved first: it continues from its file.
    states = {sid: again.user_client(u).get(f"/v1/sessions/{sid}") for u, sid in zip(users, sids)}
    assert states[sids[2]].status_code == 200 and states[sids[2]].json()["state"] == "saved"
    assert states[sids[0]].status_code == states[sids[1]].status_code == 404
    cached = {}
    for u, sid in zip(users, sids):
        r = again.user_client(u).post("/v1/chat/completions", headers={"X-Session-Id": sid},
                                      json={"messages": [*history[sid], {"role": "user", "content": "Thanks."}],
                                            "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        cached[sid] = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Restored from disk: at least its first prompt; the others recompute. The first starts from
    # nothing (a private system prompt); the second client to send that system prompt whole
    # copies it (common_system_prompts) and nothing more.
    assert cached[sids[2]] >= first_prompt[sids[2]] and cached[sids[0]] == 0, cached
    assert cached[sids[1]] < first_prompt[sids[1]], cached
    print(f"\nfaults/kill: SIGKILL mid-save (1 of 3 files complete, 1 temporary); restart: 1 temporary file "
          f"removed, 1 session restored ({cached[sids[2]]} cached tokens), 2 recomputed "
          f"from scratch ({cached[sids[0]]} and {cached[sids[1]]} cached tokens), all 3 served")
    assert again.health()["status"] == "ok"
    assert again.stop() == 0
    no_crash(again)


# -- faults: a state_dir that cannot be written ---------------------------------------------
def test_a_full_disk_at_shutdown_is_a_log_line_and_the_next_start_serves(
        start_server: Callable[..., Live], tmp_path: Path) -> None:
    """RLIMIT_FSIZE on the running server (as root, chmod would not stop a write): a session
    file bigger than the limit cannot be written, like on a full disk. The server keeps
    serving under the limit; the save at shutdown fails with one log line, leaves no
    partial file, and the process still exits 0; the next start on that state_dir serves."""
    state = tmp_path / "full-state"
    live = start_server(slots=2, kv_tokens=4096, ctx_per_slot=1024, state=state)
    sids = [f"full-{i}-{secrets.token_hex(12)}" for i in range(2)]
    long_question = "Summarise in one line: " + " ".join(f"item {i} is on shelf {i % 7}." for i in range(40))

    def turn(sid: str) -> None:
        r = live.client.post("/v1/chat/completions", headers={"X-Session-Id": sid},
                             json={"messages": [SYSTEM, {"role": "user", "content": long_question}],
                                   "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 200, r.text  # > 2 MiB of KV

    turn(sids[0])
    limit = live.log_path.stat().st_size + 256 * 1024  # the log may grow; a session file (>2 MiB) may not
    resource.prlimit(live.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
    turn(sids[1])
    served(live)
    assert live.stop() == 0
    log = live.log()
    errors = re.findall(rf"could not save sessions to {re.escape(str(state))}: .*", log)
    assert len(errors) == 1 and "File too large" in errors[0], log[-2000:]
    # No partial or temporary session file; the usage counts (issue 26) and the library (issue 38)
    # are files of their own.
    assert [n for n in os.listdir(state) if n not in (USAGE_FILE, LIBRARY_FILE)] == [], os.listdir(state)

    again = start_server(slots=2, kv_tokens=4096, ctx_per_slot=1024, state=state)
    assert "saved sessions found" not in again.log()
    r = again.client.get(f"/v1/sessions/{sids[0]}")
    assert r.status_code == 404
    served(again)
    print(f"\nfaults/full disk: RLIMIT_FSIZE {limit >> 10} KiB; served under it; save at shutdown: "
          f"{errors[0].split(': ', 1)[1]!r}, exit code 0, no file left; restart served")
    no_crash(live)
    no_crash(again)


# -- faults: clients that disconnect in every state ------------------------------------------
def long_prompt(lines: int) -> str:
    return "Read this inventory, then say how many shelves there are.\n" + "\n".join(
        f"Line {i}: box {i * 7 % 1000} holds {i % 13} bolts and {i % 5} nuts on shelf {i % 17}." for i in range(lines))


def test_clients_that_disconnect_in_every_state_free_their_slot(start_server: Callable[..., Live]) -> None:
    """Queued (slots full), prefilling (a long prompt), streaming, waiting for a whole
    answer, and while their sessions are being parked and restored: after each, nothing
    stays busy or queued, the engine counted each one as cancelled, and the next request is
    served."""
    live = start_server(slots=2, cached_sessions=1, park_ram_mb=64, kv_tokens=12288, ctx_per_slot=4096,
                        max_tokens_limit=512)
    counting = "Count from 1 to 400, one number per line."
    report: dict[str, str] = {}

    def stream_body(content: str, max_tokens: int, **kw: Any) -> dict[str, Any]:
        return {"messages": [SYSTEM, {"role": "user", "content": content}], "max_tokens": max_tokens,
                "temperature": 0, "stream": True, **kw}

    def engine() -> dict[str, Any]:
        return dict(live.health()["engine"])

    # Parking: 6 conversations on 3 sequence ids (2 slots + 1 cached), so every admission
    # parks one and restores another; clients of parked sessions come back and leave at
    # once, a little later, after their first token... while others complete.
    users = list(range(20, 26))
    sids = {u: f"park-{u}-{secrets.token_hex(12)}" for u in users}
    history: dict[int, list[dict[str, Any]]] = {}
    for u in users:
        msgs = [SYSTEM, {"role": "user", "content": long_prompt(6) + f"\nAlso: {QUESTIONS[u % len(QUESTIONS)]}"}]
        r = live.user_client(u).post("/v1/chat/completions", headers={"X-Session-Id": sids[u]},
                                     json={"messages": msgs, "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        history[u] = [*msgs, r.json()["choices"][0]["message"]]
    ev0, parks0 = live.health()["sessions"], parks(live)
    cancelled0 = finished(live)["cancelled"]
    delays = [0.0, 0.02, 0.1, 0.3, None, None]  # None: after the first content token
    drops = 0
    with cf.ThreadPoolExecutor(2) as pool:
        for k, delay in enumerate(delays):
            leaver, stayer = users[k], users[(k + 3) % len(users)]
            follow = {"role": "user", "content": "And one more thing?"}
            body = {"messages": [*history[stayer], follow], "max_tokens": 8, "temperature": 0}
            done = pool.submit(ask, live.user_client(stayer), body, {"X-Session-Id": sids[stayer]})
            gone = Raw(live, {**stream_body("", 200), "messages": [*history[leaver], follow]}, user=leaver,
                       session=sids[leaver])
            if delay is None:
                gone.read_until(lambda b: content_chunks(b) >= 1)
            else:
                time.sleep(delay)
            gone.drop()
            drops += 1
            kind, text, _ = done.result(timeout=HANG_S)
            assert kind == "answered", text
            assert_idle(live)
    ev1, parks1 = live.health()["sessions"], parks(live)
    # Every conversation is still there, idle, and its parked bytes add up to what /health says.
    views = {u: live.user_client(u).get(f"/v1/sessions/{sids[u]}").json() for u in users}
    assert {v["state"] for v in views.values()} <= {"cached", "parked"}, views
    assert sum(v["parked_bytes"] for v in views.values()) == ev1["parked_bytes"]
    assert parks1 > parks0 and ev1["restored"] > ev0["restored"]
    cancelled = finished(live)["cancelled"] - cancelled0
    assert cancelled <= drops
    # Each conversation's next turn is served, from its own kept KV (parked, restored or cached).
    reuse = []
    for u in users:
        r = live.user_client(u).post("/v1/chat/completions", headers={"X-Session-Id": sids[u]},
                                     json={"messages": [*history[u], {"role": "user", "content": "Thanks."}],
                                           "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        reuse.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert all(n > 100 for n in reuse), reuse  # far beyond the public system prompt
    assert_idle(live)
    report["parking"] = (f"{drops} clients left at 0-300 ms or after a token ({cancelled} reached the engine) "
                         f"while {parks1 - parks0} parks and {ev1['restored'] - ev0['restored']} "
                         f"restores ran; all 6 conversations continued from their kept KV")

    # Queued: two long answers hold both slots; a third request waits, then goes away.
    base = finished(live)["cancelled"]
    holders = [Raw(live, stream_body(counting, 400), user=1), Raw(live, stream_body(counting, 400), user=2)]
    for h in holders:
        h.read_until(lambda b: content_chunks(b) >= 2)
    queued = Raw(live, stream_body("Say hi.", 8), user=3)
    live.wait_health(lambda h: h["queue"] == 1, 30, "the third request queued")
    queued.read_until(lambda b: b": queued 1" in b, 30)
    queued.drop()
    health = live.wait_health(lambda h: h["queue"] == 0, 30, "the queued request gone")
    assert health["slots"]["busy"] == 2  # it left the queue because it was cancelled, not admitted
    ((_, _, out),) = wait_until(lambda: cancelled_lines(live, 3), 10, "the cancel in the log")
    assert out == 0
    for x in holders:
        x.drop()
    assert_idle(live)
    assert finished(live)["cancelled"] - base == 3
    held = cancelled_lines(live, 1) + cancelled_lines(live, 2)
    assert len(held) == 2 and all(0 < out < 400 for _, _, out in held), held
    served(live)
    report["queued"] = f"cancelled from the queue (holders stopped at {[o for _, _, o in held]} of 400 tokens)"

    # Prefilling: a prompt of ~3,000 tokens; the client leaves once part of it is computed.
    e0 = engine()
    pre = Raw(live, stream_body(long_prompt(130), 16), user=4)
    wait_until(lambda: engine()["prompt_tokens_computed"] - e0["prompt_tokens_computed"] >= 64, 60,
               "the long prompt's prefill under way")
    pre.drop()
    assert_idle(live)
    ((prompt, reused, out),) = wait_until(lambda: cancelled_lines(live, 4), 10, "the cancel in the log")
    computed = engine()["prompt_tokens_computed"] - e0["prompt_tokens_computed"]
    assert out == 0 and computed < prompt - reused, (prompt, reused, computed)
    served(live)
    report["prefilling"] = f"stopped after {computed} of {prompt - reused} prompt tokens"

    # Streaming: gone after a few tokens of a long answer.
    st = Raw(live, stream_body(counting, 400), user=5)
    st.read_until(lambda b: content_chunks(b) >= 3)
    st.drop()
    assert_idle(live)
    ((_, _, out),) = wait_until(lambda: cancelled_lines(live, 5), 10, "the cancel in the log")
    assert 3 <= out < 400
    served(live)
    report["streaming"] = f"stopped at {out} of 400 tokens"

    # Waiting for a whole (non-streamed) answer: gone while it is being generated.
    e0 = engine()
    whole = Raw(live, {**stream_body(counting, 400), "stream": False}, user=6)
    wait_until(lambda: engine()["generated_tokens"] - e0["generated_tokens"] >= 5, 60, "the answer under way")
    whole.drop()
    assert_idle(live)
    ((_, _, out),) = wait_until(lambda: cancelled_lines(live, 6), 10, "the cancel in the log")
    assert 5 <= out < 400
    served(live)
    report["non-streamed"] = f"stopped at {out} of 400 tokens"

    fin = finished(live)
    print("\nfaults/disconnect: " + "; ".join(f"{k}: {v}" for k, v in report.items())
          + f"; engine finished {dict(fin)}")
    assert "error" not in fin
    no_crash(live)

