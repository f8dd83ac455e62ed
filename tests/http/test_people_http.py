"""People mode over HTTP (in-process, the fake model): invites, sign-in and its limits, the
CSRF rule, a person's chats, keys and share links, what another person and the operator can
reach, and a store that fails. The browser tests drive the same routes from the page."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, USER, build, error_of, serving
from helpers.polling import wait_until
from starlette.testclient import TestClient

from appliance.http.people import COOKIE, People
from appliance.people.db import Database
from appliance.people.passwords import Hasher

PASSWORD = "a long enough password"


def user(i: int) -> dict[str, str]:
    """From office PC i: not this machine (which may reach /admin without signing in)."""
    return {"x-test-client": f"10.0.0.{i}"}


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> People:
    # A cheap scrypt cost: these test the routes (tests/people/test_passwords.py the hash).
    return People(Database(tmp_path_factory.mktemp("state")), hasher=Hasher(n=2**10))


@pytest.fixture(scope="module")
def serve(people: People) -> Callable[[], AbstractContextManager[TestClient]]:
    return lambda: serving(people=people)


class Person:
    """One signed-in browser: its cookie and CSRF token, from one address."""

    def __init__(self, client: TestClient, body: dict[str, Any], cookie: str, i: int) -> None:
        self.c, self.id, self.name, self.csrf, self.cookie, self.i = client, body["person"]["id"], \
            body["person"]["name"], body["csrf"], cookie, i

    def h(self, csrf: bool = True) -> dict[str, str]:
        return {"cookie": f"{COOKIE}={self.cookie}", **user(self.i), **({"x-csrf-token": self.csrf} if csrf else {})}

    def get(self, path: str) -> Any:
        return self.c.get(path, headers=self.h())

    def send(self, method: str, path: str, body: Any = None, csrf: bool = True) -> Any:
        return self.c.request(method, path, json=body, headers=self.h(csrf))


def session_of(client: TestClient, r: Any, i: int) -> Person:
    assert r.status_code == 200, r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
    token = cookie.split(";")[0].split("=", 1)[1]
    client.cookies.clear()  # each Person sends its own cookie
    return Person(client, r.json(), token, i)


def invite(client: TestClient, name: str, role: str = "user", quota: int | None = None) -> str:
    r = client.post("/admin/people", json={"name": name, "role": role, "quota": quota})  # from this machine
    assert r.status_code == 201, r.text
    body = r.json()
    # Made on this machine (localhost): the link names the box as a phone finds it (http/reach.py).
    assert body["invite_url"].startswith("http://appliance.local:8080/#invite=") and "<svg" in body["invite_qr_svg"]
    return str(body["invite_url"].rsplit("=", 1)[1])


def join(client: TestClient, name: str, i: int, **kw: Any) -> Person:
    token = invite(client, name, **kw)
    assert client.post("/auth/invite", json={"token": token}).json() == {"name": name}
    return session_of(client, client.post("/auth/invite/accept", json={"token": token, "password": PASSWORD},
                                          headers=user(i)), i)


@pytest.fixture(scope="module")
def ann(client: TestClient) -> Person:
    return join(client, "Ann", 1, role="admin")


@pytest.fixture(scope="module")
def ben(client: TestClient) -> Person:
    return join(client, "Ben", 2, quota=100000)


def test_the_api_needs_a_person(client: TestClient) -> None:
    assert client.get("/auth/me", headers=user(5)).status_code == 401
    assert client.get("/auth/me", headers=user(5)).json()["mode"] == "people"
    error_of(client.post(CHAT, json={"messages": USER}, headers=user(5)), 401)
    error_of(client.get("/v1/chats", headers=user(5)), 401)
    error_of(client.get("/v1/models", headers=user(5)), 401)
    assert client.get("/health", headers=user(5)).status_code == 200
    error_of(client.get("/admin/people", headers=user(5)), 403)  # not this machine, not an admin


def test_an_invite_signs_in_and_is_used_once(client: TestClient, ann: Person) -> None:
    me = ann.get("/auth/me").json()
    assert me["person"]["name"] == "Ann" and me["person"]["role"] == "admin" and me["csrf"] == ann.csrf
    token = invite(client, "Cat")
    assert client.post("/auth/invite/accept", json={"token": token, "password": "short"}).status_code == 400
    client.post("/auth/invite/accept", json={"token": token, "password": PASSWORD})
    client.cookies.clear()
    error_of(client.post("/auth/invite/accept", json={"token": token, "password": PASSWORD}), 400)
    error_of(client.post("/auth/invite", json={"token": token}), 404)
    error_of(client.post("/admin/people", json={"name": "cat"}), 400)  # taken, without case
    error_of(client.post("/admin/people", json={"name": "Dan", "role": "boss"}), 400)
    error_of(client.post("/admin/people", json={"name": "Dan", "quota": -1}), 400)


def test_changes_by_cookie_need_the_csrf_token(ann: Person) -> None:
    err = error_of(ann.send("POST", CHAT, {"messages": USER}, csrf=False), 403)
    assert err["code"] == "csrf_token"
    assert ann.send("POST", CHAT, {"messages": USER}).status_code == 200
    assert ann.c.get("/v1/chats", headers=ann.h(csrf=False)).status_code == 200  # reading needs none
    # A key the page kept from before people mode does not hide the session.
    stale = {**ann.h(), "authorization": "Bearer a-key-from-the-open-days-0001"}
    assert ann.c.get("/v1/chats", headers=stale).status_code == 200


def test_a_persons_chats_are_theirs_and_shared_by_link(client: TestClient, ann: Person, ben: Person) -> None:
    r = ann.send("POST", "/v1/chats", {"title": "Paper order", "messages": [
        {"role": "user", "content": "How much paper?"}, {"role": "assistant", "content": "Five boxes."}]})
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    assert [c["id"] for c in ann.get("/v1/chats").json()["chats"]] == [cid]
    assert [c["title"] for c in ann.get("/v1/chats?q=five").json()["chats"]] == ["Paper order"]
    # Ben can neither list, open, change nor share it: each is a 404, as for a chat that never was.
    assert ben.get("/v1/chats").json()["chats"] == []
    for method, path in [("GET", f"/v1/chats/{cid}"), ("PATCH", f"/v1/chats/{cid}"),
                         ("DELETE", f"/v1/chats/{cid}"), ("POST", f"/v1/chats/{cid}/share")]:
        assert error_of(ben.send(method, path, {"title": "x", "messages": []}), 404)["code"] == "chat_not_found"
    # A PUT of the same id makes a chat of Ben's own: chat ids are each person's.
    assert ben.send("PUT", f"/v1/chats/{cid}", {"title": "Ben's", "messages": []}).status_code == 200
    assert ann.get(f"/v1/chats/{cid}").json()["title"] == "Paper order"
    error_of(ben.send("PUT", "/v1/chats/short", {"messages": []}), 404)
    assert ann.send("PATCH", f"/v1/chats/{cid}", {"title": "Paper, March"}).status_code == 204
    link = ann.send("POST", f"/v1/chats/{cid}/share").json()
    token = link["token"]
    assert link["url"] == f"http://appliance.local:8080/#share={token}" and link["origin"] == "http://appliance.local:8080"
    shared = ben.send("POST", "/v1/shared", {"token": token}).json()
    assert shared["title"] == "Paper, March" and shared["owner"] == "Ann" and shared["read_only"]
    assert [m["content"] for m in shared["messages"]] == ["How much paper?", "Five boxes."]
    assert "id" not in shared and "meta" not in shared
    error_of(client.post("/v1/shared", json={"token": token}, headers=user(7)), 404)  # signed out: as if not there
    assert ann.send("DELETE", f"/v1/chats/{cid}/share").status_code == 204
    error_of(ben.send("POST", "/v1/shared", {"token": token}), 404)
    error_of(ann.send("POST", "/v1/chats", {"messages": [{"role": "robot", "content": "x"}]}), 400)
    error_of(ann.send("POST", "/v1/chats", {"messages": "x"}), 400)


def test_a_chat_continues_on_another_device_on_the_same_cache(client: TestClient, ann: Person) -> None:
    phone = session_of(client, client.post("/auth/signin", json={"name": "ann", "password": PASSWORD},
                                           headers=user(9)), 9)
    assert phone.cookie != ann.cookie
    first = [{"role": "user", "content": "Tell me about the office party plans please"}]
    r = ann.c.post(CHAT, json={"messages": first}, headers={**ann.h(), "x-session-id": "chat-000000000001"})
    assert r.status_code == 200
    second = first + [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                      {"role": "user", "content": "and the date?"}]
    r = phone.c.post(CHAT, json={"messages": second}, headers={**phone.h(), "x-session-id": "chat-000000000001"})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > len(first[0]["content"])


def test_wrong_passwords_are_limited_per_name_and_address_not_per_name(client: TestClient, ben: Person) -> None:
    codes = [client.post("/auth/signin", json={"name": "Ben", "password": f"wrong guess {i}"},
                         headers=user(20)).status_code for i in range(20)]
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}
    r = client.post("/auth/signin", json={"name": "Ben", "password": PASSWORD}, headers=user(20))
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0  # the guesser's address stays limited
    assert client.post("/auth/signin", json={"name": "Ben", "password": PASSWORD}, headers=user(21)).status_code == 200
    client.cookies.clear()
    # An unknown name gets the same words as a wrong password.
    a = error_of(client.post("/auth/signin", json={"name": "Nobody", "password": PASSWORD}, headers=user(22)), 401)
    b = error_of(client.post("/auth/signin", json={"name": "Ben", "password": "not it at all"}, headers=user(22)), 401)
    assert a["message"] == b["message"] == "wrong name or password"
    error_of(client.post("/auth/signin", json={"name": 3, "password": PASSWORD}, headers=user(22)), 400)


def test_a_persons_key_counts_as_them_and_ends_with_them(client: TestClient, ann: Person) -> None:
    dan = join(client, "Dan", 30)
    r = dan.send("POST", "/v1/me/keys", {"label": "spreadsheet"})
    assert r.status_code == 201, r.text
    key, kid = r.json()["key"], r.json()["id"]
    assert key not in str(dan.get("/v1/me/keys").json())
    bearer = {"authorization": f"Bearer {key}", **user(31)}
    assert client.post(CHAT, json={"messages": USER}, headers=bearer).status_code == 200  # no CSRF: not a cookie
    error_of(client.post("/v1/me/keys", json={"label": "more"}, headers=bearer), 401)  # a key makes no keys
    people = {p["name"]: p for p in client.get("/admin/people").json()["people"]}
    assert people["Dan"]["keys"] == 1 and people["Dan"]["sessions"] == 1 and key not in str(people)
    assert any(row["who"] == "Dan" for row in client.get("/admin/status").json()["people"])
    assert client.patch(f"/admin/people/{dan.id}", json={"disabled": True}).json()["disabled"] is True
    error_of(client.post(CHAT, json={"messages": USER}, headers=bearer), 401)
    error_of(dan.get("/v1/chats"), 401)
    error_of(dan.send("DELETE", f"/v1/me/keys/{kid}"), 401)
    assert client.delete(f"/admin/people/{dan.id}").status_code == 204
    error_of(client.delete(f"/admin/people/{dan.id}"), 404)


def test_an_admin_person_reaches_admin_from_anywhere(client: TestClient, ann: Person, ben: Person) -> None:
    assert ann.get("/admin/people").status_code == 200
    error_of(ben.get("/admin/people"), 403)


def test_sign_out_and_sign_out_everywhere(client: TestClient) -> None:
    eve = join(client, "Eve", 40)
    laptop = session_of(client, client.post("/auth/signin", json={"name": "Eve", "password": PASSWORD},
                                            headers=user(41)), 41)
    assert eve.send("POST", "/auth/signout").status_code == 204
    error_of(eve.get("/v1/chats"), 401)
    assert laptop.get("/v1/chats").status_code == 200
    other = session_of(client, client.post("/auth/signin", json={"name": "Eve", "password": PASSWORD},
                                           headers=user(42)), 42)
    assert laptop.send("POST", "/auth/signout-everywhere").status_code == 204
    error_of(laptop.get("/v1/chats"), 401)
    error_of(other.get("/v1/chats"), 401)


def test_a_failing_store_keeps_people_signed_in_and_says_so(tmp_path: Path) -> None:
    people = People(Database(tmp_path / "state"), hasher=Hasher(n=2**10))
    with serving(people=people) as client:
        fay = join(client, "Fay", 50)
        assert fay.get("/auth/me").json()["store"]["saving"] is True
        assert people.db is not None
        people.db.close()  # every statement fails from here on, as on a corrupt or vanished file
        assert fay.send("POST", CHAT, {"messages": USER}).status_code == 200  # the chat goes on
        err = error_of(fay.send("POST", "/v1/chats", {"title": "t", "messages": []}), 503)
        assert err["code"] == "store_unavailable" and "not saved" in err["message"]
        me = fay.get("/auth/me").json()
        assert me["person"]["name"] == "Fay" and me["store"]["saving"] is False


def test_open_mode_has_no_people(tmp_path: Path) -> None:
    with serving() as client:
        assert client.get("/auth/me").json() == {"mode": "open"}
        assert error_of(client.get("/v1/chats"), 404)["code"] == "people_mode_off"
        assert error_of(client.post("/auth/signin", json={"name": "a", "password": "b"}), 404)["code"] == \
            "people_mode_off"




def test_a_signing_in_proxy_names_the_person_from_trusted_proxies_only(tmp_path: Path) -> None:
    people = People(Database(tmp_path / "state"), hasher=Hasher(n=2**10), signin_header="x-forwarded-user")
    assert people.accounts is not None
    people.accounts.add("Gus")
    app = build(lambda: FakeModel(reply="hello"), people=people, trusted=("10.9.9.9",))
    with TestClient(app, base_url="http://localhost", client=("10.9.9.9", 5000)) as client:
        named = {"x-forwarded-user": "gus", "x-forwarded-for": "10.0.0.77"}
        assert client.get("/auth/me", headers=named).json()["person"]["name"] == "Gus"
        assert client.get("/v1/chats", headers=named).status_code == 200
        error_of(client.get("/v1/chats", headers={"x-forwarded-user": "nobody"}), 401)
        # Not from a trusted proxy: the header is the client's own words.
        error_of(client.get("/v1/chats", headers={**named, **user(3)}), 401)
    # Off unless signin_header names it: a proxy that passes a client's copy on is the usual case.
    people.signin_header = ""
    with TestClient(build(lambda: FakeModel(reply="hello"), people=people, trusted=("10.9.9.9",)),
                    base_url="http://localhost", client=("10.9.9.9", 5000)) as client:
        error_of(client.get("/v1/chats", headers=named), 401)


def test_chats_nobody_touched_for_the_retention_are_deleted_at_most_hourly(tmp_path: Path) -> None:
    from helpers.fakes import FakeClock
    from helpers.polling import wait_until

    from appliance.people.chats import Chats

    clock = FakeClock(1_800_000_000.0)
    db = Database(tmp_path / "state")
    people = People(db, retention_days=30, hasher=Hasher(n=2**10), chats=Chats(db, clock=clock))
    assert people.accounts is not None and people.chats is not None
    pid = people.accounts.add("Hal")[0].id
    people.chats.put(pid, "old-chat-0000000001", "old", [])
    clock.advance(31 * 86400)
    people.chats.put(pid, "new-chat-0000000001", "new", [])
    people.prune_due(now=0.0)
    wait_until(lambda: [c["id"] for c in people.chats.listed(pid)] == ["new-chat-0000000001"] or None, 5,
               "the old chat to go")
    clock.advance(31 * 86400)
    people.prune_due(now=10.0)  # within the hour: not again
    assert len(people.chats.listed(pid)) == 1


def test_text_a_store_cannot_keep_and_floods_of_sign_ins_are_clear_4xx(client: TestClient, people: People,
                                                                          ann: Person) -> None:
    for bad in ('{"name": "\\ud800", "password": "x"}', '{"name": "a\\u0000b", "password": "x"}'):
        r = client.post("/auth/signin", content=bad, headers={"content-type": "application/json", **user(60)})
        assert error_of(r, 400)["param"] == "name"
    error_of(client.post("/auth/signin", json={"name": "n" * 300, "password": "x"}, headers=user(60)), 400)
    lone = '{"title": "t", "messages": [{"role": "user", "content": "\\udfff"}]}'
    r = ann.c.put("/v1/chats/surrogate-chat-00001", content=lone, headers={**ann.h(), "content-type": "application/json"})
    error_of(r, 400)
    error_of(ann.send("PUT", "/v1/chats/nul-chat-0000000001", {"title": "a\x00b", "messages": []}), 400)
    assert ann.send("PUT", "/v1/chats/meta-chat-000000001", {"messages": [], "meta": {"x": "\x00"}}).status_code == 200
    gate = threading.Event()  # sixteen sign-ins on the hash thread: one hashing (held here), fifteen queued
    assert client.portal is not None
    held = [client.portal.start_task_soon(people.hashing().run, gate.wait) for _ in range(16)]
    try:
        wait_until(lambda: people.hash_worker.health().depth == 16, what="sixteen sign-ins at the hash thread")
        r = client.post("/auth/signin", json={"name": "Ann", "password": PASSWORD}, headers=user(61))
        assert error_of(r, 429)["code"] == "signin_busy" and r.headers["retry-after"] == "2"
    finally:
        gate.set()
    assert all(f.result() for f in held)


def test_disabling_a_person_drops_their_pending_invite(client: TestClient) -> None:
    token = invite(client, "Ivy")
    pid = next(p["id"] for p in client.get("/admin/people").json()["people"] if p["name"] == "Ivy")
    client.patch(f"/admin/people/{pid}", json={"disabled": True})
    client.patch(f"/admin/people/{pid}", json={"disabled": False})
    error_of(client.post("/auth/invite", json={"token": token}), 404)


def test_a_stale_device_cannot_overwrite_a_newer_turn(ann: Person) -> None:
    one = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "one"}]
    saved = ann.send("PUT", "/v1/chats/two-devices-chat-01", {"title": "t", "messages": one}).json()
    two = one + [{"role": "user", "content": "second"}, {"role": "assistant", "content": "two"}]
    phone = ann.send("PUT", "/v1/chats/two-devices-chat-01", {"title": "t", "messages": two, "base": saved["updated"]})
    assert phone.status_code == 200
    # The desktop still holds the first version: its save is refused, the phone's turn stays.
    stale = ann.send("PUT", "/v1/chats/two-devices-chat-01", {"title": "t", "messages": one, "base": saved["updated"]})
    assert error_of(stale, 409)["code"] == "chat_changed"
    assert len(ann.get("/v1/chats/two-devices-chat-01").json()["messages"]) == 4
    error_of(ann.send("PUT", "/v1/chats/two-devices-chat-01", {"messages": one, "base": "yesterday"}), 400)
