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
from helpers.inprocess import CHAT, error_of, serving
from starlette.testclient import TestClient

from appliance.documents.reader import DocumentReader
from appliance.http.people import People
from appliance.library.library import Library
from appliance.library.passages import terms
from appliance.library.store import LibraryStore
from appliance.people.db import Database
from appliance.people.passwords import Hasher

DIM = 32


class FakeEmbedService:
    """The EmbedService's face: words hashed into DIM dimensions, unit length."""

    dim, max_tokens, model_id = DIM, 256, "fake-embedder"

    def vectors(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            for w in terms(t):
                out[i, sum(w.encode()) % DIM] += 1
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-6)
        return out

    def count_tokens(self, text: str) -> int:
        return len(terms(text)) + 2

    async def embed(self, texts: list[str]) -> np.ndarray:
        return self.vectors(texts)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        return self.vectors(texts)

    def start(self) -> None: ...
    def stop(self) -> None: ...


def _library(state: Path, service: FakeEmbedService) -> Library:
    return Library(LibraryStore(state), DocumentReader(), service.embed, service.embed_sync)


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


def upload(client: TestClient, path: str, name: str, body: bytes, headers: dict[str, str] | None = None,
           method: str = "POST") -> Any:
    return client.request(method, path, content=body, headers={"content-type": "text/plain", "x-file-name": name,
                                                               **(headers or {})})


def ready(client: TestClient, path: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    for _ in range(2000):  # the indexer thread: a condition, not a time
        docs = client.get(path, headers=headers).json()["data"]
        if all(d["status"] != "indexing" for d in docs):
            return list(docs)
    raise AssertionError("indexing never finished")


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
    assert ollama["sources"][0]["page"] == 3 and ollama["message"]["content"] == "See [1]."

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
