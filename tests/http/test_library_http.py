"""The library and the embeddings endpoints over HTTP (in-process: the fake chat model, a
fake embedding model of hashed words, the real document reader and library store): what
each API answers and refuses, and that a person's own documents reach nobody else."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, dicts, error_of, events_of, is_idle, serving, user, wait_health
from helpers.library import DIM, FakeEmbedService, ready, upload
from helpers.library import library_of as _library
from starlette.testclient import TestClient

from appliance.http.people import People
from appliance.library.library import Library
from appliance.people.db import Database
from appliance.people.passwords import Hasher


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """Open mode: the office's documents only."""
    service = FakeEmbedService()
    with serving(lambda: FakeModel(reply="See [1]."), embedder=service,
                 library=_library(tmp_path_factory.mktemp("library"), service)) as c:
        yield c


@pytest.fixture(scope="module")
def people_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    people = People(Database(tmp_path_factory.mktemp("people")), hasher=Hasher(n=2**10))
    service = FakeEmbedService()
    with serving(lambda: FakeModel(reply="See [1]."), people=people, embedder=service, ctx=2048,
                 library=_library(tmp_path_factory.mktemp("library"), service)) as c:
        yield c


def join(client: TestClient, name: str, i: int) -> dict[str, str]:
    token = client.post("/admin/people", json={"name": name}).json()["invite_url"].rsplit("=", 1)[1]
    r = client.post("/auth/invite/accept", json={"token": token, "password": "a long enough password"},
                    headers={"x-test-client": f"10.0.0.{i}"})
    cookie = r.headers["set-cookie"].split(";")[0]
    client.cookies.clear()
    return {"cookie": cookie, "x-csrf-token": r.json()["csrf"], "x-test-client": f"10.0.0.{i}"}


