"""The real server on the bundled model, over real HTTP."""

from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.live import Live
from helpers.sse import content_of, events_in, events_of

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}


def ask(text: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": text}]


def test_models_lists_the_served_model(server: Live) -> None:
    r = server.client.get("/v1/models")
    assert r.status_code == 200
    data = r.json()
    assert data["object"] == "list"
    assert data["data"][0]["id"] == "qwen2.5-coder-0.5b-instruct-q4_k_m"


def test_streamed_answer_in_english(server: Live) -> None:
    events = list(server.stream(ask("What is the capital of France? One word."), max_tokens=20, temperature=0))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert "Paris" in content_of(events)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_streamed_answer_in_chinese_is_valid_utf8(server: Live) -> None:
    raw = b""
    body = {"messages": ask("用中文回答：中国的首都是哪个城市？"), "stream": True, "max_tokens": 40, "temperature": 0}
    with server.client.stream("POST", "/v1/chat/completions", json=body) as r:
        for part in r.iter_bytes():
            raw += part
    text = content_of(events_in(raw.decode("utf-8")))
    assert "\ufffd" not in text  # no character was split into broken bytes
    assert "北京" in text
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text)


def test_non_streamed_with_usage(server: Live) -> None:
    r = server.chat(ask("Name three colours."), max_tokens=30, temperature=0)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"].strip()
    u = body["usage"]
    assert u["prompt_tokens"] > 10 and 0 < u["completion_tokens"] <= 30
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert r.headers["x-session-id"]


def test_stream_include_usage(server: Live) -> None:
    events = list(server.stream(ask("Say hi."), max_tokens=10, stream_options={"include_usage": True}))
    usage_chunks = [e for e in events if isinstance(e, dict) and e.get("usage")]
    assert len(usage_chunks) == 1 and usage_chunks[0]["choices"] == []
    assert usage_chunks[0]["usage"]["completion_tokens"] >= 1
    assert events[-1] == "[DONE]"


def test_same_request_twice_gives_same_greedy_answer(server: Live) -> None:
    # Identical schedule (one request alone, twice) gives identical output at temperature 0.
    server.wait_idle()
    a = server.chat(ask("Write one sentence about tea."), max_tokens=40, temperature=0).json()
    server.wait_idle()
    b = server.chat(ask("Write one sentence about tea."), max_tokens=40, temperature=0).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_openai_sdk_streaming_and_not(server: Live) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(trust_env=False))
    model = client.models.list().data[0].id
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    done = client.chat.completions.create(model=model, messages=ask("What is 2+2?"), max_tokens=20, temperature=0)
    assert "4" in (done.choices[0].message.content or "")
    assert done.usage is not None and done.usage.completion_tokens > 0
    parts = []
    finish = None
    stream = client.chat.completions.create(model=model, messages=ask("What is 3+3?"), max_tokens=20,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    for ch in stream:
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    assert "6" in "".join(parts) and finish in ("stop", "length")


def test_long_conversation_drops_oldest_turns_and_answers(server: Live) -> None:
    history: list[dict[str, str]] = [SYSTEM]
    for i in range(40):  # ~40 x 45 tokens: well past the 1024-token context
        history.append({"role": "user", "content": f"Note {i}: the quick brown fox jumps over the lazy dog number {i}."})
        history.append({"role": "assistant", "content": f"Noted, fox number {i} jumped over the lazy dog."})
    history.append({"role": "user", "content": "Reply with the word OK."})
    r = server.chat(history, max_tokens=10)
    assert r.status_code == 200, r.text
    body = r.json()
    dropped = body["dropped_messages"]
    assert 0 < dropped < len(history) - 2
    assert int(r.headers["x-dropped-messages"]) == dropped
    assert body["choices"][0]["message"]["content"].strip()
    assert body["usage"]["prompt_tokens"] <= 1024


BAD_REQUESTS: list[tuple[str, Any]] = [
    ("malformed JSON", b'{"messages": [}'),
    ("not an object", b"[1, 2]"),
    ("no messages", {"model": "x"}),
    ("empty messages", {"messages": []}),
    ("wrong role", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("content int", {"messages": [{"role": "user", "content": 42}]}),
    ("content missing", {"messages": [{"role": "user"}]}),
    ("max_tokens 0", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
    ("max_tokens negative", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}),
    ("max_tokens absurd", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**12}),
    ("max_tokens string", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "10"}),
    ("temperature < 0", {"messages": [{"role": "user", "content": "hi"}], "temperature": -0.5}),
    ("stream not bool", {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}),
    ("one message longer than the context",
     {"messages": [{"role": "user", "content": "lorem ipsum dolor sit amet " * 400}]}),
]


