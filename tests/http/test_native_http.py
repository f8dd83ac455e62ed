"""api/native.py and the paths without /v1 over the fake model, in-process: llama-server's
POST /completion (text and token prompts, n_predict, id_slot, streamed), GET /props and
GET /slots (nothing private in them), the aliases answering as the /v1 routes do, and the
front door (keys, Origin, Content-Type) in front of every new route."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CTX, MODEL_ID, REPLY, USER, dicts, error_of, events_of, serving
from starlette.testclient import TestClient

from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.http.app import create_app
from appliance.http.guard import GuardPolicy
from appliance.http.keys import KeyRing
from appliance.http.state import App
from appliance.http.validate import RequestBounds

KEY = "user-key-" + "u" * 24
NEW_POSTS = ("/completion", "/chat/completions", "/chat/completions/input_tokens", "/responses/input_tokens",
             "/completions", "/responses", "/v1/responses")
NEW_GETS = ("/props", "/slots", "/models")


def test_completion_answers_llama_servers_body() -> None:
    with serving() as c:
        body = c.post("/completion", json={"prompt": "hi", "n_predict": 3, "cache_prompt": True}).json()
        assert body["content"] == REPLY[:3] and body["stop"] is True and body["stop_type"] == "limit"
        assert body["tokens_predicted"] == 3 and body["tokens_evaluated"] == 2 and body["truncated"] is False
        assert body["generation_settings"]["n_predict"] == 3 and body["generation_settings"]["n_ctx"] == CTX
        t = body["timings"]
        assert t["predicted_n"] == 3 and t["prompt_n"] + t["cache_n"] == 2
        assert c.post("/completion", json={"prompt": "hi"}).json()["stop_type"] == "eos"


def test_completion_takes_token_ids_and_checks_them() -> None:
    with serving() as c:
        body = c.post("/completion", json={"prompt": [104, 105], "n_predict": 2}).json()
        assert body["tokens_evaluated"] == 2 and body["content"] == REPLY[:2]
        assert error_of(c.post("/completion", json={"prompt": [-1]}), 400)["param"] == "prompt"
        assert error_of(c.post("/completion", json={}), 400)["param"] == "prompt"


def test_completion_streams_data_events_and_a_last_one_with_the_totals() -> None:
    with serving() as c:
        ev = dicts(events_of(c.post("/completion", json={"prompt": "hi", "stream": True})))
        assert [e["content"] for e in ev[:-1]] == list(REPLY) and not any(e["stop"] for e in ev[:-1])
        assert ev[-1]["stop"] is True and ev[-1]["tokens_predicted"] == len(REPLY) and "timings" in ev[-1]


def test_n_predict_zero_only_warms_the_cache_and_response_fields_pick() -> None:
    with serving() as c:
        assert c.post("/completion", json={"prompt": "hi", "n_predict": 0}).json()["content"] == ""
        fields = ["content", "timings/prompt_n", "prompt"]
        body = c.post("/completion", json={"prompt": "hi", "response_fields": fields}).json()
        assert set(body) == set(fields) and body["prompt"] == "hi"


@pytest.mark.parametrize("slot", [-1, 0, 1])
def test_id_slot_is_accepted_when_it_exists(slot: int) -> None:
    with serving() as c:
        assert c.post("/completion", json={"prompt": "hi", "id_slot": slot}).status_code == 200


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "hi", "id_slot": 2}, "id_slot"),
    ({"prompt": "hi", "n_predict": 1.5}, "n_predict"),
    ({"prompt": "hi", "mirostat": 2}, "mirostat"),
    ({"prompt": "hi", "cache_prompt": "yes"}, "cache_prompt"),
    ({"prompt": "hi", "temperature": 5}, "temperature"),
])
def test_completion_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with serving() as c:  # two slots
        assert error_of(c.post("/completion", json=body), 400)["param"] == param


def test_chat_input_tokens_count_the_templated_prompt() -> None:
    with serving() as c:
        used = c.post("/v1/chat/completions", json={"messages": USER}).json()["usage"]["prompt_tokens"]
        for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
            assert c.post(path, json={"messages": USER}).json() == {"input_tokens": used}
        assert error_of(c.post("/chat/completions/input_tokens", json={}), 400)["param"] == "messages"


def test_props_and_slots_say_nothing_private() -> None:
    with serving(lambda: FakeModel(reply=REPLY)) as c:
        props = c.get("/props").json()
        assert props["total_slots"] == 2 and props["n_ctx"] == CTX
        assert props["default_generation_settings"]["n_ctx"] == CTX
        assert props["default_generation_settings"]["params"]["n_predict"] == 32
        assert "model_path" not in props and props["model_alias"] == MODEL_ID  # from this machine
        slots = c.get("/slots").json()
        assert [s["id"] for s in slots] == [0, 1] and all(s["n_ctx"] == CTX and s["is_processing"] is False
                                                          for s in slots)
        assert all(set(s) == {"id", "id_task", "n_ctx", "speculative", "is_processing"} for s in slots)


def test_props_hide_the_model_from_a_remote_caller() -> None:
    with keyed(Path("/nonexistent")) as c:
        assert "model_alias" not in c.get("/props").json()


def test_the_unprefixed_paths_answer_as_llama_server_routes_them() -> None:
    with serving() as c:
        assert c.get("/models").json() == c.get("/v1/models").json()
        a = c.post("/v1/chat/completions", json={"messages": USER, "temperature": 0}).json()
        b = c.post("/chat/completions", json={"messages": USER, "temperature": 0}).json()
        assert a["object"] == b["object"] == "chat.completion" and a["choices"] == b["choices"]
        # As llama-server routes it, /completions is its native /completion, not /v1/completions.
        a = c.post("/completion", json={"prompt": "hi", "temperature": 0}).json()
        b = c.post("/completions", json={"prompt": "hi", "temperature": 0}).json()
        assert a["content"] == b["content"] == REPLY and "choices" not in b
        # As /v1/embeddings, there is no /embeddings.
        assert error_of(c.post("/embeddings", json={"input": "x"}), 404)["type"] == "invalid_request_error"
        assert error_of(c.post("/v1/embeddings", json={"input": "x"}), 404)


# -- the front door --------------------------------------------------------------------------------
@contextmanager
def keyed(path: Path) -> Iterator[TestClient]:
    """The app with API keys from `path` (none if it is missing), reached from another machine."""
    limits = Limits(slots=2, batch_tokens=64, kv_tokens=4096, ctx_limit=CTX, max_wait_s=0.0, max_queue=8)
    engine = Engine(lambda: FakeModel(reply=REPLY), EngineOptions(limits, CachePolicy(n_seq=6)))
    bounds = RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=CTX)
    keys = KeyRing(str(path)) if path.exists() else KeyRing()
    app = create_app(App(engine, MODEL_ID, bounds, guard=GuardPolicy.build(keys)))
    with TestClient(app, base_url="http://192.168.1.5:8080", client=("192.168.1.20", 4000)) as c:
        yield c


def test_every_new_route_needs_a_key_when_keys_are_on(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"{KEY} alice\n")
    with keyed(tmp_path / "keys") as c:
        for path in NEW_POSTS:
            assert error_of(c.post(path, json={}), 401)["code"] == "invalid_api_key", path
        for path in NEW_GETS:
            assert error_of(c.get(path), 401)["code"] == "invalid_api_key", path
        auth = {"Authorization": f"Bearer {KEY}"}
        assert c.get("/props", headers=auth).status_code == 200
        r = c.post("/completion", json={"prompt": "hi"}, headers=auth)
        assert r.status_code == 200, r.text


def test_a_foreign_origin_and_a_form_post_are_refused_on_the_new_routes() -> None:
    with keyed(Path("/nonexistent")) as c:
        for path in NEW_POSTS:
            assert error_of(c.post(path, json={}, headers={"Origin": "https://evil.example"}), 403), path
            r = c.post(path, content=b"{}", headers={"Origin": "http://192.168.1.5:8080", "Content-Type": "text/plain"})
            assert r.status_code == 415, path
