"""`"library": true` on every chat API, on the real models over a real socket: a small note
added to /admin/library, then the same question asked on /v1/chat/completions and
/v1/responses (the `openai` SDK), /v1/messages (the `anthropic` SDK) and /api/chat (Ollama's
NDJSON, as its client has no field of ours to send): each answer carries the note as its
source, in its API's place, whole and streamed, and answers from it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from helpers.live import Live
from helpers.polling import wait_until

from appliance.bench import sse

pytestmark = pytest.mark.integration
TITLE = "Reception notes"
NOTE = ("Reception notes.\n\nThe spare key to the server room is kept in the blue flowerpot on the "
        "reception desk. Ask Maria before you take it.")
QUESTION = "Where is the spare key to the server room kept?"
ASKED = {"max_tokens": 48, "temperature": 0}
FAR = "How many moons does Jupiter have?"


@pytest.fixture(scope="module")
def note(server: Live) -> Iterator[dict[str, Any]]:
    """The note in the office's library, indexed (words and meaning), deleted at the end."""
    http = httpx.Client(base_url=server.url, timeout=120, trust_env=False)
    r = http.post("/admin/library", params={"title": TITLE}, content=NOTE.encode(),
                  headers={"content-type": "text/plain", "x-file-name": "reception.txt"})
    assert r.status_code == 202, r.text
    path = f"/v1/library/{r.json()['id']}"
    doc = wait_until(lambda: (d := http.get(path).json())["status"] != "indexing" and d, 300, "the indexer", every=0.2)
    assert doc["status"] == "ready", doc
    yield doc
    assert http.delete(f"/admin/library/{doc['id']}").status_code == 204


def cited(sources: list[dict[str, Any]], doc: dict[str, Any]) -> None:
    """The note is the first source, as chat completions has always sent it."""
    assert sources and sources[0]["n"] == 1 and sources[0]["document"] == doc["id"], sources
    assert sources[0]["title"] == TITLE and "flowerpot" in sources[0]["text"]


def from_note(answer: str) -> None:
    assert "flowerpot" in answer.lower(), answer


def events(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    return [e for e in sse.iter_events(sse.lines([r.text])) if isinstance(e, dict)]


def test_chat_completions(server: Live, note: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    ask = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], **ASKED}
    answer = client.chat.completions.create(**ask, extra_body={"library": True})  # type: ignore[call-overload]
    cited(answer.model_extra["sources"], note)
    from_note(answer.choices[0].message.content)
    # Checked against its source: the note used, its sentence the support (http/grounded.py).
    assert answer.model_extra["grounding"]["verdict"] in ("supported", "partly"), answer.model_extra
    assert answer.model_extra["sources"][0]["used"] and "flowerpot" in answer.model_extra["sources"][0]["support"]
    first = next(iter(client.chat.completions.create(**ask, stream=True, extra_body={"library": True})))
    cited((first.model_extra or {})["sources"], note)
    # Nothing in the library close to the question: the server says so, without the model.
    far = client.chat.completions.create(**{**ask, "messages": [{"role": "user", "content": FAR}]},
                                         extra_body={"library": True})
    assert far.choices[0].message.content.startswith("The library does not say")
    assert far.model_extra["grounding"]["verdict"] == "not_in_library" and far.usage.completion_tokens == 0


def test_responses(server: Live, note: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    answer = client.responses.create(model="m", input=QUESTION, max_output_tokens=48, temperature=0,
                                     extra_body={"library": True})
    cited((answer.model_extra or {})["sources"], note)
    from_note(answer.output_text)
    r = server.client.post("/v1/responses", json={"model": "m", "input": QUESTION, "max_output_tokens": 48,
                                                  "temperature": 0, "stream": True, "library": True})
    got = events(r)
    assert got[0]["type"] == "response.created" and got[-1]["type"] == "response.completed"
    cited(got[0]["response"]["sources"], note)
    from_note("".join(e["delta"] for e in got if e["type"] == "response.output_text.delta"))


def test_anthropic_messages(server: Live, note: dict[str, Any]) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0,
                                 http_client=anthropic.DefaultHttpxClient(trust_env=False, timeout=300))
    ask = {"model": "appliance", "max_tokens": 48, "messages": [{"role": "user", "content": QUESTION}],
           "extra_body": {"temperature": 0, "library": True}}
    answer = client.messages.create(**ask)  # type: ignore[call-overload]
    cited((answer.model_extra or {})["sources"], note)
    from_note("".join(b.text for b in answer.content if b.type == "text"))
    r = server.client.post("/v1/messages", json={**{k: v for k, v in ask.items() if k != "extra_body"},
                                                 **ask["extra_body"], "stream": True})
    got = events(r)
    assert got[0]["type"] == "message_start"
    cited(got[0]["message"]["sources"], note)


def test_ollama_chat(server: Live, note: dict[str, Any]) -> None:
    ask = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "library": True,
           "options": {"temperature": 0, "num_predict": 48}}
    whole = server.client.post("/api/chat", json={**ask, "stream": False})
    assert whole.status_code == 200, whole.text
    cited(whole.json()["sources"], note)
    from_note(whole.json()["message"]["content"])
    lines = [json.loads(line) for line in server.client.post("/api/chat", json=ask).text.splitlines()]
    assert lines[-1]["done"] is True
    cited(lines[-1]["sources"], note)
    from_note("".join(line["message"]["content"] for line in lines))