def test_openai_and_ollama_embeddings(client: TestClient) -> None:
    r = client.post("/v1/embeddings", json={"model": "text-embedding-3-small", "input": ["the cat sat", "a dog ran"]})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "list" and body["model"] == "fake-embedder"
    assert [d["index"] for d in body["data"]] == [0, 1] and len(body["data"][0]["embedding"]) == DIM
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 10
    b64 = client.post("/v1/embeddings", json={"input": "the cat sat", "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4")
    assert np.allclose(vec, body["data"][0]["embedding"], atol=1e-6)
    ollama = client.post("/api/embed", json={"model": "all-minilm", "input": "the cat sat"}).json()
    assert np.allclose(ollama["embeddings"][0], body["data"][0]["embedding"]) and ollama["prompt_eval_count"] == 5
    old = client.post("/api/embeddings", json={"model": "all-minilm", "prompt": "the cat sat"}).json()
    assert np.allclose(old["embedding"], body["data"][0]["embedding"])


@pytest.mark.parametrize("body", [{}, {"input": []}, {"input": [1, 2, 3]}, {"input": [[1, 2]]}, {"input": 5},
                                  {"input": ["ok", None]}, {"input": ["x"] * 129}, {"input": "x" * 32_001},
                                  {"input": "hi", "encoding_format": "int8"}, {"input": "hi", "dimensions": 8},
                                  {"input": "hi", "dimensions": True}])
def test_embeddings_refuse_what_they_cannot_take(client: TestClient, body: dict[str, Any]) -> None:
    err = error_of(client.post("/v1/embeddings", json=body), 400)
    assert err["param"] in ("input", "encoding_format", "dimensions")


def test_ollama_refuses_too_long_an_input_when_told_not_to_cut(client: TestClient) -> None:
    r = client.post("/api/embed", json={"model": "m", "input": "word " * 300, "truncate": False})
    assert r.status_code == 400 and "truncate" in r.json()["error"]
    assert client.post("/api/embed", json={"model": "m", "input": "word " * 300}).status_code == 200


def test_office_and_own_documents_and_who_sees_what(people_client: TestClient) -> None:
    client = people_client
    ann, ben = join(client, "Ann", 1), join(client, "Ben", 2)
    office = upload(client, "/admin/library?title=Staff%20Handbook", "handbook.txt",
                    b"Welcome.\fParking is behind the building.\fThe assembly point is the Linden bakery car park.")
    assert office.status_code == 202 and office.json()["status"] == "indexing" and office.json()["pages"] == 3
    own = upload(client, "/v1/library", "notes.md", b"# Notes\n\nCodename Bluefinch: salary review.", ben)
    assert own.status_code == 202 and own.json()["scope"] == "own" and own.json()["kind"] == "markdown"
    assert [d["title"] for d in ready(client, "/v1/library", ann)] == ["Staff Handbook"]
    assert {d["scope"] for d in ready(client, "/v1/library", ben)} == {"office", "own"}
    oid = own.json()["id"]
    for method in ("GET", "DELETE"):
        assert error_of(client.request(method, f"/v1/library/{oid}", headers=ann), 404)["code"] == "document_not_found"
    assert error_of(upload(client, f"/v1/library/{oid}", "x.txt", b"mine now", ann, "PUT"), 404)
    error_of(client.get("/admin/library", headers=ann), 403)  # not this machine, not an admin
    error_of(upload(client, "/v1/library", "a.txt", b"anyone", {"x-test-client": "10.0.0.9"}), 401)

    asked = client.post(CHAT, json={"messages": [{"role": "user", "content": "Where is the assembly point? Bluefinch?"}],
                                    "library": True}, headers=ann)
    assert asked.status_code == 200, asked.text
    asked = asked.json()
    assert {s["title"] for s in asked["sources"]} == {"Staff Handbook"} and asked["sources"][0]["page"] == 3
    assert "Bluefinch" not in json.dumps(asked)
    mine = client.post(CHAT, json={"messages": [{"role": "user", "content": "Bluefinch salary"}], "library": True,
                                   "stream": True}, headers=ben)
    first = json.loads(mine.text.split("\n\n")[0].removeprefix("data: "))
    assert first["sources"][0]["title"] == "notes" and first["sources"][0]["n"] == 1
    ollama = client.post("/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "Linden bakery?"}],
                                            "library": True, "stream": False}, headers=ann).json()
    # "See [1]." says nothing a source holds: the server quotes the closest sentence after it.
    assert ollama["sources"][0]["page"] == 3 and ollama["message"]["content"] == (
        "See [1].\n\n(The closest the sources come is [1] Staff Handbook, page 3: "
        "“The assembly point is the Linden bakery car park.”)")

    assert client.delete(f"/v1/library/{oid}", headers=ben).status_code == 204
    assert [d["scope"] for d in client.get("/v1/library", headers=ben).json()["data"]] == ["office"]


def test_library_requests_are_checked(client: TestClient) -> None:
    error_of(client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "library": "yes"}), 400)
    r = client.post("/admin/library", content=b"x", headers={"content-type": "multipart/form-data; boundary=x",
                                                               "x-file-name": "a.txt"})
    assert error_of(r, 415 if r.status_code == 415 else 400)
    error_of(upload(client, "/admin/library", "", b"no name"), 400)
    error_of(upload(client, "/admin/library?title=" + "t" * 201, "a.txt", b"hi"), 400)
    assert error_of(upload(client, "/admin/library", "photo.png", b"\x89PNG\r\n\x1a\n\x00\x00"), 415)["code"] \
        == "unsupported_type"
    error_of(client.delete("/admin/library/lib_0000000000000000"), 404)
    # Sources that would overflow the context (512 here) are left out, not the request refused.
    assert upload(client, "/admin/library", "point.txt", b"The assembly point is the Linden bakery.").status_code == 202
    ready(client, "/admin/library")
    short = client.post(CHAT, json={"messages": [{"role": "user", "content": "Linden bakery?"}], "library": True})
    assert [s["title"] for s in short.json()["sources"]] == ["point"]
    long = client.post(CHAT, json={"messages": [{"role": "user", "content": "Linden bakery " * 25}], "library": True})
    assert long.status_code == 200 and long.json()["sources"] == []
    # No sources without a question: the chat goes on as without the library.
    plain = client.post(CHAT, json={"messages": [{"role": "user", "content": "   "}], "library": True}).json()
    assert plain["sources"] == []


