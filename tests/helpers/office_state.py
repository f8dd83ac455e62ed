"""What an office keeps on a box, checked over HTTP on a server started on a state directory:
the state tests/fixtures/make_state.py made (its `<dir>.json` says what), found whole after
an upgrade (tests/ops/test_upgrade.py) or a restore (tests/ops/test_backup_live.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx

from helpers.live import Live


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
