"""A library chat's answer checked against its sources, on every chat API the same way
(in-process: the fake chat model, a fake embedding model of hashed words): at the end of
the answer, `sources` again with `used` and `support`, and `grounding`; a note after an
answer whose figures are in no source, or whose question names a thing no document
mentions; the [n] a source does not support out of a whole answer; and, when nothing in the
library is close, the server's own answer, no slot spent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, dicts, events_of, is_idle, serving, user, wait_health
from helpers.library import FakeEmbedService, library_of, ready, upload
from starlette.testclient import TestClient

KEY = "The spare key is kept in the blue flowerpot by the back door."
ROOM = "Room Kestrel seats 12 people and has a projector."
PARTY = "Summer party: the budget is £45 per head, partners not included."
QUESTION = "Where is the spare key kept?"
FAR = "Volcano eruption forecast?"  # no word of it in the library, and by meaning far (checked below)
ASK = [{"role": "user", "content": QUESTION}]
APIS = {  # each chat API's path and a body that asks QUESTION in it, room for a long answer
    "openai": (CHAT, {"messages": ASK, "max_tokens": 200}),
    "responses": ("/v1/responses", {"input": QUESTION, "max_output_tokens": 200}),
    "ollama": ("/api/chat", {"model": "m", "messages": ASK, "options": {"num_predict": 200}}),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 200, "messages": ASK}),
}
NOTE = "\n\n(The library does not say this: 14 is in none of its sources.)"


@pytest.fixture(scope="module")
def apis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, FakeModel, dict[str, str]]]:
    service = FakeEmbedService()
    model = FakeModel(reply="See [1].")
    with serving(lambda: model, embedder=service, ctx=2048,
                 library=library_of(tmp_path_factory.mktemp("library"), service)) as c:
        docs = {name: upload(c, "/admin/library", f"{name}.txt", text.encode()).json()["id"]
                for name, text in (("key", KEY), ("room", ROOM), ("party", PARTY))}
        ready(c, "/admin/library")
        yield c, model, docs


def ask(client: TestClient, api: str, stream: bool, i: int, question: str = QUESTION) -> tuple[str, dict[str, Any]]:
    """The answer's text and what its end carries (`sources`, `grounding`), where each API puts them."""
    path, body = APIS[api]
    body = json.loads(json.dumps(body).replace(json.dumps(QUESTION), json.dumps(question)))
    r = client.post(path, json={**body, "library": True, "stream": stream}, headers=user(40 + i))
    assert r.status_code == 200, r.text
    if api == "ollama":
        lines = [json.loads(x) for x in r.text.strip().splitlines()] if stream else [r.json()]
        return "".join(x["message"]["content"] for x in lines), lines[-1]
    if not stream:
        body = r.json()
        text = {"openai": lambda: body["choices"][0]["message"]["content"],
                "anthropic": lambda: body["content"][0]["text"],
                "responses": lambda: body["output"][0]["content"][0]["text"]}[api]()
        return text, body
    events = dicts(events_of(r))
    if api == "openai":
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
        return text, next(e for e in events if e["choices"] and e["choices"][0].get("finish_reason"))
    if api == "anthropic":
        text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
        return text, next(e for e in events if e["type"] == "message_delta")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    return text, next(e for e in events if e["type"] == "response.completed")["response"]