def test_without_the_library_its_routes_say_so() -> None:
    with serving() as c:
        assert error_of(c.get("/v1/library"), 404)["code"] == "library_off"
        assert error_of(c.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "library": True}),
                        404)["code"] == "library_off"
        assert error_of(c.post("/v1/embeddings", json={"input": "hi"}), 404)["code"] == "embeddings_off"
        assert c.post("/api/embed", json={"model": "m", "input": "hi"}).status_code == 404


def test_the_page_uploads_as_a_browser_does(client: TestClient) -> None:
    """From the page: its Origin, the file's own type (a PDF here); a cross-site form's
    "simple" type is refused, as for attachments."""
    page = {"origin": "http://localhost"}
    r = upload(client, "/admin/library", "menu.md", b"# Menu\n\nSoup.", {**page, "content-type": "text/markdown"})
    assert r.status_code == 202, r.text
    r = upload(client, "/admin/library", "menu.txt", b"Soup.", {**page, "content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415, r.text


def test_open_mode_has_no_documents_of_ones_own(client: TestClient) -> None:
    err = error_of(upload(client, "/v1/library", "a.txt", b"hello"), 403)
    assert err["code"] == "library_own_needs_people"
    assert error_of(upload(client, "/admin/library", "a.txt", b"hello", {"x-test-client": "10.0.0.7"}), 403)


# -- every chat API, the same way -----------------------------------------------------------------
QUESTION = "Where is the spare key kept?"
KEY_DOC = "The spare key is kept in the blue flowerpot by the back door."
ASK = [{"role": "user", "content": QUESTION}]
APIS = {  # each chat API's path and a body that asks QUESTION in it
    "openai": (CHAT, {"messages": ASK}),
    "responses": ("/v1/responses", {"input": QUESTION}),
    "ollama": ("/api/chat", {"model": "m", "messages": ASK}),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 16, "messages": ASK}),
}


@pytest.fixture(scope="module")
def apis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, FakeModel, Library, str]]:
    """Open mode, a library of one document (its one passage); the fake model to read what it was given."""
    service = FakeEmbedService()
    model = FakeModel(reply="See [1].")
    library = _library(tmp_path_factory.mktemp("library"), service)
    with serving(lambda: model, embedder=service, ctx=2048, library=library) as c:
        doc = upload(c, "/admin/library", "key.txt", KEY_DOC.encode()).json()["id"]
        ready(c, "/admin/library")
        yield c, model, library, doc


def streamed_sources(api: str, r: Any) -> Any:
    """The sources where each API's stream carries them: chat's first chunk, the response
    object of the Responses events, Ollama's last line, the message of Anthropic's message_start."""
    if api == "ollama":
        return json.loads(r.text.strip().splitlines()[-1])["sources"]
    events = dicts(events_of(r))
    if api == "openai":
        return events[0]["sources"]
    if api == "anthropic":
        assert events[0]["type"] == "message_start"
        return events[0]["message"]["sources"]
    created, done = events[0], events[-1]
    assert (created["type"], done["type"]) == ("response.created", "response.completed")
    assert created["response"]["sources"] == given(done["response"]["sources"])
    return done["response"]["sources"]


