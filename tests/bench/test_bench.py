"""appliance.bench against fake OpenAI-compatible streaming servers run by uvicorn in threads."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import re
import socket
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from itertools import islice
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from appliance import bench
from appliance.bench.cli import _compare

NUM_CHUNKS = 6  # content chunks per fake reply
USAGE_TOKENS = 7  # reported by the usage chunk; differs from NUM_CHUNKS on purpose
FAST_FIRST_S = 0.03  # sleep before the first non-empty chunk
FAST_GAP_S = 0.005
LONG_PREFILL_S = 0.3  # the fake "prefill" of a long paste, which stalls every other stream


def _chunk(delta: dict, usage: dict | None = None) -> str:
    choices = [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}]
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "fake-model",
            "choices": choices, "usage": usage}
    return f"data: {json.dumps(body)}\n\n"


def make_app(first_s: float, gap_s: float) -> Starlette:
    # One engine lock, like a single-batch CPU server: a long prefill holds it and every
    # other stream's next token waits, which is exactly what --long-prompt-tokens measures.
    engine = asyncio.Lock()
    # Every request received, where from, and the text streamed back, so tests can check
    # the history and that each simulated user has its own address.
    seen: dict[str, list] = {"session_ids": [], "bodies": [], "replies": [], "hosts": [], "priority": []}
    streaming = [0]  # replies in progress: what the fake's /health calls its queue
    # A test may hold every reply until this many are in progress (for at most 10 s), so that
    # "sent at once" is seen in the most replies in progress, not timed.
    hold = {"until": 0, "most": 0}
    flaky_calls = [0]

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model"}]})

    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        seen["session_ids"].append(request.headers.get("x-session-id", ""))
        seen["bodies"].append(body)
        seen["hosts"].append(request.client.host if request.client else "")
        seen["priority"].append(request.headers.get("x-priority", ""))
        is_long = len(body["messages"][-1]["content"]) > 2000
        # A reply unique to this request, so a resent history shows whose answer it holds.
        n = len(seen["bodies"])
        pieces = [f"r{n}t{i} " for i in range(NUM_CHUNKS)]
        seen["replies"].append("".join(pieces))
        prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // bench.CHARS_PER_TOKEN

        async def events() -> AsyncIterator[str]:
            streaming[0] += 1
            hold["most"] = max(hold["most"], streaming[0])
            try:
                for _ in range(1000):
                    if streaming[0] >= hold["until"]:
                        break
                    await asyncio.sleep(0.01)
                async for event in reply():
                    yield event
            finally:
                streaming[0] -= 1

        async def reply() -> AsyncIterator[str]:
            yield ": queued 2 eta 3\n\n"  # the appliance's queue note: its estimate is kept
            yield ": queued 1 eta 1\n\n"  # only the first counts
            yield _chunk({"role": "assistant", "content": ""})  # must not count as a token
            yield ": keep-alive\n\n"
            if is_long:
                async with engine:
                    await asyncio.sleep(LONG_PREFILL_S)
            await asyncio.sleep(first_s)
            for i, piece in enumerate(pieces):
                if i:
                    await asyncio.sleep(gap_s)
                async with engine:
                    yield _chunk({"content": piece})
                yield ": keep-alive\n\n"
            yield _chunk({"content": None})
            yield _chunk({}, usage={"prompt_tokens": prompt_tokens,
                                    "completion_tokens": USAGE_TOKENS,
                                    "total_tokens": prompt_tokens + USAGE_TOKENS})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "queue": streaming[0]})

    async def flaky(request: Request) -> JSONResponse | StreamingResponse:
        # Every third request refused as a full queue is (the others answered as /v1 does).
        flaky_calls[0] += 1
        if flaky_calls[0] % 3 == 0:
            await request.body()
            return JSONResponse({"error": {"message": "queue full", "type": "overloaded"}},
                                status_code=503, headers={"Retry-After": "1"})
        return await chat(request)

    async def busy(request: Request) -> JSONResponse:
        return JSONResponse({"error": {"message": "queue full", "type": "overloaded"}},
                            status_code=429)

    async def broken(request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            yield _chunk({"role": "assistant", "content": ""})
            yield _chunk({"content": "partial"})
            yield 'data: {"error": {"message": "engine died", "type": "server_error"}}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def unicode(request: Request) -> StreamingResponse:
        # Raw UTF-8 as the appliance sends it (ensure_ascii=False): U+2028 is no line end.
        async def events() -> AsyncIterator[str]:
            yield _chunk({"role": "assistant", "content": ""})
            for piece in ("one\u2028", "two\u0085", "three"):
                yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]},
                                            ensure_ascii=False) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[
        Route("/v1/models", models),
        Route("/health", health),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/flaky/v1/chat/completions", flaky, methods=["POST"]),
        Route("/busy/v1/chat/completions", busy, methods=["POST"]),
        Route("/broken/v1/chat/completions", broken, methods=["POST"]),
        Route("/unicode/v1/chat/completions", unicode, methods=["POST"]),
    ])
    app.state.seen = seen
    app.state.hold = hold
    return app


class FakeServer:
    def __init__(self, first_s: float, gap_s: float) -> None:
        self.app = make_app(first_s, gap_s)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "fake server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.sock.close()

    @property
    def seen(self) -> dict[str, list]:
        return self.app.state.seen


@pytest.fixture(scope="module")
def fast() -> Iterator[FakeServer]:
    with FakeServer(FAST_FIRST_S, FAST_GAP_S) as server:
        yield server


@pytest.fixture(scope="module")
def slow() -> Iterator[FakeServer]:
    with FakeServer(FAST_FIRST_S * 10, FAST_GAP_S * 10) as server:
        yield server


def _measure(url: str, concurrency: int, requests: int, long_prompt_tokens: int = 0,
             arrival: bench.Arrival = "together", stagger_s: float = 0.0, turns: int = 1,
             think_s: float = 0.0, workload_name: bench.WorkloadName = "chat",
             prompt_mix: tuple[int, ...] = ()) -> bench.LevelResult:
    prompts, follow_ups = bench.PROMPT_SETS[workload_name]
    workload = bench.Workload(model="fake-model", max_tokens=16, turns=turns, think_s=think_s,
                              long_prompt_tokens=long_prompt_tokens, prompts=prompts,
                              follow_ups=follow_ups, prompt_mix=prompt_mix)
    return asyncio.run(bench.measure(url, concurrency, requests, workload, timeout=10,
                                     arrival=arrival, stagger_s=stagger_s))


@pytest.mark.parametrize("concurrency,requests", [(1, 3), (4, 10)])
def test_measure_counts_tokens_and_skips_empty_first_delta(
    fast: FakeServer, concurrency: int, requests: int
) -> None:
    level = _measure(fast.url, concurrency, requests)
    assert len(level.results) == requests
    assert len(level.completed) == requests
    assert level.num_failed == level.num_rejected == 0
    # usage.completion_tokens wins over the chunk count; chunks still time every token.
    assert level.completion_tokens == requests * USAGE_TOKENS
    assert all(len(r.token_times) == NUM_CHUNKS for r in level.results)
    # The empty role delta arrives at once; TTFT must wait for the first real content.
    assert min(level.ttfts()) >= FAST_FIRST_S
    assert len(level.itls()) == requests * (NUM_CHUNKS - 1)
    assert level.tokens_per_s > 0 and level.requests_per_min > 0
    s = level.summary()
    assert s["ttft_ms_p50"] <= s["ttft_ms_p95"] <= s["e2e_ms_p95"]
    assert s["concurrency"] == concurrency


def test_the_first_queue_note_s_estimate_is_kept_and_checked_against_the_wait(fast: FakeServer) -> None:
    level = _measure(fast.url, 2, 2)
    assert [r.eta_s for r in level.results] == [3.0, 3.0]
    assert all(r.eta_heard and r.waited is not None and 0 < r.waited < 3 for r in level.results)
    # Waits under 2 s are not checked: an estimate is whole seconds, rounded up.
    assert level.summary()["eta_checked"] == 0
    # Three waits after notes: 3 s for an estimate of 3 s, 5 s for 4, 2 s for 4.
    e = bench.LevelResult(label="x", concurrency=1, wall_s=1.0, results=[
        bench.RequestResult(t_start=0, status=200, done=True, token_times=[10.0], eta_s=eta, eta_heard=10.0 - w)
        for w, eta in [(3, 3), (5, 4), (2, 4)]]).estimates()
    assert e["eta_checked"] == 3 and e["eta_ratio_p50"] == 1.0 and e["eta_within_30pct"] == round(2 / 3, 2)
    assert e["eta_ratio_p10"] == 0.6 and e["eta_ratio_p90"] == 1.2


def test_request_shape(fast: FakeServer) -> None:
    before = len(fast.seen["bodies"])
    _measure(fast.url + "/v1/", 2, 2)  # a URL that already ends with /v1 is accepted
    bodies, sessions = fast.seen["bodies"][before:], fast.seen["session_ids"][before:]
    assert len(bodies) == 2
    body = bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 16 and body["temperature"] == 0.0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert all(s.startswith("bench-") for s in sessions) and len(set(sessions)) == 2
    # Prompts are cycled, so concurrent requests differ.
    assert bodies[0]["messages"][1]["content"] != bodies[1]["messages"][1]["content"]


def test_workers_arrive_from_distinct_loopback_addresses(fast: FakeServer) -> None:
    start = len(fast.seen["bodies"])
    _measure(fast.url, 2, 6, turns=2)
    sessions, hosts = fast.seen["session_ids"][start:], fast.seen["hosts"][start:]
    assert len(hosts) == 4
    # One user = one address: both turns of a conversation come from its user's address.
    by_session: defaultdict[str, set[str]] = defaultdict(set)
    for session, host in zip(sessions, hosts, strict=True):
        by_session[session].add(host)
    assert sorted(h for (h,) in by_session.values()) == ["127.0.0.2", "127.0.0.3"]


def test_localhost_url_also_gets_user_addresses(fast: FakeServer) -> None:
    start = len(fast.seen["hosts"])
    _measure(fast.url.replace("127.0.0.1", "localhost"), 2, 4)
    assert set(fast.seen["hosts"][start:]) == {"127.0.0.2", "127.0.0.3"}


def test_loopback_detection_and_user_addresses() -> None:
    for url in ("http://127.0.0.1:8080", "http://localhost:1/v1", "http://127.9.9.9/",
                "https://LOCALHOST:8443/v1/chat/completions"):
        assert bench.is_loopback(url), url
    # ::1 is a single address; other hosts are reached from the machine's own address.
    for url in ("http://[::1]:8080", "http://10.0.0.5:8080", "http://192.168.1.20",
                "http://example.com:80", "http://localhost.example.com"):
        assert not bench.is_loopback(url), url
    assert [bench.user_address(i) for i in (0, 1, 252, 253)] == \
        ["127.0.0.2", "127.0.0.3", "127.0.0.254", "127.0.1.2"]


def test_no_session_id_sends_none_and_keeps_conversations_per_address(
    fast: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = len(fast.seen["bodies"])
    out_path = tmp_path / "bench.json"
    assert _run("--url", fast.url, "--concurrency", "2", "--turns", "2", "--think-s", "0",
                "--max-tokens", "8", "--no-session-id", "--json", str(out_path)) == 0
    bodies, hosts = fast.seen["bodies"][start:], fast.seen["hosts"][start:]
    assert fast.seen["session_ids"][start:] == [""] * 4
    # Without an id only the address ties turn 2 to turn 1 of the same user.
    by_host: defaultdict[str, list[dict]] = defaultdict(list)
    for host, body in zip(hosts, bodies, strict=True):
        by_host[host].append(body)
    assert sorted(by_host) == ["127.0.0.2", "127.0.0.3"]
    for first, second in by_host.values():
        assert second["messages"][:2] == first["messages"]
    assert json.loads(out_path.read_text())["settings"]["session_ids"] is False


def test_429_counts_as_rejected(fast: FakeServer) -> None:
    level = _measure(fast.url + "/busy", 2, 4)
    assert level.num_rejected == 4
    assert level.num_failed == 0 and not level.completed
    assert level.failure_reasons == {"http 429": 4}
    assert level.summary()["ttft_ms_p50"] is None


def test_error_event_mid_stream_counts_failed(fast: FakeServer) -> None:
    level = _measure(fast.url + "/broken", 1, 2)
    assert level.num_failed == 2 and level.num_rejected == 0 and not level.completed
    assert level.failure_reasons == {"stream error: server_error": 2}


def test_unicode_line_separators_inside_an_answer_are_not_line_ends(fast: FakeServer) -> None:
    level = _measure(fast.url + "/unicode", 1, 1)
    (res,) = level.results
    assert res.ok, res.reason
    assert res.text == "one\u2028two\u0085three" and len(res.token_times) == 3


def test_connection_refused_is_a_failure_not_a_crash() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here now
    level = _measure(f"http://127.0.0.1:{port}", 2, 3)
    assert level.num_failed == 3 and level.failure_reasons == {"ConnectError": 3}


def test_long_paste_stalls_short_streams(fast: FakeServer) -> None:
    level = _measure(fast.url, 2, 8, long_prompt_tokens=1000)
    assert len(level.completed) == 8
    assert len(level.long_results) == 1 and level.long_results[0].ok
    assert level.itl_during_long, "short streams overlapped the long paste"
    # The fake's prefill holds the engine for 300 ms; normal gaps are ~5 ms.
    stalled = bench.percentile(level.itl_during_long, 95)
    normal = bench.percentile(level.itls(), 50)
    assert stalled is not None and normal is not None
    assert stalled > LONG_PREFILL_S / 2 > normal
    prompts = [b["messages"][1]["content"] for b in fast.seen["bodies"][-9:]]
    assert sum(len(p) >= 1000 * bench.CHARS_PER_TOKEN for p in prompts) == 1
    # The paster is a third user: two workers on .2 and .3, the paste from .4.
    hosts = {h for p, h in zip(prompts, fast.seen["hosts"][-9:], strict=True)
             if len(p) >= 1000 * bench.CHARS_PER_TOKEN}
    assert hosts == {"127.0.0.4"}
    assert set(fast.seen["hosts"][-9:]) == {"127.0.0.2", "127.0.0.3", "127.0.0.4"}


def test_staggered_arrival_completes(fast: FakeServer) -> None:
    level = _measure(fast.url, 3, 6, arrival="staggered", stagger_s=0.02)
    assert len(level.completed) == 6


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return bench.run(parser.parse_args(argv))


def test_run_compare_prints_table_and_writes_json(
    fast: FakeServer, slow: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "bench.json"
    assert _run("--url", fast.url, "--compare", slow.url + "/v1", "--label", "ours",
                "--compare-label", "theirs", "--concurrency", "1,2", "--requests", "2",
                "--rounds", "2", "--max-tokens", "8", "--json", str(out_path)) == 0
    out = capsys.readouterr().out
    assert "ours" in out and "theirs" in out and "ratio" in out
    assert len(re.findall(r"\d+\.\d\dx", out)) == 4  # tok/s and TTFT ratio cells per level

    report = json.loads(out_path.read_text())
    assert [s["label"] for s in report["servers"]] == ["ours", "theirs"]
    assert report["settings"]["session_ids"] is True
    assert report["settings"]["workload"] == "chat" and report["settings"]["prompt_mix"] is None
    assert report["levels"][0]["results"]["ours"]["by_prompt_mix"] == {}
    assert all(s["model"] == "fake-model" for s in report["servers"])
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    for lv in report["levels"]:
        ours, theirs = lv["results"]["ours"], lv["results"]["theirs"]
        assert ours["completed"] == theirs["completed"] == 4  # 2 requests x 2 rounds
        assert theirs["ttft_ms_p50"] > ours["ttft_ms_p50"]  # the slow fake sleeps 10x longer
        assert lv["ratio"]["tokens_per_s"] > 1 and lv["ratio"]["ttft_p50"] > 1
        # Each round also on its own, and the median across them.
        med = lv["median_of_rounds"]
        assert set(med) == {"ours", "theirs"}
        assert med["theirs"]["ttft_ms_p50"] > med["ours"]["ttft_ms_p50"]
        assert med["ours"]["tokens_per_s"] > med["theirs"]["tokens_per_s"]


def test_run_returns_nonzero_when_nothing_completes(
    fast: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run("--url", fast.url + "/busy", "--concurrency", "1", "--requests", "2",
                "--model", "m") == 1
    out = capsys.readouterr().out
    assert "http 429 x2" in out


def test_fresh_system_per_level_server_and_round(
    fast: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeServer(FAST_FIRST_S, FAST_GAP_S) as peer:
        starts = {fast: len(fast.seen["bodies"]), peer: 0}
        assert _run("--url", fast.url, "--compare", peer.url, "--concurrency", "1,2",
                    "--requests", "2", "--rounds", "2", "--max-tokens", "8",
                    "--fresh-system") == 0
        systems = {server: [b["messages"][0]["content"] for b in server.seen["bodies"][start:]]
                   for server, start in starts.items()}
    per_run: list[str] = []
    for seen in systems.values():
        # Levels and rounds run one after another: (c=1, r0), (c=1, r1), (c=2, r0), (c=2, r1).
        assert len(seen) == 8
        for i in range(0, 8, 2):
            assert seen[i] == seen[i + 1]  # requests of one level share the prompt
            assert seen[i].startswith("[run ") and seen[i].endswith(bench.DEFAULT_SYSTEM)
            per_run.append(seen[i])
    assert len(set(per_run)) == 8  # every level, round and server got a fresh one


def test_multi_turn_conversations(
    fast: FakeServer, slow: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start, slow_start = len(fast.seen["bodies"]), len(slow.seen["bodies"])
    out_path = tmp_path / "bench.json"
    assert _run("--url", fast.url, "--compare", slow.url, "--concurrency", "2",
                "--turns", "3", "--think-s", "0", "--requests", "50", "--max-tokens", "8",
                "--json", str(out_path)) == 0
    assert len(slow.seen["bodies"]) - slow_start == 6
    bodies, replies = fast.seen["bodies"][start:], fast.seen["replies"][start:]
    assert len(bodies) == 6  # 2 users x 3 turns; --requests is ignored
    conversations: defaultdict[str, list[tuple[dict, str]]] = defaultdict(list)
    for session, body, reply in zip(fast.seen["session_ids"][start:], bodies, replies, strict=True):
        conversations[session].append((body, reply))
    assert len(conversations) == 2 and all(s.startswith("bench-") for s in conversations)
    for turns in conversations.values():
        assert len(turns) == 3
        for k, (body, _) in enumerate(turns, 1):
            messages = body["messages"]
            assert [m["role"] for m in messages] == \
                ["system"] + ["user", "assistant"] * (k - 1) + ["user"]
            assert messages[0]["content"] == bench.DEFAULT_SYSTEM
            # The history holds the answers this user actually received, in order.
            assert [m["content"] for m in messages if m["role"] == "assistant"] == \
                [reply for _, reply in turns[:k - 1]]
            assert all(m["content"] in bench.FOLLOW_UPS for m in messages[3::2])
            if k > 1:
                assert messages[:-2] == turns[k - 2][0]["messages"]

    out = capsys.readouterr().out
    assert "ttft50@2+" in out
    assert len(re.findall(r"\d+\.\d\dx", out)) == 3  # tok/s, TTFT, later-turn TTFT ratios
    report = json.loads(out_path.read_text())
    assert report["settings"]["turns"] == 3 and report["settings"]["think_s"] == 0.0
    (level,) = report["levels"]
    ours, peer = level["results"]["appliance"], level["results"]["peer"]
    for s in (ours, peer):
        assert s["requests"] == s["completed"] == 6
        assert s["turn1_ttft_ms_p50"] <= s["turn1_ttft_ms_p95"]
        assert s["later_ttft_ms_p50"] <= s["later_ttft_ms_p95"]
        first, second, third = s["prompt_tokens_by_turn"]
        assert first < second < third  # the history grows every turn
    assert peer["later_ttft_ms_p50"] > ours["later_ttft_ms_p50"]
    assert level["ratio"]["later_ttft_p50"] > 1


def test_turns_record_turn_and_think_time(fast: FakeServer) -> None:
    think_s = 0.05
    level = _measure(fast.url, 1, 9, turns=2, think_s=think_s)
    first, second = level.results
    assert (first.turn, second.turn) == (1, 2) and first.ok and second.ok
    assert second.t_start - first.t_end >= think_s
    assert first.prompt_tokens is not None and second.prompt_tokens is not None
    assert first.prompt_tokens < second.prompt_tokens
    assert level.summary()["later_ttft_ms_p50"] is not None


def test_failed_turn_ends_the_conversation(fast: FakeServer) -> None:
    level = _measure(fast.url + "/busy", 2, 9, turns=3)
    assert len(level.results) == 2 and level.num_rejected == 2
    assert all(r.turn == 1 for r in level.results)


def test_percentile_linear_interpolation() -> None:
    assert bench.percentile([], 50) is None
    assert bench.percentile([3.0], 95) == 3.0
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert bench.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)


def test_base_url_normalisation() -> None:
    for url in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/",
                "http://h:1/v1/chat/completions"):
        assert bench.base_url(url) == "http://h:1"


def _user_turns(seen: dict[str, list], start: int) -> dict[str, tuple[str, list[str]]]:
    """session -> (address, the user messages it sent, in order), from request `start` on."""
    out: dict[str, tuple[str, list[str]]] = {}
    for session, host, body in zip(seen["session_ids"][start:], seen["hosts"][start:],
                                   seen["bodies"][start:], strict=True):
        out.setdefault(session, (host, []))[1].append(body["messages"][-1]["content"])
    return out


def test_rewrite_pool_is_prose_with_typos_and_code_with_bugs() -> None:
    prompts = bench.REWRITE_PROMPTS
    assert len(prompts) >= 12 and len(set(prompts)) == len(prompts)
    assert len(bench.REWRITE_FOLLOW_UPS) == len(prompts)
    prose = [p for p in prompts if "paragraph" in p.split("\n")[0]]
    code = [p for p in prompts if "code" in p.split("\n")[0]]
    assert len(prose) + len(code) == len(prompts) and len(prose) >= 4 and len(code) >= 4
    for p in prose:
        ask, text = p.split("\n\n", 1)
        assert "return only the corrected text" in ask and 60 <= len(text.split()) <= 120
    for p in code:
        ask, text = p.split("\n\n", 1)
        assert "return only the corrected code" in ask
        assert text.startswith("```") and text.endswith("```")
        assert 8 <= len(text.splitlines()) - 2 <= 15
    assert {lang for p in code for lang in ("Python", "JavaScript", "SQL") if lang in p} == \
        {"Python", "JavaScript", "SQL"}
    # Later turns ask for the whole text again, so they copy as well.
    assert all("again" in f for pool in bench.REWRITE_FOLLOW_UPS for f in pool)


def test_rewrite_sends_the_same_requests_every_run(fast: FakeServer) -> None:
    runs = []
    for _ in range(2):
        start = len(fast.seen["bodies"])
        _measure(fast.url, 3, 6, workload_name="rewrite")
        bodies = fast.seen["bodies"][start:]
        assert [m["role"] for m in bodies[0]["messages"]] == ["system", "user"]
        runs.append(sorted(json.dumps(b, sort_keys=True) for b in bodies))
        # Each user opens with their own text: user i (address .i+2) with text i.
        first = {h: s for h, s in reversed(list(zip(fast.seen["hosts"][start:],
                                                     [b["messages"][1]["content"] for b in bodies],
                                                     strict=True)))}
        assert first == {f"127.0.0.{i + 2}": bench.REWRITE_PROMPTS[i] for i in range(3)}
    # Session ids differ per run; the bodies are identical.
    assert runs[0] == runs[1]
    assert [json.loads(b)["messages"][1]["content"] for b in runs[0]] == \
        sorted(bench.REWRITE_PROMPTS[:6])


def test_rewrite_with_turns_asks_for_the_whole_text_again(fast: FakeServer) -> None:
    runs = []
    for _ in range(2):
        start = len(fast.seen["bodies"])
        level = _measure(fast.url, 2, 2, turns=3, workload_name="rewrite")
        assert len(level.completed) == 6
        by_user = {host: said for host, said in _user_turns(fast.seen, start).values()}
        prose, code = by_user["127.0.0.2"], by_user["127.0.0.3"]
        assert prose[0] == bench.REWRITE_PROMPTS[0] and code[0] == bench.REWRITE_PROMPTS[1]
        assert all(f.endswith("return the whole text again.") for f in prose[1:])
        assert all(f.endswith("return the whole code again.") for f in code[1:])
        assert len(set(prose[1:])) == len(set(code[1:])) == 2  # a new edit each turn
        runs.append(by_user)
    assert runs[0] == runs[1]


def _split_pad(content: str, question: str) -> str:
    assert content.endswith(question)
    return content[:-len(question)]


def test_prompt_mix_pads_first_prompts_by_the_given_sizes(fast: FakeServer) -> None:
    mix = (0, 10, 50, 200)
    start = len(fast.seen["bodies"])
    level = _measure(fast.url, 4, 8, prompt_mix=mix)
    assert len(level.completed) == 8
    bodies, hosts = fast.seen["bodies"][start:], fast.seen["hosts"][start:]
    docs: dict[int, list[str]] = defaultdict(list)
    for body in bodies:
        content = body["messages"][1]["content"]
        (k,) = [k for k, q in enumerate(bench.PROMPTS) if content.endswith(q)]
        doc = _split_pad(content, bench.PROMPTS[k])
        pad = mix[k % len(mix)]
        docs[pad].append(doc)
        if pad == 0:
            assert doc == ""
        else:
            # The document comes first, is about `pad` tokens (whole sentences, so up to one
            # sentence more), and is fresh per request so no cache can serve it.
            assert doc.startswith("Document ") and doc.endswith("\n\n")
            assert pad * bench.CHARS_PER_TOKEN <= len(doc) - 2 < pad * bench.CHARS_PER_TOKEN + 100
    assert {pad: len(d) for pad, d in docs.items()} == {pad: 2 for pad in mix}
    assert all(len(set(d)) == 2 for pad, d in docs.items() if pad)
    # Users arriving together: user i's first request carries mix[i], so lengths differ.
    first = {h: len(b["messages"][1]["content"]) for h, b in reversed(list(zip(hosts, bodies,
                                                                                strict=True)))}
    lengths = [first[f"127.0.0.{i + 2}"] for i in range(4)]
    assert lengths == sorted(lengths) and len(set(lengths)) == 4
    by_pad = level.by_pad()
    assert list(by_pad) == ["0", "10", "50", "200"]
    assert all(s["requests"] == s["completed"] == 2 and s["ttft_ms_p50"] is not None
               for s in by_pad.values())
    sizes = [s["prompt_tokens"] for s in by_pad.values()]
    assert sizes == sorted(sizes) and sizes[-1] - sizes[0] >= 200


def test_run_rewrite_with_prompt_mix_and_turns(
    fast: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = len(fast.seen["bodies"])
    out_path = tmp_path / "bench.json"
    assert _run("--url", fast.url, "--concurrency", "2", "--workload", "rewrite",
                "--prompt-mix", "0,40", "--turns", "2", "--think-s", "0", "--max-tokens", "8",
                "--json", str(out_path)) == 0
    conversations = {host: session for session, (host, _) in _user_turns(fast.seen, start).items()}
    bodies = defaultdict(list)
    for session, body in zip(fast.seen["session_ids"][start:], fast.seen["bodies"][start:],
                             strict=True):
        bodies[session].append(body["messages"])
    plain, padded = bodies[conversations["127.0.0.2"]], bodies[conversations["127.0.0.3"]]
    assert plain[0][1]["content"] == bench.REWRITE_PROMPTS[0]
    doc = _split_pad(padded[0][1]["content"], bench.REWRITE_PROMPTS[1])
    assert doc.startswith("Document ") and len(doc) >= 40 * bench.CHARS_PER_TOKEN
    # Only the first prompt is padded; the history keeps it and turn 2 asks for the code again.
    assert padded[1][:2] == padded[0]
    assert padded[1][-1]["content"] in bench.REWRITE_FOLLOW_UPS[1]

    out = capsys.readouterr().out
    assert "--prompt-mix document" in out and "ttft50@2+" in out
    report = json.loads(out_path.read_text())
    assert report["settings"]["workload"] == "rewrite"
    assert report["settings"]["prompt_mix"] == [0, 40]
    (level,) = report["levels"]
    by_pad = level["results"]["appliance"]["by_prompt_mix"]
    assert list(by_pad) == ["0", "40"] and all(s["requests"] == 1 for s in by_pad.values())


@pytest.mark.parametrize("argv", [["--prompt-mix", "20,x"], ["--prompt-mix", "20,-1"],
                                  ["--prompt-mix", ","], ["--workload", "poetry"]])
def test_bad_workload_arguments_are_rejected(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    parser.parse_args(["--prompt-mix", "0, 20,600"])  # spaces and zero are fine


def test_burst_lets_every_request_go_at_once_from_one_address(
    fast: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = len(fast.seen["bodies"])
    jsonl = tmp_path / "runs.jsonl"
    fast.app.state.hold.update(until=bench.BURST_SIZE, most=0)  # no reply before all 20 are in
    try:
        assert _run("--url", fast.url, "--workload", "burst", "--max-tokens", "8", "--quiet",
                    "--jsonl", str(jsonl), "--tag", "b") == 0
    finally:
        fast.app.state.hold["until"] = 0
    bodies = fast.seen["bodies"][start:]
    # One request per product, each a different one, all from the one address.
    assert len(bodies) == bench.BURST_SIZE == 20
    assert sorted(b["messages"][-1]["content"] for b in bodies) == sorted(bench.BURST_PROMPTS)
    assert set(fast.seen["hosts"][start:]) == {"127.0.0.2"}
    out = capsys.readouterr().out
    assert "back" in out and "20/20" in out
    (rec,) = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert rec["workload"] == "burst" and rec["tag"] == "b" and rec["concurrency"] == 20
    assert rec["completed"] == rec["requests"] == 20
    # All 20 started together: the fake held its replies until all 20 were in progress (one at a
    # time would have waited 10 s each for the others: counted, not timed).
    assert fast.app.state.hold["most"] == 20 and rec["last_answer_s"] > 0


def test_burst_exits_1_unless_every_answer_comes_back(
    fast: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run("--url", fast.url + "/broken", "--workload", "burst", "--concurrency", "3",
                "--model", "m", "--quiet") == 1
    assert "0/3" in capsys.readouterr().out


def test_soak_runs_for_its_duration_and_samples_the_servers_rss(
    fast: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "soak.json"
    t0 = time.perf_counter()
    # The fake server runs in this process, so the process listening on its port is us.
    assert _run("--url", fast.url, "--workload", "soak", "--concurrency", "2", "--duration-s", "1",
                "--rss-every-s", "0.2", "--warmup-s", "0.5", "--turns", "2", "--think-s", "0",
                "--max-tokens", "8", "--quiet", "--json", str(out_path)) == 0
    assert time.perf_counter() - t0 >= 1.0  # its duration at least (how much longer a busy machine takes: no bound)
    (level,) = json.loads(out_path.read_text())["levels"]
    s = level["results"]["appliance"]
    assert s["requests"] > 4 and s["completed"] == s["requests"]  # steady: many, all answered
    assert s["wall_s"] >= 1.0
    rss = s["rss_mib"]
    assert all(isinstance(rss[k], float) and rss[k] > 0 for k in ("start", "warm", "end", "max"))
    assert rss["max"] >= max(rss["start"], rss["end"])
    times = [t for t, _ in s["rss_samples"]]
    assert len(times) >= 4 and times == sorted(times) and times[-1] >= 1.0
    out = capsys.readouterr().out
    assert "rss@warm" in out and "answered" in out


def test_listening_pid_finds_this_process_and_rss_reads_it(fast: FakeServer) -> None:
    import os
    port = int(fast.url.rsplit(":", 1)[1])
    assert bench.listening_pid(port) == os.getpid()
    assert bench.server_pid(fast.url) == os.getpid()
    assert bench.server_pid("http://10.0.0.1:8080") is None
    assert bench.server_pid("http://10.0.0.1:8080", pid=42) == 42
    mib = bench.rss_mib(os.getpid())
    assert mib is not None and mib > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening
        assert bench.listening_pid(s.getsockname()[1]) is None


def test_listening_pid_survives_an_fd_closing_mid_scan(fast: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # A busy server opens and closes sockets while we scan its fds: one vanishing between the
    # listing and its readlink must not hide the process (CI once saw None here).
    import os

    from appliance.bench import rss
    real = os.readlink
    port = int(fast.url.rsplit(":", 1)[1])
    failed: list[str] = []

    def flaky(path: str | os.PathLike[str]) -> str:
        if str(path).startswith(f"/proc/{os.getpid()}/fd/") and not failed:
            failed.append(str(path))
            raise FileNotFoundError(path)
        return real(path)

    monkeypatch.setattr(rss.os, "readlink", flaky)
    assert rss.listening_pid(port) == os.getpid()
    assert failed  # the vanishing fd really was one of ours


def test_several_compares_by_label(
    fast: FakeServer, slow: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path, jsonl = tmp_path / "bench.json", tmp_path / "runs.jsonl"
    jsonl.write_text("")  # appended to, never overwritten
    for tag in ("first", "second"):
        assert _run("--url", fast.url, "--compare", f"slowpoke={slow.url}", "--compare", fast.url + "/v1",
                    "--concurrency", "1,2", "--requests", "2", "--max-tokens", "8", "--quiet",
                    "--json", str(out_path), "--jsonl", str(jsonl), "--tag", tag) == 0
    out = capsys.readouterr().out
    assert "ratio slowpoke" in out and "ratio peer" in out
    report = json.loads(out_path.read_text())
    assert [s["label"] for s in report["servers"]] == ["appliance", "slowpoke", "peer"]
    for lv in report["levels"]:
        assert set(lv["ratios"]) == {"slowpoke", "peer"} and "ratio" not in lv
        assert lv["ratios"]["slowpoke"]["ttft_p50"] > 1
    records = bench.read_jsonl([str(jsonl)])
    assert len(records) == 2 * 2 * 3  # runs x levels x servers
    assert [r["tag"] for r in records] == ["first"] * 6 + ["second"] * 6
    assert {r["label"] for r in records} == {"appliance", "slowpoke", "peer"}
    slowpoke = [r for r in records if r["label"] == "slowpoke"]
    assert all(r["ratio"]["of"] == "appliance" and r["ratio"]["ttft_p50"] > 1 for r in slowpoke)
    assert all("ratio" not in r for r in records if r["label"] == "appliance")


def test_compare_label_and_url_parsing() -> None:
    assert _compare("peer=http://127.0.0.1:1") == ("peer", "http://127.0.0.1:1")
    assert _compare("http://h:1/v1?a=b") == (None, "http://h:1/v1?a=b")
    assert _compare("127.0.0.1:8080") == (None, "127.0.0.1:8080")


def test_duplicate_labels_are_rejected(fast: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("--url", fast.url, "--compare", f"appliance={fast.url}") == 2
    assert "labels must differ" in capsys.readouterr().err


def test_markdown_report_leaves_out_empty_columns(
    fast: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run("--url", fast.url, "--compare", fast.url, "--concurrency", "1", "--requests", "2",
                "--max-tokens", "8", "--markdown", "--quiet") == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("|")]
    head, rule, *rows = table
    assert head.startswith("| conc | server | ok |") and "itl95@long" not in head
    assert rule.startswith("|---:|:---|---:|")
    assert len(rows) == 3 and rows[-1].startswith("| 1 | ratio |")
    assert all(row.count("|") == head.count("|") for row in rows)


def test_progress_bar_draws_on_a_terminal_only(fast: FakeServer) -> None:
    import io

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    assert bench.Progress(pipe).enabled is False
    assert bench.Progress(tty, enabled=False).enabled is False
    progress = bench.Progress(tty)
    workload = bench.Workload(model="fake-model", max_tokens=8)
    level = asyncio.run(bench.measure(fast.url, 2, 4, workload, timeout=10, progress=progress))
    assert len(level.completed) == 4
    text = tty.getvalue()
    assert "appliance c=2  [" in text and "4/4  ok 4" in text
    assert text.endswith("\r\x1b[K")  # wiped at the end, so the report starts on a clean line
    progress.begin("soak", 10.0, timed=True)
    assert "0/10 s" in progress.line() and "[" + "." * bench.Progress.WIDTH + "]" in progress.line()


def test_plot_draws_several_labelled_runs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = [{"label": lb, "tag": tag, "workload": "chat", "concurrency": c,
                "tokens_per_s": c * k, "ttft_ms_p50": 100.0 * c if c < 8 else None}
               for lb, k in (("appliance", 30.0), ("llama-server", 20.0))
               for tag in ("a", "b") for c in (1, 4, 8)]
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")
    png = tmp_path / "out.png"
    assert _run("--plot", str(png), "--from", str(jsonl)) == 0
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) < 100_000


def test_plot_without_matplotlib_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    real = importlib.import_module

    def no_matplotlib(name: str, *args: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_matplotlib)
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text(json.dumps({"label": "a", "concurrency": 1, "tokens_per_s": 1.0}) + "\n")
    assert _run("--plot", str(tmp_path / "x.png"), "--from", str(jsonl)) == 2
    assert "appliance[plot]" in capsys.readouterr().err


@pytest.mark.parametrize("content,error", [("{not json\n", "not a JSON line"),
                                           ('{"label": "a"}\n', "not an `appliance bench --jsonl` record")])
def test_plot_from_a_bad_file_is_an_argument_error(
    tmp_path: Path, content: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text(content)
    assert _run("--plot", str(tmp_path / "x.png"), "--from", str(jsonl)) == 2
    assert error in capsys.readouterr().err
    assert _run("--from", str(jsonl)) == 2  # --from without --plot


def test_office_schedule_is_seeded_per_user() -> None:

    def take(office: bench.Office, user: int, n: int = 60, salt: str = "") -> list[bench.Conversation]:
        return list(islice(bench.conversations(office, user, salt), n))

    office = bench.Office(seed=0, doc_share=1 / 3, doc_tokens=40, follow_ups=3, think_s=2.0)
    assert take(office, 0) == take(office, 0)  # the same seed and user: the same conversations
    assert take(office, 0) != take(office, 1)  # users differ from each other
    assert take(office, 0) != take(bench.Office(seed=1, doc_share=1 / 3, doc_tokens=40), 0)
    convs = [c for u in range(4) for c in take(office, u)]
    assert [c.index for c in take(office, 2)] == list(range(60))
    docs = [c for c in convs if c.doc_tokens]
    assert 0.2 < len(docs) / len(convs) < 0.45 and all(c.doc_tokens == 40 for c in docs)
    for c in convs:
        assert 2 <= len(c.turns) <= 4  # the opening and 1..3 follow-ups
        first, *later = [t.text for t in c.turns]
        if c.doc_tokens:
            assert first.startswith("Document ") and first.split("\n\n")[-1] in bench.DOC_ASKS
            assert all(f in bench.DOC_FOLLOW_UPS for f in later)
        else:
            assert first in bench.PROMPTS and all(f in bench.FOLLOW_UPS for f in later)
    thinks = [t.think_s for c in convs for t in c.turns]
    assert min(thinks) >= 0 and 1.5 < sum(thinks) / len(thinks) < 2.5  # exponential, mean 2 s
    # A round's salt changes the documents' nonces only: the same questions, asks and pauses.
    salted = take(office, 0, salt="r1-")
    assert [(c.doc_tokens, [t.think_s for t in c.turns], [t.text for t in c.turns][1:]) for c in salted] == \
        [(c.doc_tokens, [t.think_s for t in c.turns], [t.text for t in c.turns][1:]) for c in take(office, 0)]
    assert all(c.turns[0].text.startswith("Document r1-") for c in salted if c.doc_tokens)
    none = bench.Office(doc_share=0, think_s=0)
    assert not any(c.doc_tokens or any(t.think_s for t in c.turns) for c in take(none, 0))


_OFFICE_ARGS = ("--workload", "office", "--concurrency", "3", "--duration-s", "1.2", "--think-s", "0.05",
                "--doc-share", "1/3", "--doc-tokens", "40", "--max-tokens", "8", "--quiet")
_OFFICE_KEYS = ("completed", "rejected", "failed", "tokens_per_s", "requests_per_min", "ttft_ms_p50",
                "ttft_ms_p95", "ttft_ms_p99", "turn1_ttft_ms_p50", "turn1_ttft_ms_p95", "turn1_ttft_ms_p99",
                "later_ttft_ms_p50", "later_ttft_ms_p95", "later_ttft_ms_p99", "user_tokens_per_s_p50",
                "user_tokens_per_s_p10", "user_inflight_tokens_per_s_p50", "user_inflight_tokens_per_s_p10",
                "user_ttft_ms_p50_best", "user_ttft_ms_p50_worst", "fairness_ttft_p50")


def _sent_by_host(seen: dict[str, list], start: int, n: int) -> dict[str, list[list[dict]]]:
    """address -> the messages of each request it sent, in order, for requests start..start+n."""
    out: dict[str, list[list[dict]]] = defaultdict(list)
    for host, body in zip(seen["hosts"][start:start + n], seen["bodies"][start:start + n], strict=True):
        out[host].append(body["messages"])
    return out


def test_office_run_compares_servers_on_the_same_schedule(
    fast: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path, png = tmp_path / "office.json", tmp_path / "office.png"
    with FakeServer(FAST_FIRST_S, FAST_GAP_S) as peer:
        starts = {"appliance": (fast, len(fast.seen["bodies"])), "peer": (peer, 0)}
        argv = ["--url", fast.url, "--compare", peer.url, *_OFFICE_ARGS, "--rounds", "2", "--json", str(out_path)]
        if importlib.util.find_spec("matplotlib"):
            argv += ["--plot", str(png)]
        assert _run(*argv) == 0
    out = capsys.readouterr().out
    for head in ("ttft99", "utok50", "utok10", "fair", "ttft50@1", "ttft99@1", "ttft50@2+", "ttft99@2+", "pad"):
        assert head in out, head
    text = out_path.read_text()
    report = json.loads(text)
    assert json.loads(json.dumps(report)) == report
    assert report["settings"]["office"] == {"seed": 0, "doc_share": 1 / 3, "doc_tokens": 40, "follow_ups": 3}
    assert report["settings"]["duration_s"] == 1.2 and report["settings"]["max_tokens"] == 8
    (level,) = report["levels"]
    assert level["concurrency"] == 3
    office = bench.Office(seed=0, doc_share=1 / 3, doc_tokens=40, think_s=0.05)
    for lb, (server, start) in starts.items():
        s = level["results"][lb]
        assert all(k in s for k in _OFFICE_KEYS)
        assert s["completed"] == s["requests"] > 6 and s["rejected"] == s["failed"] == 0
        assert s["users_answered"] == 3 and s["fairness_ttft_p50"] >= 1
        assert s["turn1_ttft_ms_p50"] is not None and s["later_ttft_ms_p50"] is not None
        assert set(level["median_of_rounds"][lb]) >= {"ttft_ms_p99", "user_tokens_per_s_p10", "fairness_ttft_p50"}
        for rnd, run in enumerate(level["office_rounds"][lb]):
            rows = run["requests"]
            sent = _sent_by_host(server.seen, start, len(rows))
            start += len(rows)
            # Every user on its own address, sending its seeded schedule, whichever the server.
            assert sorted(sent) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
            for u in range(3):
                expected = [t.text for c in islice(bench.conversations(office, u, f"r{rnd}-"), 50) for t in c.turns]
                said = [m[-1]["content"] for m in sent[bench.user_address(u)]]
                assert said == expected[:len(said)]
            # First turns are told apart from later ones: turn 1 sends the system prompt and one question.
            mine = [r for r in rows if r["user"] == 0]
            assert [r["turn"] == 1 for r in mine] == [len(m) == 2 for m in sent["127.0.0.2"]]
            assert {r["turn"] for r in rows} >= {1, 2}
            assert all(m[0]["content"] == bench.OFFICE_SYSTEM for ms in sent.values() for m in ms)
            assert run["timeline"] and all(isinstance(q, int) for _, _, q in run["timeline"])
        assert start == len(server.seen["bodies"])
    if importlib.util.find_spec("matplotlib"):
        assert png.read_bytes().startswith(b"\x89PNG")


def test_office_counts_refusals_and_starts_a_new_conversation(
    fast: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "office.json"
    start = len(fast.seen["bodies"])
    assert _run("--url", fast.url + "/flaky", *_OFFICE_ARGS, "--no-session-id", "--json", str(out_path)) == 0
    assert set(fast.seen["session_ids"][start:]) == {""}
    report = json.loads(out_path.read_text())
    (level,) = report["levels"]
    s = level["results"]["appliance"]
    assert s["rejected"] > 0 and s["completed"] > 0 and s["failed"] == 0
    assert s["failure_reasons"] == {"http 503": s["rejected"]}
    (run,) = level["office_rounds"]["appliance"]
    rows = run["requests"]
    assert len(rows) == s["requests"] == s["completed"] + s["rejected"]
    # Not retried: after a refusal that user's next turn opens its next conversation.
    for u in range(3):
        mine = [r for r in rows if r["user"] == u]
        for a, b in zip(mine, mine[1:], strict=False):
            if a["status"] == 503:
                assert (b["turn"], b["conversation"]) == (1, a["conversation"] + 1)
    # No /health queue behind this URL: the timeline holds the client's in-flight count only.
    assert run["timeline"] and all(q is None for _, _, q in run["timeline"])
    assert "http 503" in capsys.readouterr().out


@pytest.mark.parametrize("tasks, priority", [("lanes", ""), ("people", "people")])
def test_office_front_end_tasks_follow_every_answer_and_are_counted_apart(
    fast: FakeServer, tmp_path: Path, tasks: str, priority: str
) -> None:
    out_path = tmp_path / "office.json"
    start = len(fast.seen["bodies"])
    assert _run("--url", fast.url, *_OFFICE_ARGS, "--front-end-tasks", tasks, "--json", str(out_path)) == 0
    s = json.loads(out_path.read_text())["levels"][0]["results"]["appliance"]
    bodies, said = fast.seen["bodies"][start:], fast.seen["priority"][start:]
    asks = [b for b in bodies if not b["messages"][-1]["content"].startswith("### Task:")]
    titles = [b for b in bodies if "concise, 3-5 word title" in b["messages"][-1]["content"]]
    tags = [b for b in bodies if "broad tags" in b["messages"][-1]["content"]]
    # A title and a tags request per answer, apart from the people's turns, without a session id.
    assert s["requests"] == len(asks) and s["tasks"] == len(titles) + len(tags) == 2 * s["completed"] > 0
    assert all("<chat_history>" in b["messages"][0]["content"] and b["max_tokens"] == 40 for b in titles + tags)
    assert {p for b, p in zip(bodies, said, strict=True) if b in titles + tags} == {priority}
    assert s["tasks_failed"] == 0 and s["tasks_e2e_ms_p50"] is not None


def test_office_defaults() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--workload", "office"])
    assert (args.seed, args.doc_share, args.doc_tokens, args.follow_ups) == (0, 1 / 9, 700, 3)
    assert args.max_tokens is args.think_s is args.duration_s is None  # filled in per workload by run()
    from appliance.bench.cli import _DEFAULTS, _WORKLOAD_DEFAULTS
    from appliance.bench.prompts import DEFAULT_LEVELS
    assert _WORKLOAD_DEFAULTS["office"] == {"max_tokens": 96, "think_s": 6.0, "duration_s": 150.0,
                                            "system": bench.OFFICE_SYSTEM}
    assert _DEFAULTS["max_tokens"] == 64 and _DEFAULTS["think_s"] == 1.0
    assert DEFAULT_LEVELS["office"] == [20]
    for bad in ("1/0", "2", "-0.1", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--doc-share", bad])
