"""llama-server's stream fields on the real model, with the server started as llama.cpp's tests
start llama-server: through compat/llama-server-shim.py with their preset's flags (a context of
1024 over two slots, --batch-size 32, --temp 0.8, --seed 42, --alias, --api-key). Checked: the
flags took (/props, the key, the name), system_fingerprint on every answer and chunk, the first
chat delta read by the openai SDK, timings_per_token, return_progress (a long prompt batch by
batch, then the same prompt from the cache), /completion's token ids (they detokenize to its
text), and the server seed making an unseeded answer repeat, streamed or whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import llama_cpp
import openai
import pytest
from helpers.live import ROOT, Live, free_port
from helpers.sse import events_of

from appliance.bench.sse import Comment

pytestmark = [pytest.mark.integration]
KEY = "sk-this-is-the-secret-key"
LONG = "This is a test. " * 40  # about 200 tokens: seven batches of 32


@pytest.fixture(scope="module")
def server(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("llama-shim")
    port = free_port()
    argv = ["--port", str(port), "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "--offline",
            "--hf-repo", "ggml-org/test-model-stories260K", "--batch-size", "32", "--no-slots", "--alias",
            "llama-test-model", "--ctx-size", "1024", "--parallel", "2", "--n-predict", "64", "--api-key", KEY,
            "--no-jinja"]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")},
           "LLAMA_SUITE_PYTHON": sys.executable, "LLAMA_SUITE_TMP": str(tmp), "MODEL": str(bundled_model)}
    log = tmp / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "compat" / "llama-server-shim.py"), *argv], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    live = Live(proc, port, log)
    live.client.headers["Authorization"] = f"Bearer {KEY}"
    try:
        live.wait_ready()
        yield live
    finally:
        assert live.stop() == 0, live.log()[-3000:]


def stream(server: Live, path: str, **body: Any) -> list[dict[str, Any]]:
    with server.client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return [e for e in events_of(r) if isinstance(e, dict)]


def test_the_flags_took(server: Live) -> None:
    props = server.client.get("/props").json()
    assert props["total_slots"] == 2 and props["n_ctx"] == 512  # --ctx-size over --parallel
    assert (props["default_generation_settings"]["params"]["seed"],
            props["default_generation_settings"]["params"]["temperature"]) == (42, 0.8)
    assert server.client.get("/v1/models").json()["data"][0]["id"] == "llama-test-model"
    bare = httpx.post(server.url + "/v1/completions", json={"prompt": "hi"}, timeout=30)
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "authentication_error"
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60,
                      headers={"X-Api-Key": KEY}).status_code == 200


def test_one_fingerprint_on_every_answer_and_chunk_and_the_first_delta(server: Live) -> None:
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    messages: Any = [{"role": "user", "content": "Say hi."}]
    whole = sdk.chat.completions.create(model="x", messages=messages, max_tokens=8)
    chunks = list(sdk.chat.completions.create(model="x", messages=messages, max_tokens=8, stream=True,
                                              stream_options={"include_usage": True}))
    text = sdk.completions.create(model="x", prompt="Once upon a time", max_tokens=4)
    fps = {whole.system_fingerprint, text.system_fingerprint, *(c.system_fingerprint for c in chunks)}
    assert fps == {f"b{llama_cpp.__version__}-{whole.system_fingerprint[-8:]}"}  # type: ignore[index]
    assert re.fullmatch(r"b[0-9.]+-[0-9a-f]{8}", whole.system_fingerprint or "")
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content is None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_timings_per_token_on_every_chunk_with_text(server: Live) -> None:
    chunks = stream(server, "/v1/chat/completions", messages=[{"role": "user", "content": "Count to five."}],
                    max_tokens=10, timings_per_token=True, stream_options={"include_usage": True})
    texts = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert texts and all("timings" in c for c in texts)
    counts = [c["timings"]["predicted_n"] for c in texts]
    assert counts == sorted(counts) and counts[-1] <= 10
    use = chunks[-1]
    assert use["timings"]["predicted_n"] == use["usage"]["completion_tokens"] <= 10
    assert {c["timings"]["prompt_n"] + c["timings"]["cache_n"] for c in texts} == {use["usage"]["prompt_tokens"]}


def test_return_progress_reads_a_long_prompt_batch_by_batch_then_from_the_cache(server: Live) -> None:
    body = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 4, "return_progress": True}
    seen = []
    for _ in range(2):
        got = [c["prompt_progress"] for c in stream(server, "/v1/chat/completions", **body) if "prompt_progress" in c]
        assert got[0]["processed"] == got[0]["cache"] and got[-1]["processed"] == got[-1]["total"]
        assert all(a["processed"] < b["processed"] for a, b in zip(got, got[1:]))
        assert all(b["processed"] - a["processed"] <= 32 for a, b in zip(got, got[1:]))  # one batch a step
        seen.append(got)
    first, again = seen
    assert len(first) >= 6  # the start, then about 200 tokens in batches of 32
    assert again[0]["cache"] > 0 and len(again) == 2  # the same client's same prompt: from its cache


def test_completion_token_ids_and_the_server_seed(server: Live) -> None:
    body = {"prompt": "I believe the meaning of life is", "n_predict": 8}
    # llama.cpp's CPU kernels are not batch-invariant: a prompt read whole and a prompt read from
    # the cache give close logits, not equal ones, and at temperature 0.8 close can sample apart.
    # So the prompt goes into the cache first, and the two compared answers share one schedule.
    first = server.client.post("/completion", json=body).json()
    assert first["tokens_predicted"] == 8
    events = stream(server, "/completion", **body)
    ids = [t for e in events if not e["stop"] for t in e["tokens"]]
    text = "".join(e["content"] for e in events)
    assert len(ids) == 8 and events[-1]["tokens_predicted"] == 8
    assert server.client.post("/detokenize", json={"tokens": ids}).json()["content"] == text
    # --seed 42: an unseeded request at the server's temperature 0.8 samples the same answer.
    whole = server.client.post("/completion", json={**body, "return_tokens": True}).json()
    assert events[-1]["tokens_cached"] == whole["tokens_cached"] > 0  # the same schedule
    assert whole["content"] == text and whole["tokens"] == ids
    assert whole["generation_settings"]["seed"] == 42


def test_responses_carry_the_telemetry(server: Live) -> None:
    with server.client.stream("POST", "/v1/responses", json={"input": LONG, "max_output_tokens": 8, "stream": True,
                                                             "timings_per_token": True, "return_progress": True}) as r:
        events = list(events_of(r, comments=True))
    data = [e for e in events if isinstance(e, dict)]
    assert any("prompt_progress" in e and e["type"] == "response.in_progress" for e in data)
    assert all("timings" in e for e in data if e["type"] == "response.output_text.delta")
    assert data[-1]["type"] in ("response.completed", "response.incomplete") and "timings" in data[-1]
    assert any(isinstance(e, Comment) for e in events)  # the appliance's own prompt notes stay
