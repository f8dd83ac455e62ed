"""A person's own export (GET /v1/me/export: their chats and their own documents, never anyone
else's) and the operator's "remove everything of this person" (DELETE /admin/people/{id}: their
account, sessions, keys, chats and shares, their own documents, the usage under their name)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import serving
from helpers.polling import wait_until
from starlette.testclient import TestClient

from appliance.documents.reader import DocumentReader
from appliance.http.people import People
from appliance.library.library import Library
from appliance.library.store import LibraryStore, person_scope
from appliance.people.db import Database
from appliance.people.passwords import Hasher


def vectors(texts: list[str]) -> np.ndarray:
    return np.ones((len(texts), 8), np.float32) / np.sqrt(8)  # what is searched is not the point here


async def embed(texts: list[str]) -> np.ndarray:
    return vectors(texts)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[TestClient, Library]]:
    people = People(Database(tmp_path / "people"), hasher=Hasher(n=2**10))
    library = Library(LibraryStore(tmp_path / "library"), DocumentReader(), embed, vectors)
    with serving(lambda: FakeModel(reply="Noted."), people=people, library=library) as c:
        yield c, library


def join(c: TestClient, name: str, i: int) -> dict[str, str]:
    """Added by the operator, signed in from office PC i: the headers of that browser."""
    token = c.post("/admin/people", json={"name": name}).json()["invite_url"].rsplit("=", 1)[1]
    r = c.post("/auth/invite/accept", json={"token": token, "password": "a long enough password"})
    c.cookies.clear()
    return {"cookie": r.headers["set-cookie"].split(";")[0], "x-csrf-token": r.json()["csrf"],
            "x-test-client": f"10.0.0.{i}"}


def upload(c: TestClient, path: str, name: str, text: str, who: dict[str, str] | None = None) -> str:
    """A text file added to a library, once indexed: its id."""
    r = c.post(path, content=text.encode(), headers={"content-type": "text/plain", "x-file-name": name, **(who or {})})
    assert r.status_code == 202, r.text
    doc = r.json()["id"]
    wait_until(lambda: c.get(f"{path}/{doc}", headers=who).json()["status"] == "ready", 10, "the indexer")
    return str(doc)


def fill(c: TestClient, who: dict[str, str], name: str, secret: str) -> None:
    """A chat, a request counted under their name, and a document of their own."""
    chat = {"title": f"{name}'s plans", "messages": [{"role": "user", "content": f"{secret} in the chat"},
                                                    {"role": "assistant", "content": "Noted."}]}
    assert c.put(f"/v1/chats/{name}-chat-0000000001", headers=who, json=chat).status_code == 200
    r = c.post("/v1/chat/completions", headers=who, json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    upload(c, "/v1/library", f"{name}.txt", f"{secret} in the document.", who)


def test_an_export_holds_the_persons_chats_and_documents_and_nobody_elses(box: tuple[TestClient, Library]) -> None:
    c, _ = box
    ann, ben = join(c, "Ann", 1), join(c, "Ben", 2)
    fill(c, ann, "ann", "Quince jam")
    fill(c, ben, "ben", "Ben's surprise party")
    upload(c, "/admin/library", "office.txt", "The office closes at six.")

    r = c.get("/v1/me/export", headers=ann)
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"] == 'attachment; filename="appliance-Ann.json"'
    assert r.headers["cache-control"] == "no-store"
    body = json.loads(r.text)
    assert body["person"]["name"] == "Ann"
    assert [(ch["id"], [m["content"] for m in ch["messages"]]) for ch in body["chats"]] == [
        ("ann-chat-0000000001", ["Quince jam in the chat", "Noted."])]
    assert [(d["name"], d["scope"], d["text"]) for d in body["documents"]] == [
        ("ann.txt", "own", "Quince jam in the document.")]
    assert "Ben" not in r.text and "surprise" not in r.text and "office" not in r.text


def test_an_export_needs_a_session(box: tuple[TestClient, Library]) -> None:
    c, _ = box
    ann = join(c, "Ann", 1)
    key = c.post("/v1/me/keys", headers=ann, json={"label": "laptop"}).json()["key"]
    r = c.get("/v1/me/export", headers={"authorization": f"Bearer {key}", "x-test-client": "10.0.0.1"})
    assert r.status_code == 401
    assert c.get("/v1/me/export", headers={"x-test-client": "10.0.0.3"}).status_code == 401


def test_removing_a_person_removes_everything_of_theirs(box: tuple[TestClient, Library]) -> None:
    c, library = box
    ann, ben = join(c, "Ann", 1), join(c, "Ben", 2)
    fill(c, ann, "ann", "Quince jam")
    fill(c, ben, "ben", "Ben's surprise party")
    key = c.post("/v1/me/keys", headers=ben, json={"label": "laptop"}).json()["key"]
    share = c.post("/v1/chats/ben-chat-0000000001/share", headers=ben).json()["token"]
    ben_id = next(p["id"] for p in c.get("/admin/people").json()["people"] if p["name"] == "Ben")
    assert "Ben" in c.get("/admin/usage.csv").text

    assert c.delete(f"/admin/people/{ben_id}").status_code == 204
    assert [p["name"] for p in c.get("/admin/people").json()["people"]] == ["Ann"]
    assert c.get("/v1/chats", headers=ben).status_code == 401  # the session is gone
    assert c.get("/v1/chats", headers={"authorization": f"Bearer {key}", "x-test-client": "10.0.0.2"}).status_code == 401
    assert c.post("/v1/shared", headers=ann, json={"token": share}).status_code == 404
    assert library.documents([person_scope(ben_id)]) == []
    assert "surprise" not in json.dumps([f.text for f in library.store.found(range(1, 100), [person_scope(ben_id)]).values()])
    wait_until(lambda: "Ben" not in c.get("/admin/usage.csv").text, 5, "Ben's usage to be forgotten")
    # Ann keeps everything of hers.
    assert [d["name"] for d in c.get("/v1/library", headers=ann).json()["data"]] == ["ann.txt"]
    assert "Ann" in c.get("/admin/usage.csv").text
    assert c.delete(f"/admin/people/{ben_id}").status_code == 404
