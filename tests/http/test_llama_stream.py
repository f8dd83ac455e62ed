"""llama-server's stream fields over the fake model in process: system_fingerprint on every
OpenAI chat and completions body and chunk (one value per server, llama-server's b<build>-<hash>
form), the first chat delta's null content (read by the openai SDK), timings_per_token
(`timings` on every streamed chunk with text), return_progress (`prompt_progress` while the
prompt is read, from its cached start to its whole length; the `: prompt N/M` notes stay), and
/completion's `tokens` (each event's ids; the whole body's with return_tokens). Bad values: a
400 naming the field."""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest
from helpers.inprocess import CHAT, REPLY, USER, dicts, error_of, events_of
from starlette.testclient import TestClient

from appliance.bench import sse

DOC = [{"role": "user", "content": "x" * 300}]  # 300 tokens: several of the in-process app's 64-token steps
FINGERPRINT = re.compile(r"b0\.0\.1-[0-9a-f]{8}")  # the fake model's build, a digest of its fingerprint


def stream(client: TestClient, path: str, **body: Any) -> list[dict[str, Any]]:
    r = client.post(path, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    return dicts(events_of(r))


# -- system_fingerprint ----------------------------------------------------------------------
def test_every_chat_and_completions_answer_and_chunk_carries_one_fingerprint(client: TestClient) -> None:
    seen = {client.post(CHAT, json={"messages": USER}).json()["system_fingerprint"],
            client.post("/v1/completions", json={"prompt": "hi"}).json()["system_fingerprint"]}
    for path, body in ((CHAT, {"messages": USER}), ("/v1/completions", {"prompt": "hi"})):
        chunks = stream(client, path, **body, stream_options={"include_usage": True})
        assert len(chunks) >= 3
        seen |= {c["system_fingerprint"] for c in chunks}  # the usage chunk's too
    [fp] = seen
    assert FINGERPRINT.fullmatch(fp), fp


def test_the_openai_sdk_reads_the_fingerprint_and_the_first_delta(client: TestClient) -> None:
    sdk = openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=client)
    whole = sdk.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    assert whole.system_fingerprint and FINGERPRINT.fullmatch(whole.system_fingerprint)
    chunks = list(sdk.chat.completions.create(model="m", messages=USER, stream=True))  # type: ignore[arg-type]
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content is None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
    assert all(c.choices[0].delta.role is None for c in chunks[1:])


def test_the_first_chat_delta_has_null_content_and_only_it_has_a_role(client: TestClient) -> None:
    first, *rest = stream(client, CHAT, messages=USER)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all("role" not in c["choices"][0]["delta"] for c in rest)
    assert rest[-1]["choices"][0]["delta"] == {}  # the finish chunk: no content key at all


# -- timings_per_token -----------------------------------------------------------------------
@pytest.mark.parametrize("path,body,text", [
    (CHAT, {"messages": USER}, lambda c: c["choices"] and c["choices"][0]["delta"].get("content")),
    ("/v1/completions", {"prompt": "hi"}, lambda c: c["choices"] and c["choices"][0]["text"]),
    ("/completion", {"prompt": "hi"}, lambda c: c.get("content")),
])
def test_timings_per_token_puts_timings_on_every_chunk_with_text(client: TestClient, path: str,
                                                                  body: dict[str, Any], text: Any) -> None:
    chunks = stream(client, path, **body, timings_per_token=True)
    texts = [c for c in chunks if text(c)]
    assert len(texts) == len(REPLY)  # the fake model: one token, one chunk
    counts = [c["timings"]["predicted_n"] for c in texts]
    assert counts == list(range(1, len(REPLY) + 1)), counts
    assert {c["timings"]["prompt_n"] + c["timings"]["cache_n"] for c in texts} == {chunks[-1]["timings"]["prompt_n"]
                                                                                   + chunks[-1]["timings"]["cache_n"]}
    assert all(c["timings"]["prompt_n"] > 0 and "predicted_per_second" in c["timings"] for c in texts)
    # Not asked: only the last chunk has them.
    plain = stream(client, path, **body)
    assert [c for c in plain if "timings" in c] == [plain[-1]]


def test_the_role_chunk_has_no_timings_and_the_usage_chunk_ends_them(client: TestClient) -> None:
    first, *rest = stream(client, CHAT, messages=USER, timings_per_token=True,
                          stream_options={"include_usage": True})
    assert "timings" not in first
    assert rest[-1]["choices"] == [] and rest[-1]["timings"]["predicted_n"] == len(REPLY)


# -- return_progress -------------------------------------------------------------------------
def progress_of(chunks: list[dict[str, Any]]) -> list[dict[str, int]]:
    return [c["prompt_progress"] for c in chunks if "prompt_progress" in c]