def given(sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sources as the prompt gave them: without what the answer's check adds at its end
    (`used`, `support`, `quoted`: test_library_grounding.py)."""
    return [{k: v for k, v in s.items() if k not in ("used", "support", "quoted")} for s in sources]


def decoded_since(model: FakeModel, since: int) -> str:
    """What the fake model was given to read since its call `since` (the fake's token is a character)."""
    return "".join(chr(t) for tokens, *_ in model.calls[since:] for t in tokens if t)


@pytest.mark.parametrize("api", APIS)
def test_every_chat_api_cites_the_library_the_same_way(apis: tuple[TestClient, FakeModel, Library, str],
                                                       api: str) -> None:
    client, model, _, doc = apis
    path, body = APIS[api]
    want = [{"n": 1, "document": doc, "title": "key", "page": None, "text": KEY_DOC}]
    wait_health(client.get, is_idle)
    since = len(model.calls)
    # A user of its own per API: the same conversation is cached per user, and would not be read again.
    whole = client.post(path, json={**body, "library": True, "stream": False}, headers=user(20 + list(APIS).index(api)))
    assert whole.status_code == 200, whole.text
    assert given(whole.json()["sources"]) == want
    read = decoded_since(model, since)
    assert f"[1] key:\n{KEY_DOC}\n\nQuestion: {QUESTION}" in read and read.count("[1] key:") == 1
    assert given(streamed_sources(api, client.post(path, json={**body, "library": True, "stream": True}))) == want
    # Without the switch (or with it off), nothing of the library: the answer as it was.
    for off in ({}, {"library": False}):
        plain = client.post(path, json={**body, **off, "stream": False})
        assert plain.status_code == 200 and "sources" not in plain.json()
        assert "sources" not in client.post(path, json={**body, **off, "stream": True}).text


@pytest.mark.parametrize("api", APIS)
def test_every_chat_api_refuses_a_library_that_is_not_a_boolean_or_is_off(
        apis: tuple[TestClient, FakeModel, Library, str], api: str) -> None:
    client = apis[0]
    path, body = APIS[api]
    for bad in ("yes", 1, [], {}):
        r = client.post(path, json={**body, "library": bad})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        message = err if api == "ollama" else err["message"]
        assert "'library' must be true or false" in message
        if api == "anthropic":
            assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
        elif api != "ollama":
            assert err["param"] == "library"
    with serving() as off:
        r = off.post(path, json={**body, "library": True, "stream": False})
        assert r.status_code == 404 and "the library is off" in r.text
        assert off.post(path, json={**body, "library": False, "stream": False}).status_code == 200


def test_the_library_is_searched_once_and_its_sources_fit_the_room_by_the_models_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two passages of one length, and a question that leaves room for one of them: the
    model's own tokens decide (the fake's token is a character), so exactly one is given,
    and no turn of the conversation is pushed out for it."""
    from appliance.http.retrieval import SLACK
    from appliance.library.cite import FRAME, block
    from appliance.library.store import Found

    service = FakeEmbedService()
    library = _library(tmp_path, service)
    searches: list[str] = []
    search = library.search

    async def counted(scopes: list[str], question: str, *args: Any, **kw: Any) -> Any:
        searches.append(question)
        return await search(scopes, question, *args, **kw)

    monkeypatch.setattr(library, "search", counted)
    text = "The {} code of the spare key box is 7777." + " Keep it to yourself." * 8
    with serving(lambda: FakeModel(reply="See [1]."), embedder=service, ctx=2048, library=library) as client:
        for name in ("alpha", "bravo"):
            assert upload(client, "/admin/library", f"{name}.txt", text.format(name).encode()).status_code == 202
        ready(client, "/admin/library")
        ask = "alpha bravo spare key box code"
        cost = len(block(1, Found(0, "", "alpha", None, text.format("alpha"))) + "\n\n")  # either passage's
        limit = 2048 - 32  # the prompt's room: the context less the default answer
        history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
        plain = client.post(f"{CHAT}/input_tokens", json={"messages": [*history, {"role": "user", "content": ask}]})
        pad = limit - plain.json()["input_tokens"] - len(FRAME) - SLACK - cost - cost // 2
        messages = [*history, {"role": "user", "content": ask + "?" * pad}]
        r = client.post(CHAT, json={"messages": messages, "library": True})
        assert r.status_code == 200, r.text
        assert searches == [ask + "?" * pad]
        assert [s["title"] for s in r.json()["sources"]] in (["alpha"], ["bravo"])
        assert "dropped_messages" not in r.json()
        # To the token: room for one exactly, and one token short of it.
        for extra, given in ((cost // 2, 1), (cost // 2 + 1, 0)):
            messages = [*history, {"role": "user", "content": ask + "?" * (pad + extra)}]
            assert len(client.post(CHAT, json={"messages": messages, "library": True}).json()["sources"]) == given
        searches.clear()
        # Room for both (a shorter question): both, from one search again.
        r = client.post(CHAT, json={"messages": [*history, {"role": "user", "content": ask}], "library": True})
        assert sorted(s["title"] for s in r.json()["sources"]) == ["alpha", "bravo"] and len(searches) == 1


def test_the_status_lists_the_library_indexer(client: TestClient) -> None:
    running = {w["name"]: w for w in client.get("/admin/status").json()["workers"]}
    assert running["library-indexer"]["alive"]