@pytest.mark.parametrize("name,body", BAD_REQUESTS, ids=[n for n, _ in BAD_REQUESTS])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_request_is_400_with_openai_error(server: Live, name: str, body: Any, stream: bool) -> None:
    if isinstance(body, dict) and stream and "stream" not in body:
        body = {**body, "stream": True}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = server.client.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, (name, r.text)
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if name == "one message longer than the context":
        assert err["code"] == "context_length_exceeded"


def test_server_keeps_serving_after_bad_requests(server: Live) -> None:
    for _, body in BAD_REQUESTS:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        server.client.post("/v1/chat/completions", content=content)
    r = server.chat(ask("Say yes."), max_tokens=5)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert server.wait_idle()["slots"]["busy"] == 0


def test_unknown_route_and_method(server: Live) -> None:
    r = server.client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = server.client.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_unknown_fields_are_ignored(server: Live) -> None:
    r = server.chat(ask("Say hi."), max_tokens=5, user="alice", metadata={"a": 1}, parallel_tool_calls=False,
                    some_future_field=[1, 2])
    assert r.status_code == 200


def test_chat_page_is_served(server: Live) -> None:
    r = server.client.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "<script" in r.text and "http://" not in r.text and "https://" not in r.text  # no CDN
    js = server.client.get("/static/app.js")
    assert js.status_code == 200 and "/v1/chat/completions" in js.text.replace("v1/chat", "/v1/chat")


def test_streaming_client_disconnect_frees_slot(server: Live) -> None:
    server.wait_idle()
    before = server.health()["engine"]["finished"].get("cancelled", 0)
    body = {"messages": ask("Count from 1 to 500, one number per line."), "stream": True, "max_tokens": 500,
            "temperature": 0}  # greedy: the same long answer every run
    with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            n = 0
            for ev in events_of(r):
                if isinstance(ev, dict):
                    n += 1
                    if n == 5:
                        break  # leave mid-answer: closing the client drops the connection
    h = server.wait_idle(timeout=180)  # a condition, not a speed: beside neighbours the slot frees later
    assert h["engine"]["finished"].get("cancelled", 0) == before + 1


def test_non_streaming_client_disconnect_frees_slot(server: Live) -> None:
    server.wait_idle()
    before = server.health()["engine"]["finished"].get("cancelled", 0)
    with httpx.Client(base_url=server.url, timeout=1.5, trust_env=False) as c:
        with pytest.raises(httpx.ReadTimeout):
            # ~700 prompt tokens take seconds to prefill: the client gives up long before.
            c.post("/v1/chat/completions", json={"messages": ask("Tell me about this. " * 120),
                                                 "max_tokens": 100, "temperature": 0})
    h = server.wait_idle(timeout=180)  # a condition, not a speed: beside neighbours the slot frees later
    assert h["engine"]["finished"].get("cancelled", 0) == before + 1