def rises_from_the_cache_to_the_end(got: list[dict[str, int]]) -> None:
    assert len(got) >= 2, got
    assert got[0]["processed"] == got[0]["cache"], got  # where the reading starts: what the cache held
    assert got[-1]["processed"] == got[-1]["total"] > 0, got
    assert len({(p["total"], p["cache"]) for p in got}) == 1, got
    assert all(a["processed"] < b["processed"] for a, b in zip(got, got[1:])), got
    assert all(a["time_ms"] <= b["time_ms"] for a, b in zip(got, got[1:])), got


def test_return_progress_reports_a_long_prompt_step_by_step_before_its_text(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": DOC, "stream": True, "return_progress": True})
    events = events_of(r)
    chunks = dicts(events)
    got = progress_of(chunks)
    rises_from_the_cache_to_the_end(got)
    assert len(got) >= 5  # the start, then each of the (64-token) steps
    first_text = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert all("prompt_progress" not in c for c in chunks[first_text:])
    assert all(c["choices"][0]["delta"] == {} for c in chunks if "prompt_progress" in c)
    # The appliance's own notes are still there for the chat page.
    assert any(isinstance(e, sse.Comment) and e.text.startswith("prompt ") for e in events)


def test_return_progress_reports_a_short_and_a_cached_prompt_too(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "cached question"}], "return_progress": True}
    rises_from_the_cache_to_the_end(progress_of(stream(client, CHAT, **body)))
    again = progress_of(stream(client, CHAT, **body))  # the same client's same prompt: read from the cache
    rises_from_the_cache_to_the_end(again)
    assert again[0]["cache"] > 0 and len(again) == 2


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "x" * 300}),
    ("/completion", {"prompt": "x" * 300}),
])
def test_return_progress_on_the_completion_routes(client: TestClient, path: str, body: dict[str, Any]) -> None:
    chunks = stream(client, path, **body, return_progress=True)
    rises_from_the_cache_to_the_end(progress_of(chunks))
    assert progress_of(stream(client, path, **body)) == []  # not asked


def test_responses_stream_llama_telemetry(client: TestClient) -> None:
    r = client.post("/v1/responses", json={"input": "x" * 300, "stream": True, "timings_per_token": True,
                                           "return_progress": True})
    events = dicts(events_of(r))
    got = [e for e in events if "prompt_progress" in e]
    assert {e["type"] for e in got} == {"response.in_progress"}
    rises_from_the_cache_to_the_end([e["prompt_progress"] for e in got])
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    assert events[-1]["type"] == "response.completed" and events[-1]["timings"]["predicted_n"] == len(REPLY)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


# -- /completion's tokens --------------------------------------------------------------------
def test_completion_streams_each_events_token_ids(client: TestClient) -> None:
    chunks = stream(client, "/completion", prompt="hi")
    texts = [c for c in chunks if not c["stop"]]
    assert [c["tokens"] for c in texts] == [[ord(ch)] for ch in REPLY]  # the fake tokenizer: id = code point
    assert [c["tokens_predicted"] for c in texts] == list(range(1, len(REPLY) + 1))
    assert chunks[-1]["tokens"] == []  # return_tokens not asked: the totals only


def test_completion_returns_the_answers_ids_when_asked(client: TestClient) -> None:
    assert client.post("/completion", json={"prompt": "hi"}).json()["tokens"] == []
    body = client.post("/completion", json={"prompt": "hi", "return_tokens": True}).json()
    assert body["tokens"] == [ord(ch) for ch in body["content"]] and body["content"] == REPLY
    last = stream(client, "/completion", prompt="hi", return_tokens=True)[-1]
    assert last["stop"] and last["tokens"] == [ord(ch) for ch in REPLY]


def test_completion_ids_with_n_probs_go_one_per_event(client: TestClient) -> None:
    chunks = stream(client, "/completion", prompt="hi", n_probs=2)
    texts = [c for c in chunks if not c["stop"]]
    assert [c["tokens"] for c in texts] == [[p["id"]] for c in texts for p in c["completion_probabilities"]]


# -- refusals --------------------------------------------------------------------------------
@pytest.mark.parametrize("path,body", [
    (CHAT, {"messages": USER}), ("/v1/completions", {"prompt": "hi"}), ("/completion", {"prompt": "hi"}),
    ("/v1/responses", {"input": "hi"}), ("/infill", {"input_prefix": "a", "input_suffix": "b"}),
])
@pytest.mark.parametrize("field", ["timings_per_token", "return_progress"])
def test_a_telemetry_field_that_is_not_a_boolean_is_a_400_naming_it(client: TestClient, path: str,
                                                                    body: dict[str, Any], field: str) -> None:
    err = error_of(client.post(path, json={**body, field: "yes"}), 400)
    assert err["param"] == field


def test_return_tokens_that_is_not_a_boolean_is_a_400(client: TestClient) -> None:
    assert error_of(client.post("/completion", json={"prompt": "hi", "return_tokens": 1}), 400)["param"] == \
        "return_tokens"
