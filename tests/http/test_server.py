"""The app over the fake model, through HTTP only: every route, SSE framing and every error
status, in-process and in a few seconds.

Most tests use Starlette's TestClient. It hands a response back only once the app has
finished it, so the few tests that must act mid-stream (read the first chunk, then leave or
send another request) run the same app behind uvicorn on a real socket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import (
    CHAT,
    CTX,
    MODEL_ID,
    REPLY,
    USER,
    Served,
    chat,
    dicts,
    error_of,
    events_of,
    failing_after,
    is_idle,
    is_ready,
    serving,
    user,
    wait_health,
)
from starlette.testclient import TestClient

from appliance.bench import sse


# -- routes --------------------------------------------------------------------------------
def test_health_is_loading_until_the_model_is_up_then_ok() -> None:
    loaded = threading.Event()

    def slow_model() -> FakeModel:
        loaded.wait(5)
        return FakeModel(reply=REPLY)

    with serving(slow_model, ready=False) as client:
        try:
            r = client.get("/health")
            assert (r.status_code, r.json()) == (503, {"status": "loading"})
            # HTTP is up before the model: a chat is refused politely, not left hanging.
            err = error_of(chat(client), 503)
            assert err["type"] == "server_unavailable"
            assert int(chat(client, stream=True).headers["retry-after"]) > 0
            assert client.get("/v1/models").status_code == 200
        finally:
            loaded.set()
        h = wait_health(client.get, is_ready)
        assert client.get("/health").status_code == 200
        assert h["model"] == MODEL_ID
        assert h["slots"] == {"total": 2, "busy": 0, "idle": 2} and h["queue"] == 0


def test_health_reports_a_failed_load_and_metrics_can_be_off() -> None:
    def broken() -> FakeModel:
        raise RuntimeError("no such model file")

    with serving(broken, ready=False, metrics=False) as client:
        h = wait_health(client.get, lambda h: h["status"] != "loading")
        r = client.get("/health")
        assert r.status_code == 503 and h == {"status": "failed", "error": "no such model file"}
        assert error_of(chat(client), 503)["type"] == "server_unavailable"
        assert error_of(client.get("/metrics"), 404)["type"] == "invalid_request_error"


def test_models(client: TestClient) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    (model,) = body["data"]
    assert model["id"] == MODEL_ID and model["object"] == "model"
    assert isinstance(model["created"], int) and model["owned_by"]


def test_chat_not_streamed(client: TestClient) -> None:
    r = chat(client)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL_ID
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": REPLY}
    assert choice["finish_reason"] == "stop"
    use = body["usage"]
    assert use["completion_tokens"] == len(REPLY) and use["prompt_tokens"] > len("hi")
    assert use["total_tokens"] == use["prompt_tokens"] + use["completion_tokens"]
    assert "dropped_messages" not in body and "x-dropped-messages" not in r.headers

    r = chat(client, max_tokens=3)
    assert r.json()["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "hel"},
                                      "logprobs": None, "finish_reason": "length"}


def test_stream_framing_with_usage(client: TestClient) -> None:
    r = chat(client, stream=True, stream_options={"include_usage": True})
    assert r.headers["cache-control"] == "no-cache"
    # Every event is one `data:` line ended by a blank line.
    assert r.text.endswith("\n\n")
    blocks = r.text.split("\n\n")[:-1]
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks
    events = events_of(r)
    assert events[-1] == sse.DONE
    chunks = dicts(events)
    assert len(chunks) == len(events) - 1  # no comments: nobody waited
    first, *deltas, finish, usage = chunks
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert {c["model"] for c in chunks} == {MODEL_ID}
    # content null, as OpenAI's first delta before a tool call and llama-server's always
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert {c["system_fingerprint"] for c in chunks} == {first["system_fingerprint"]}
    assert "".join(sse.content(d) for d in deltas) == REPLY
    assert all(d["choices"][0]["finish_reason"] is None for d in deltas)
    assert finish["choices"] == [{"index": 0, "delta": {}, "logprobs": None,
                                  "finish_reason": "stop"}]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(REPLY)
    use = usage["usage"]
    assert 0 <= use["prompt_tokens_details"]["cached_tokens"] < use["prompt_tokens"]
    assert use["total_tokens"] == use["prompt_tokens"] + use["completion_tokens"]


def test_stream_of_an_answer_with_unicode_line_separators() -> None:
    # The server escapes U+2028, U+2029 and U+0085 inside its JSON, so the event stays whole
    # even for a reader that splits lines at them (httpx's iter_lines, str.splitlines).
    reply = "a\u2028b\u0085c\u2029d"
    with serving(lambda: FakeModel(reply=reply)) as client:
        r = chat(client, stream=True)
        assert "".join(sse.content(e) for e in events_of(r)) == reply
        assert "".join(sse.content(e) for e in sse.iter_events(r.iter_lines())) == reply


def test_stream_without_usage(client: TestClient) -> None:
    events = events_of(chat(client, stream=True, max_tokens=2))
    assert events[-1] == sse.DONE
    chunks = dicts(events)
    assert "".join(sse.content(c) for c in chunks) == "he"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("usage" in c for c in chunks)


def test_session_id_is_echoed_or_made_up(client: TestClient) -> None:
    made = [chat(client).headers["x-session-id"] for _ in range(2)]
    assert all(len(s) == 32 and int(s, 16) >= 0 for s in made) and made[0] != made[1]
    r = chat(client, stream=True, stream_options={"include_usage": True})
    assert len(r.headers["x-session-id"]) == 32
    assert client.post(CHAT, json={"messages": USER},
                       headers={"X-Session-Id": "desk-7-session-000"}).headers["x-session-id"] == "desk-7-session-000"
    # OpenAI clients that cannot set headers may put it in the body.
    assert chat(client, session_id="desk-8-session-000").headers["x-session-id"] == "desk-8-session-000"
    err = error_of(client.post(CHAT, json={"messages": USER}, headers={"X-Session-Id": "a b"}), 400)
    assert err["param"] == "session_id"


def test_session_get_and_delete(client: TestClient) -> None:
    sid = {"X-Session-Id": "office-session-0042"}
    first = client.post(CHAT, json={"messages": USER}, headers=sid).json()
    info = client.get("/v1/sessions/office-session-0042")
    assert info.status_code == 200
    body = info.json()
    assert body["id"] == "office-session-0042" and body["state"] == "cached"
    assert 0 < body["cached_tokens"] <= first["usage"]["total_tokens"]
    # The next turn of the same session reuses what the first one left in the cache.
    history = [*USER, {"role": "assistant", "content": REPLY}, {"role": "user", "content": "more"}]
    second = client.post(CHAT, json={"messages": history}, headers=sid).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

    assert client.delete("/v1/sessions/office-session-0042").status_code == 204
    assert error_of(client.delete("/v1/sessions/office-session-0042"), 404)["type"] == "invalid_request_error"
    error_of(client.get("/v1/sessions/office-session-0042"), 404)
    error_of(client.get("/v1/sessions/never-was-a-session"), 404)


def test_dropped_messages_are_reported(client: TestClient) -> None:
    turns = [{"role": r, "content": f"{r} {i} " + "x" * 90}
             for i in range(4) for r in ("user", "assistant")]
    messages = [{"role": "system", "content": "Be brief."}, *turns, *USER]
    r = client.post(CHAT, json={"messages": messages})
    dropped = int(r.headers["x-dropped-messages"])
    assert dropped >= 2 and r.json()["dropped_messages"] == dropped
    r = client.post(CHAT, json={"messages": messages, "stream": True})
    first = dicts(events_of(r))[0]
    assert int(r.headers["x-dropped-messages"]) == first["dropped_messages"] == dropped


def test_metrics_and_debug_steps(client: TestClient) -> None:
    chat(client)
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "appliance_time_to_first_token_seconds" in r.text
    assert "appliance_llama_threads" not in r.text  # this engine does not share its cores: no 0 threads
    steps = client.get("/debug/steps").json()["steps"]
    # Each step starts [decode seqs, prefill seqs, prefill tokens, ...].
    assert steps and all(len(s) >= 3 and all(isinstance(n, int) for n in s) for s in steps)
    assert any(s[0] > 0 for s in steps) and any(s[1] > 0 for s in steps)  # decode and prefill


def test_chat_page_and_static_files(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "v1/chat/completions" in js.text
    error_of(client.get("/static/nope.js"), 404)


# -- errors --------------------------------------------------------------------------------
BAD_REQUESTS: list[tuple[str, bytes | dict[str, Any], str | None]] = [
    ("not json", b"{", None),
    ("not an object", b"[1, 2]", None),
    ("not utf-8", b'{"messages": "\xff"}', None),
    ("no messages", {}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("message not an object", {"messages": ["hi"]}, "messages[0]"),
    ("bad role", {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ("function role", {"messages": [{"role": "function", "content": "hi"}]}, "messages[0].role"),
    ("no content", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("temperature a string", {"messages": USER, "temperature": "hot"}, "temperature"),
    ("temperature too high", {"messages": USER, "temperature": 3}, "temperature"),
    ("top_p zero", {"messages": USER, "top_p": 0}, "top_p"),
    ("max_tokens a float", {"messages": USER, "max_tokens": 1.5}, "max_tokens"),
    ("max_tokens a bool", {"messages": USER, "max_tokens": True}, "max_tokens"),
    ("max_tokens zero", {"messages": USER, "max_tokens": 0}, "max_tokens"),
    ("max_tokens beyond the context", {"messages": USER, "max_tokens": CTX + 1}, "max_tokens"),
    ("stream a string", {"messages": USER, "stream": "yes"}, "stream"),
    ("stream_options a list", {"messages": USER, "stream": True, "stream_options": []},
     "stream_options"),
    ("stop a number", {"messages": USER, "stop": 5}, "stop"),
    ("stop too long", {"messages": USER, "stop": ["x" * 1000]}, "stop"),
    ("n of 9", {"messages": USER, "n": 9}, "n"),
    ("unknown tool_choice", {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
                             "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("unenforceable schema", {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "minimum": 1}}}}, "response_format.json_schema.schema"),
    ("model a number", {"messages": USER, "model": 7}, "model"),
    ("session_id a number", {"messages": USER, "session_id": 7}, "session_id"),
    ("session_id with a newline", {"messages": USER, "session_id": "a\nb"}, "session_id"),
    ("prompt beyond the context", {"messages": [{"role": "user", "content": "x" * CTX}]},
     "messages"),
]
# The JSON ones again as stream requests: they too get a plain JSON error, nothing started.
_BAD_CASES = [pytest.param(body, param, id=name) for name, body, param in BAD_REQUESTS] + [
    pytest.param({"stream": True, **body}, param, id=f"{name}, streamed")
    for name, body, param in BAD_REQUESTS if isinstance(body, dict) and "stream" not in body]


@pytest.mark.parametrize("body,param", _BAD_CASES)
def test_bad_request_is_400_with_openai_error(client: TestClient, body: bytes | dict[str, Any],
                                              param: str | None) -> None:
    if isinstance(body, dict):
        r = client.post(CHAT, json=body)
    else:
        r = client.post(CHAT, content=body, headers={"Content-Type": "application/json"})
    err = error_of(r, 400)
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_a_too_long_prompt_says_so(client: TestClient) -> None:
    err = error_of(client.post(CHAT, json={"messages": [{"role": "user", "content": "x" * CTX}]}), 400)
    assert err["code"] == "context_length_exceeded"


def test_max_tokens_within_the_context_is_capped_not_refused() -> None:
    # A reply longer than any answer may be: it ends at max_tokens_limit (256), not at CTX.
    with serving(lambda: FakeModel(reply="x" * CTX)) as c:
        r = chat(c, max_tokens=CTX)
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 256 and r.json()["choices"][0]["finish_reason"] == "length"


def test_unknown_route_is_404(client: TestClient) -> None:
    err = error_of(client.get("/v1/nope"), 404)
    assert "/v1/nope" in err["message"]
    error_of(client.post("/v1/embeddings", json={"input": "hi"}), 404)


@pytest.mark.parametrize("method,path", [("GET", CHAT), ("PUT", CHAT), ("POST", "/v1/models"),
                                         ("POST", "/health"), ("PATCH", "/v1/sessions/s")])
def test_wrong_method_is_405(client: TestClient, method: str, path: str) -> None:
    assert error_of(client.request(method, path), 405)["type"] == "invalid_request_error"


@pytest.mark.parametrize("method,path,allowed", [
    ("GET", CHAT, {"POST"}),
    ("POST", "/v1/models", {"GET", "HEAD"}),
    ("PATCH", "/v1/sessions/s", {"GET", "HEAD", "DELETE"}),
])
def test_405_says_which_methods_are_allowed(client: TestClient, method: str, path: str,
                                            allowed: set[str]) -> None:
    # RFC 9110 section 15.5.6: a 405 must list the methods the resource does support.
    allow = client.request(method, path).headers.get("allow", "")
    assert {m.strip() for m in allow.split(",") if m.strip()} == allowed


def test_big_body_is_413(client: TestClient) -> None:
    big = b'{"messages": [{"role": "user", "content": "' + b"a" * (5 * 2**20) + b'"}]}'
    r = client.post(CHAT, content=big, headers={"Content-Type": "application/json"})
    assert error_of(r, 413)["type"] == "invalid_request_error"

    # Without a Content-Length the server must still stop reading past the limit.
    def chunks() -> Iterator[bytes]:
        for _ in range(6):
            yield b" " * 2**20

    r = client.post(CHAT, content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in r.request.headers
    error_of(r, 413)


def test_queue_timeout_is_503_or_an_error_event_once_streaming() -> None:
    # One slot, held ~1 s by user 0 (100 steps of 10 ms); the others give up after 0.2 s.
    model = FakeModel(reply="x" * 100, delay=0.01)
    with serving(lambda: model, slots=1, queue_timeout_s=0.2) as client, \
            cf.ThreadPoolExecutor(1) as pool:
        holder = pool.submit(client.post, CHAT, json={"messages": USER, "max_tokens": 100},
                             headers=user(0))
        wait_health(client.get, lambda h: h["slots"]["busy"] == 1)
        r = client.post(CHAT, json={"messages": USER}, headers=user(1))
        err = error_of(r, 503)
        assert err["type"] == "server_unavailable"

        # Once the 200 and the first chunk are out, the error can only travel in the stream.
        r = client.post(CHAT, json={"messages": USER, "stream": True}, headers=user(2))
        events = [e for e in events_of(r) if not isinstance(e, sse.Comment)]
        assert sse.DONE not in events
        role, error = dicts(events)
        assert role["choices"][0]["delta"]["role"] == "assistant"
        assert set(error) == {"error"} and error["error"]["type"] == "server_unavailable"
        assert r.text.endswith("\n\n")

        assert holder.result().json()["choices"][0]["message"]["content"] == "x" * 100
        assert wait_health(client.get, is_idle)["engine"]["finished"]["queue_timeout"] == 2


def test_decode_failure_mid_stream_is_an_error_event_then_close() -> None:
    model = FakeModel(reply=REPLY)
    with serving(lambda: model) as client:
        failing_after(1, client, model)  # the prompt goes through and yields one letter
        events = events_of(chat(client, stream=True))
        *chunks, last = events
        assert sse.DONE not in events
        assert "".join(sse.content(c) for c in chunks) == REPLY[0]
        assert isinstance(last, dict) and last["error"]["type"] == "server_error"
        # The engine carries on serving the next request.
        assert chat(client).json()["choices"][0]["message"]["content"] == REPLY
        assert wait_health(client.get, is_idle)["slots"]["busy"] == 0


def test_decode_failure_not_streamed_is_500() -> None:
    model = FakeModel(reply=REPLY)
    with serving(lambda: model) as client:
        failing_after(0, client, model)
        assert error_of(chat(client), 500)["type"] == "server_error"
        assert chat(client).status_code == 200


# -- mid-stream, over a real socket ----------------------------------------------------------
def test_queue_full_is_429_with_retry_after_and_the_queued_hear_their_place() -> None:
    gate = threading.Event()
    gate.set()
    model = FakeModel(reply="x" * 300, delay=0.005, gate=gate)
    body = {"messages": USER, "stream": True, "max_tokens": 256}
    with Served(lambda: model, slots=1, max_queue=1) as srv:
        try:
            with srv.user(0).stream("POST", CHAT, json=body) as a:
                a_events = sse.iter_events(sse.lines(a.iter_text()))
                while not sse.content(next(a_events)):
                    pass  # user 0 has the slot once its answer flows
                gate.clear()  # hold the engine: the next decode step waits
                with srv.user(1).stream("POST", CHAT, json={**body, "max_tokens": 5}) as b:
                    b_events = sse.iter_events(sse.lines(b.iter_text()), comments=True)
                    assert sse.content(next(b_events)) == ""  # role chunk: user 1 is queued
                    r = srv.user(2).post(CHAT, json={"messages": USER})
                    err = error_of(r, 429)
                    assert err["type"] == "rate_limit_error" and int(r.headers["retry-after"]) > 0
                    # A stream is refused the same way: before anything was streamed.
                    error_of(srv.user(3).post(CHAT, json=body), 429)
                    # While it waits, the stream says where it stands (about once a second).
                    assert next(b_events) == sse.Comment("queued 1")
                    gate.set()
                    a.close()  # user 0 leaves, so user 1 need not wait for its whole answer
                    rest = list(b_events)
                assert rest[-1] == sse.DONE
                assert "".join(sse.content(e) for e in rest) == "x" * 5
        finally:
            gate.set()
        assert srv.health(is_idle)["engine"]["finished"] == {"cancelled": 1, "length": 1}


def test_client_that_leaves_mid_stream_frees_its_slot() -> None:
    model = FakeModel(reply="x" * 300, delay=0.005)  # 1.5 s if nobody noticed the leaving
    with Served(lambda: model, slots=1) as srv:
        body = {"messages": USER, "stream": True, "max_tokens": 300}
        with srv.user(0).stream("POST", CHAT, json=body) as r:
            n = 0
            for ev in sse.iter_events(sse.lines(r.iter_text())):
                n += bool(sse.content(ev))
                if n == 3:
                    break  # leaving the block closes the connection mid-answer
        h = srv.health(is_idle)
        assert h["slots"]["busy"] == 0 and h["engine"]["finished"] == {"cancelled": 1}
        assert len(model.calls) < 100


def test_client_that_gives_up_waiting_for_a_whole_answer_frees_its_slot() -> None:
    model = FakeModel(reply="x" * 300, delay=0.005)
    with Served(lambda: model, slots=1) as srv:
        with pytest.raises(httpx.ReadTimeout):
            srv.user(0, timeout=0.2).post(CHAT, json={"messages": USER, "max_tokens": 300})
        h = srv.health(is_idle)
        assert h["engine"]["finished"] == {"cancelled": 1}
        assert len(model.calls) < 100


# -- the client-side reader these tests (and bench) rely on ----------------------------------
def test_sse_reader_lines_to_payloads() -> None:
    lines = ['data: {"a": 1}', "", ": queued 3", "event: ignored", "data:[DONE]", ""]
    assert list(sse.iter_events(lines)) == [{"a": 1}, sse.DONE]
    assert list(sse.iter_events(lines, comments=True)) == [{"a": 1}, sse.Comment("queued 3"), sse.DONE]
    for bad in ("data: {", "data: 5"):
        with pytest.raises(ValueError):
            list(sse.iter_events([bad]))

    async def text() -> Any:  # the same stream as network pieces
        whole = "\n".join(lines)
        for i in range(0, len(whole), 7):
            yield whole[i:i + 7]

    async def collect() -> list[sse.Event]:
        return [e async for e in sse.aiter_events(sse.alines(text()), comments=True)]

    assert asyncio.run(collect()) == [{"a": 1}, sse.Comment("queued 3"), sse.DONE]
    assert sse.content({"choices": [{"delta": {"content": "hi"}}]}) == "hi"
    # Lines end at CR, LF or CRLF only, wherever the network cut the text.
    assert list(sse.lines(["da", "ta: 1\r", "\nb\u2028c\n", "\rd"])) == \
        ["data: 1", "", "b\u2028c", "", "d"]
    assert sse.content({"choices": [], "usage": {}}) == sse.content(sse.DONE) == ""
