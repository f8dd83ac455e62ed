"""What an office keeps on a box, made over HTTP as an office would (`fill`: people, chats, a
share, a key, documents, usage) and checked on a server started on a state directory (`check`):
the state tests/fixtures/make_state.py made with `fill` (its `<dir>.json` says what), found
whole after an upgrade (tests/ops/test_upgrade_live.py) or a restore (test_backup_live.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx

from helpers.live import Live
from helpers.polling import wait_until

PASSWORD = "a long office password"
OFFICE_DOC = ("parking.txt", "Parking rules", "Visitors park in the Linden Street garage, level 2. "
              "Staff badges open the barrier from 7:00 to 20:00.")
OWN_DOC = ("recipes.txt", "Ann's recipes", "The quince jam needs three hours on a low flame and a kilo of sugar.")


def person(box: Live, name: str, role: str = "user") -> tuple[str, dict[str, str]]:
    """Add a person from the box itself (the operator's place), take the invite: their id and
    the headers of their session (cookie and CSRF token)."""
    r = box.client.post("/admin/people", json={"name": name, "role": role})
    assert r.status_code == 201, r.text
    token = r.json()["invite_url"].rsplit("=", 1)[1]
    r = box.client.post("/auth/invite/accept", json={"token": token, "password": PASSWORD})
    assert r.status_code == 200, r.text
    box.client.cookies.clear()  # the headers carry the session: the client stays the operator's
    return r.json()["person"]["id"], {"cookie": r.headers["set-cookie"].split(";")[0], "x-csrf-token": r.json()["csrf"]}


def chat(box: Live, who: dict[str, str], cid: str, title: str, question: str) -> list[dict[str, str]]:
    """Ask the model as this person (a usage row) and keep the exchange as a chat."""
    r = box.client.post("/v1/chat/completions", headers=who, json={
        "messages": [{"role": "user", "content": question}], "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    messages = [{"role": "user", "content": question},
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}]
    r = box.client.put(f"/v1/chats/{cid}", headers=who, json={"title": title, "messages": messages})
    assert r.status_code == 200, r.text
    return messages


def document(box: Live, path: str, doc: tuple[str, str, str], who: dict[str, str] | None = None) -> str:
    name, title, text = doc
    r = box.client.post(path, params={"title": title}, content=text.encode(), headers={
        "content-type": "text/plain", "x-file-name": name, **(who or {})})
    assert r.status_code == 202, r.text
    doc_id = str(r.json()["id"])
    wait_until(lambda: box.client.get(f"{path}/{doc_id}", headers=who or {}).json()["status"] == "ready",
               300, "the document to be indexed", every=0.2)
    return doc_id


def fill(box: Live) -> dict[str, Any]:
    admin_id, admin = person(box, "Olga", "admin")
    ann_id, ann = person(box, "Ann")
    bob_id, bob = person(box, "Bob")
    chats = {"ann": {"ann-chat-000000001": chat(box, ann, "ann-chat-000000001", "Opening hours", "When do offices open?"),
                     "ann-chat-000000002": chat(box, ann, "ann-chat-000000002", "Jam", "Name a fruit for jam.")},
             "olga": {"olga-chat-00000001": chat(box, admin, "olga-chat-00000001", "Printers", "Say hello.")},
             "bob": {"bob-chat-000000001": chat(box, bob, "bob-chat-000000001", "Leaving", "Say goodbye.")}}
    share = box.client.post("/v1/chats/ann-chat-000000001/share", headers=ann).json()["token"]
    r = box.client.post("/v1/me/keys", headers=ann, json={"label": "laptop"})
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    office = document(box, "/admin/library", OFFICE_DOC)
    own = document(box, "/v1/library", OWN_DOC, ann)
    r = box.client.patch(f"/admin/people/{bob_id}", json={"disabled": True})
    assert r.status_code == 200, r.text
    return {"password": PASSWORD, "share": share, "key": key,
            "people": {"olga": {"id": admin_id, "role": "admin"}, "ann": {"id": ann_id, "role": "user"},
                       "bob": {"id": bob_id, "role": "user", "disabled": True}},
            "chats": chats, "documents": {"office": [office, *OFFICE_DOC], "own": [own, *OWN_DOC]},
            "usage": sorted(["Olga", "Ann", "Bob"])}


def sign_in(box: Live, name: str, password: str) -> httpx.Response:
    return httpx.post(f"{box.url}/auth/signin", json={"name": name, "password": password}, trust_env=False)


def session(r: httpx.Response) -> dict[str, str]:
    assert r.status_code == 200, r.text
    return {"cookie": r.headers["set-cookie"].split(";")[0], "x-csrf-token": r.json()["csrf"]}


def check_people(box: Live, made: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Every account is there as it was: each signs in but the disabled one; their sessions."""
    listed = {p["id"]: p for p in box.client.get("/admin/people").json()["people"]}
    heads = {}
    for key, p in made["people"].items():
        assert listed[p["id"]]["role"] == p["role"] and listed[p["id"]]["disabled"] == p.get("disabled", False)
        assert listed[p["id"]]["chats"] >= len(made["chats"][key])
        r = sign_in(box, listed[p["id"]]["name"], made["password"])
        if p.get("disabled"):
            assert r.status_code != 200
        else:
            heads[key] = session(r)
    return heads


def check_chats(box: Live, made: dict[str, Any], heads: dict[str, dict[str, str]]) -> None:
    """Every chat with every message; the share link; a person's key."""
    for key, who in heads.items():
        for cid, messages in made["chats"][key].items():
            chat = box.client.get(f"/v1/chats/{cid}", headers=who).json()
            assert [{"role": m["role"], "content": m["content"]} for m in chat["messages"]] == messages, cid
    shared = box.client.post("/v1/shared", headers=heads["olga"], json={"token": made["share"]})
    assert shared.status_code == 200, shared.text
    first = next(iter(made["chats"]["ann"].values()))
    assert [m["content"] for m in shared.json()["messages"]] == [m["content"] for m in first]
    r = httpx.get(f"{box.url}/v1/chats", headers={"authorization": f"Bearer {made['key']}"}, trust_env=False)
    assert r.status_code == 200 and set(made["chats"]["ann"]) <= {c["id"] for c in r.json()["chats"]}


def check_library(box: Live, made: dict[str, Any], heads: dict[str, dict[str, str]]) -> None:
    """Both documents listed and ready, and a chat that asks the library cites Ann's own."""
    docs = {d["id"]: d for d in box.client.get("/v1/library", headers=heads["ann"]).json()["data"]}
    for doc_id, _, title, _ in made["documents"].values():
        assert docs[doc_id]["title"] == title and docs[doc_id]["status"] == "ready", docs
    r = box.client.post("/v1/chat/completions", headers=heads["ann"], json={
        "messages": [{"role": "user", "content": "How long does the quince jam cook?"}], "max_tokens": 8,
        "temperature": 0, "library": True})
    assert r.status_code == 200, r.text
    assert made["documents"]["own"][2] in [s["title"] for s in r.json()["sources"]], r.json()["sources"]


def usage_rows(path: Path) -> dict[tuple[str, str], tuple[int, ...]]:
    with sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True) as db:
        return {(r[0], r[1]): tuple(r[2:]) for r in db.execute("SELECT * FROM usage")}


def check(box: Live, made: dict[str, Any]) -> None:
    heads = check_people(box, made)
    check_chats(box, made, heads)
    check_library(box, made, heads)
