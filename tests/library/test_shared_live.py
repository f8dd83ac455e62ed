"""The library on every box (database_url): two real appliances on one PostgreSQL behind
Debian's nginx. A handbook the operator adds on box A is cited by a chat on box B; a person's
own document added on box A is cited by her chat on box B, and never by another person's
(docs/SCALE-OUT.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.documents import pdf_bytes
from helpers.embedding import HANDBOOK
from helpers.live import Live
from helpers.nginx import NGINX, Nginx, two_boxes
from helpers.polling import wait_until
from helpers.postgres import INSTALL, cluster, pg_bin

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)"),
              pytest.mark.skipif(pg_bin() is None, reason=f"no PostgreSQL server: {INSTALL}")]

SECRET = b"Codename Bluefinch: the spare office key is in the blue tin on shelf four."


@pytest.fixture
def boxes(bundled_model: Path, tmp_path: Path) -> Iterator[tuple[list[Live], Nginx]]:
    with cluster() as url, two_boxes(bundled_model, tmp_path, auth="people", database_url=url,
                                     library_sync_s=0.5) as boxes:
        yield boxes


def person(a: Live, b: Live, name: str) -> dict[str, str]:
    """Added by the operator on box A, her invite taken on box B: her cookie and CSRF token."""
    r = a.client.post("/admin/people", json={"name": name})
    assert r.status_code == 201, r.text
    token = r.json()["invite_url"].rsplit("=", 1)[1]
    r = httpx.post(f"{b.url}/auth/invite/accept", json={"token": token, "password": f"{name}'s long password"},
                   trust_env=False)
    assert r.status_code == 200, r.text
    return {"cookie": r.headers["set-cookie"].split(";")[0], "x-csrf-token": r.json()["csrf"]}


def cited(box: Live, who: dict[str, str], question: str) -> list[str]:
    """The documents a chat with the library on `box` names among its sources."""
    r = httpx.post(f"{box.url}/v1/chat/completions", headers=who, timeout=300, trust_env=False,
                   json={"messages": [{"role": "user", "content": question}], "max_tokens": 8, "temperature": 0,
                         "library": True})
    assert r.status_code == 200, r.text
    return [s["document"] for s in r.json().get("sources", [])]


def ready(box: Live, path: str, doc: str, who: dict[str, str] | None = None) -> dict[str, Any] | None:
    r = httpx.get(f"{box.url}{path}", headers=who or {}, trust_env=False, timeout=30)
    assert r.status_code == 200, r.text
    return next((d for d in r.json()["data"] if d["id"] == doc and d["status"] == "ready"), None)


def test_a_document_added_on_one_box_is_cited_on_the_other(boxes: tuple[list[Live], Nginx]) -> None:
    (a, b), _ = boxes
    ann, ben = person(a, b, "Ann"), person(a, b, "Ben")
    r = a.client.post("/admin/library", params={"title": "Office handbook"}, content=pdf_bytes(HANDBOOK),
                      headers={"content-type": "application/pdf", "x-file-name": "handbook.pdf"})
    assert r.status_code == 202, r.text
    handbook = r.json()["id"]
    r = httpx.post(f"{a.url}/v1/library", headers={**ann, "x-file-name": "notes.txt", "content-type": "text/plain"},
                   content=SECRET, trust_env=False, timeout=60)
    assert r.status_code == 202, r.text
    own = r.json()["id"]

    # Box B lists both once box A has embedded them (B computes nothing: it takes A's).
    doc = wait_until(lambda: ready(b, "/admin/library", handbook), 300, "the handbook ready on box B", every=0.2)
    assert doc["pages"] == 10 and doc["indexed"] == doc["passages"]
    wait_until(lambda: ready(b, "/v1/library", own, ann), 300, "Ann's notes ready on box B", every=0.2)

    assert handbook in cited(b, ben, "Where is the emergency assembly point?")
    assert own in cited(b, ann, "Where is the spare office key, codename Bluefinch?")
    assert own not in cited(b, ben, "Where is the spare office key, codename Bluefinch?")
    r = httpx.get(f"{b.url}/v1/library/{own}", headers=ben, trust_env=False)
    assert r.status_code == 404

    # Deleted on box B, it is gone from box A too.
    assert b.client.delete(f"/admin/library/{handbook}").status_code == 204
    wait_until(lambda: handbook not in [d["id"] for d in a.client.get("/admin/library").json()["data"]], 60,
               "the handbook gone from box A", every=0.2)