def test_eight_concurrent_streams_share_decode_steps(start_server: Callable[..., Live]) -> None:
    live = start_server(slots=8, max_wait_ms=200)
    try:
        live.wait_ready()
        questions = ["Name a fruit.", "Name a colour.", "Name a city.", "Name an animal.",
                     "Name a planet.", "Name a tree.", "Name a river.", "Name a metal."]

        def one(q: str) -> list[Any]:
            return list(live.stream(ask(q), max_tokens=24, temperature=0))

        with cf.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, questions))
        for events in results:
            assert events[-1] == "[DONE]" and content_of(events).strip()
        h = live.health()
        assert h["engine"]["peak_seqs_per_step"] == 8
        assert h["engine"]["finished"].get("stop", 0) + h["engine"]["finished"].get("length", 0) == 8
    finally:
        assert live.stop() == 0


def test_health_is_loading_then_ready(start_server: Callable[..., Live]) -> None:
    live = start_server(ready=False)
    try:
        live.wait_port()  # HTTP is up before the model: loading takes seconds from here
        early = live.chat(ask("hi"))
        seen: list[tuple[int, str]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = live.client.get("/health")
            seen.append((r.status_code, r.json()["status"]))
            if r.status_code == 200:
                break
        assert early.status_code == 503 and early.json()["error"]["message"] and early.headers["retry-after"]
        assert seen[0] == (503, "loading")
        assert seen[-1] == (200, "ok")
        assert set(seen) == {(503, "loading"), (200, "ok")}
        assert live.chat(ask("hi"), max_tokens=3).status_code == 200
    finally:
        assert live.stop() == 0


def test_sigterm_lets_running_stream_finish_then_exits_0(start_server: Callable[..., Live]) -> None:
    live = start_server(grace_s=60)
    live.wait_ready()
    body = {"messages": ask("Count from 1 to 30, separated by commas."), "stream": True,
            "max_tokens": 80, "temperature": 0}
    events: list[Any] = []
    statuses = []
    with httpx.Client(base_url=live.url, timeout=120, trust_env=False) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            for ev in events_of(r):
                events.append(ev)
                if len(events) == 3:
                    live.proc.send_signal(signal.SIGTERM)
                    time.sleep(0.3)
                    h = httpx.get(live.url + "/health", trust_env=False, timeout=5)
                    statuses.append((h.status_code, h.json()["status"]))
                    late = httpx.post(live.url + "/v1/chat/completions", json={"messages": ask("hi")},
                                      trust_env=False, timeout=5)
                    statuses.append((late.status_code, late.json()["error"]["type"]))
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert statuses == [(503, "draining"), (503, "server_unavailable")]
    assert live.proc.wait(60) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", live.port), timeout=1).close()


def test_oversized_body_is_413_and_long_stop_is_400(server: Live) -> None:
    big = b'{"messages": [{"role": "user", "content": "' + b"a" * (5 * 2**20) + b'"}]}'
    r = server.client.post("/v1/chat/completions", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["message"]
    r = server.chat(ask("hi"), stop=["x" * 1000])
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    assert server.chat(ask("Say ok."), max_tokens=3).status_code == 200


def test_q8_0_kv_cache_serves_and_its_state_is_not_mixed_with_f16(start_server: Callable[..., Live], tmp_path: Path) -> None:
    state = tmp_path / "state"
    live = start_server(kv_type="q8_0", state_dir=state)
    try:
        live.wait_ready()
        r = live.client.post("/v1/chat/completions", headers={"X-Session-Id": "kvq-session-000001"},
                             json={"messages": ask("What is the capital of France? One word."),
                                   "max_tokens": 10, "temperature": 0})
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]
    finally:
        assert live.stop() == 0
    assert len(list(state.glob("*.kv"))) == 1
    # An f16 server must not load state saved with a q8_0 cache.
    live = start_server(state_dir=state)
    try:
        live.wait_ready()
        assert live.client.get("/v1/sessions/kvq-session-000001").status_code == 404
        assert "another model, llama.cpp version or KV type" in live.log()
    finally:
        assert live.stop() == 0