def n_of(end: dict[str, Any], doc: str) -> int:
    return next(s["n"] for s in end["sources"] if s["document"] == doc)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_a_supported_answer_names_its_source_and_sentence(apis: tuple[TestClient, FakeModel, dict[str, str]],
                                                         api: str, stream: bool) -> None:
    client, model, docs = apis
    wait_health(client.get, is_idle)
    model.reply = "It is in the blue flowerpot [1]."
    text, end = ask(client, api, stream, 0)
    key = n_of(end, docs["key"])
    assert end["grounding"] == {"verdict": "supported", "unsupported": [], "dropped": [] if key == 1 else [1], "unmentioned": []}
    by_n = {s["n"]: s for s in end["sources"]}
    assert by_n[key]["used"] is True and by_n[key]["support"] == KEY and by_n[key]["text"] == KEY
    assert all(s["used"] is False and s["support"] is None for n, s in by_n.items() if n != key)
    # A whole answer loses a [n] its source does not support; a stream has sent it already.
    assert text == ("It is in the blue flowerpot [1]." if key == 1 or stream else "It is in the blue flowerpot.")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_an_invented_figure_is_said_to_be_in_no_source(apis: tuple[TestClient, FakeModel, dict[str, str]],
                                                       api: str, stream: bool) -> None:
    client, model, docs = apis
    wait_health(client.get, is_idle)
    model.reply = "It is under flowerpot 14 [1]."
    text, end = ask(client, api, stream, 1)
    assert end["grounding"]["verdict"] == "unsupported" and end["grounding"]["unsupported"] == ["14"]
    # The answer does not stand: the sentence closest to the question is quoted after the note,
    # its source `quoted` with that sentence as its support, none used (library/closest.py).
    key = n_of(end, docs["key"])
    assert end["grounding"]["dropped"] == [1] and not any(s["used"] for s in end["sources"])
    assert [(s["n"], s["support"]) for s in end["sources"] if s["quoted"]] == [(key, KEY)]
    title = next(s["title"] for s in end["sources"] if s["n"] == key)
    closest = f"\n\n(The closest the sources come is [{key}] {title}: “{KEY}”)"
    answer = "It is under flowerpot 14 [1]." if stream else "It is under flowerpot 14."
    assert text == answer + NOTE + closest


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_nothing_close_is_answered_by_the_server_without_the_model(
        apis: tuple[TestClient, FakeModel, dict[str, str]], api: str, stream: bool) -> None:
    client, model, _ = apis
    service = FakeEmbedService()
    far = service.vectors([FAR])[0]
    assert all(float(far @ service.vectors([t])[0]) < 0.3 for t in (KEY, ROOM, PARTY))  # the premise
    wait_health(client.get, is_idle)
    calls = len(model.calls)
    text, end = ask(client, api, stream, 2, FAR)
    assert text == "The library does not say: nothing in it is close to this question."
    assert end["sources"] == []
    assert end["grounding"] == {"verdict": "not_in_library", "unsupported": [], "dropped": [], "unmentioned": []}
    assert len(model.calls) == calls  # nothing was decoded
    # A Chinese question is translated first (the library holds English documents: translate.py),
    # and its answer, too, is the server's own when the translation is far as well.
    model.reply = FAR
    text, _ = ask(client, api, stream, 3, "月球上有水吗？")
    assert text == "资料库中没有与这个问题相关的内容，无法回答。"
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_a_near_miss_answered_with_a_neighbours_figure_is_said_to_be_unsaid(
        apis: tuple[TestClient, FakeModel, dict[str, str]], api: str, stream: bool) -> None:
    # The Christmas party's budget asked; the summer party's passage is close enough to ask the
    # model, which quotes its £45 (in a source, but said there of another party).
    client, model, docs = apis
    wait_health(client.get, is_idle)
    model.reply = "The budget for the Christmas party is £45 per head [1]."
    text, end = ask(client, api, stream, 4, "What is the budget per head for the Christmas party?")
    assert any(s["document"] == docs["party"] for s in end["sources"])
    assert end["grounding"]["verdict"] == "unsupported" and end["grounding"]["unsupported"] == []
    # No document mentions Christmas: no sentence is quoted as the closest the library comes.
    assert text.endswith("\n\n(The library does not say this: the sources that give £45 do not mention Christmas.)")
    assert end["grounding"]["unmentioned"] == ["Christmas"] and "closest" not in text
    # The summer party's budget asked, the same answer is the library's.
    model.reply = "The budget for the summer party is £45 per head [1]."
    text, end = ask(client, api, stream, 5, "What is the budget per head for the summer party?")
    assert end["grounding"]["verdict"] == "supported" and "does not say" not in text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_an_answer_about_a_thing_no_document_mentions_is_said_to_be_unsaid(
        apis: tuple[TestClient, FakeModel, dict[str, str]], api: str, stream: bool) -> None:
    # Room Kestrel's passage is close to the question, and holds the answer's 12; but no
    # document, in either language, mentions a jury (nor 陪审团, nor a panel of judges).
    client, model, docs = apis
    wait_health(client.get, is_idle)
    model.reply = "Room Kestrel seats 12 people of the jury [1]."
    text, end = ask(client, api, stream, 6, "How many people of the jury can Room Kestrel seat?")
    assert any(s["document"] == docs["room"] and s["used"] for s in end["sources"]), (text, end)
    assert end["grounding"]["verdict"] == "unsupported" and end["grounding"]["unmentioned"] == ["jury"]
    assert text.endswith("\n\n(The library does not say this: no document mentions “jury”.)")
    # Asked of what the library holds, the same figure is the library's, nothing unmentioned.
    model.reply = "Room Kestrel seats 12 people [1]."
    text, end = ask(client, api, stream, 7, "How many people can Room Kestrel seat?")
    assert end["grounding"] == {**end["grounding"], "verdict": "supported", "unmentioned": []}
    assert "does not say" not in text


def test_each_choice_is_checked_on_its_own(apis: tuple[TestClient, FakeModel, dict[str, str]]) -> None:
    client, model, docs = apis
    model.reply = "It is under flowerpot 14."
    r = client.post(CHAT, json={"messages": ASK, "library": True, "n": 2, "max_tokens": 200, "stream": True})
    ends = [e for e in dicts(events_of(r)) if e["choices"] and e["choices"][0].get("finish_reason")]
    assert sorted(e["choices"][0]["index"] for e in ends) == [0, 1]
    assert all(e["grounding"]["unsupported"] == ["14"] for e in ends)
    whole = client.post(CHAT, json={"messages": ASK, "library": True, "n": 2, "max_tokens": 200}).json()
    key = n_of(whole, docs["key"])
    closest = f"\n\n(The closest the sources come is [{key}] key: “{KEY}”)"
    assert [c["message"]["content"] for c in whole["choices"]] == ["It is under flowerpot 14." + NOTE + closest] * 2
    assert whole["grounding"]["verdict"] == "unsupported"
    # Each streamed choice was quoted after, too, and says so at its end.
    assert all([s["n"] for s in e["sources"] if s["quoted"]] == [n_of(e, docs["key"])] for e in ends)
