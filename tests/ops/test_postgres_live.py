"""Two real appliances on one PostgreSQL (database_url), behind Debian's nginx: a person
added on one box signs in on the other; a chat begun on one box is listed and continued on
the other; their daily quota counts what they used on both (docs/SCALE-OUT.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.live import Live
from helpers.nginx import NGINX, Nginx, two_boxes
from helpers.polling import wait_until
from helpers.postgres import INSTALL, cluster, pg_bin

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)"),
              pytest.mark.skipif(pg_bin() is None, reason=f"no PostgreSQL server: {INSTALL}")]

QUOTA = 24  # generated tokens a day: one 16-token answer on each box passes it
PASSWORD = "ann's long password"
CHAT_ID = "chat-on-two-boxes-0001"


@pytest.fixture
def boxes(bundled_model: Path, tmp_path: Path) -> Iterator[tuple[list[Live], Nginx]]:
    with cluster() as url, two_boxes(bundled_model, tmp_path, auth="people", database_url=url) as boxes:
        yield boxes


def signed_in(r: httpx.Response) -> dict[str, str]:
    assert r.status_code == 200, r.text
    cookie = r.headers["set-cookie"].split(";")[0]
    return {"cookie": cookie, "x-csrf-token": r.json()["csrf"]}


def ask(box: Live, who: dict[str, str], messages: list[dict[str, str]]) -> httpx.Response:
    return httpx.post(f"{box.url}/v1/chat/completions", headers={**who, "x-session-id": CHAT_ID}, timeout=120,
                      json={"messages": messages, "max_tokens": 16, "temperature": 0}, trust_env=False)


def test_people_chats_and_quota_are_the_same_on_both_boxes(boxes: tuple[list[Live], Nginx]) -> None:
    (a, b), ngx = boxes
    # The operator adds Ann on box A; she takes her invite on box B.
    r = a.client.post("/admin/people", json={"name": "Ann", "quota": QUOTA})
    assert r.status_code == 201, r.text
    token = r.json()["invite_url"].rsplit("=", 1)[1]
    ann = signed_in(httpx.post(f"{b.url}/auth/invite/accept", json={"token": token, "password": PASSWORD},
                               trust_env=False))

    # A chat begun on box A...
    first: list[dict[str, Any]] = [{"role": "user", "content": "Count from one to fifty in words."}]
    r = ask(a, ann, first)
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]["message"]["content"]
    used_a = r.json()["usage"]["completion_tokens"]
    assert used_a < QUOTA
    saved = first + [{"role": "assistant", "content": answer}]
    r = httpx.put(f"{a.url}/v1/chats/{CHAT_ID}", headers=ann, json={"title": "Counting", "messages": saved},
                  trust_env=False)
    assert r.status_code == 200, r.text

    # ...is listed on box B and continued there.
    r = httpx.get(f"{b.url}/v1/chats", headers=ann, trust_env=False)
    assert [c["id"] for c in r.json()["chats"]] == [CHAT_ID]
    chat = httpx.get(f"{b.url}/v1/chats/{CHAT_ID}", headers=ann, trust_env=False).json()
    assert [m["content"] for m in chat["messages"]] == [first[0]["content"], answer]
    r = ask(b, ann, [*saved, {"role": "user", "content": "Now count backwards."}])
    assert r.status_code == 200, r.text
    assert used_a + r.json()["usage"]["completion_tokens"] >= QUOTA

    # Box A served her 16 tokens only, and still refuses her: it counts box B's (read back within a second).
    def refused(box: Live) -> dict[str, Any] | None:
        r = ask(box, ann, [{"role": "user", "content": "hi"}])
        return r.json() if r.status_code == 429 else None

    for box in (a, b):
        err = wait_until(lambda box=box: refused(box), 30, "the quota to count both boxes", every=0.5)  # type: ignore[misc]
        assert err["error"]["code"] == "quota_exceeded"

    # Through nginx: signed in once, her chat is there whichever box answers.
    via = signed_in(httpx.post(f"{ngx.url}/auth/signin", json={"name": "ann", "password": PASSWORD},
                               trust_env=False))
    r = httpx.get(f"{ngx.url}/v1/chats", headers=via, trust_env=False)
    assert r.status_code == 200 and [c["id"] for c in r.json()["chats"]] == [CHAT_ID]
    people = a.client.get("/admin/people").json()["people"]
    assert [(p["name"], p["chats"], p["sessions"]) for p in people] == [("Ann", 1, 2)]
