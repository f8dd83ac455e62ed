"""A Chinese question finds an English passage on the real models (issue 49): the chat model
puts the question into English (http/translate.py), and the library searches both."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from helpers.live import Live
from helpers.polling import wait_until

pytestmark = pytest.mark.integration
SET = Path(__file__).resolve().parents[2] / "bench" / "library" / "eval" / "set.json"
QUESTION = "在伦敦出差住酒店，每晚最多可以报销多少？"  # the English travel policy, page 3: £160 a night


def test_a_chinese_question_is_answered_from_an_english_document(server: Live) -> None:
    travel = next(d for d in json.loads(SET.read_text(encoding="utf-8"))["documents"] if d["id"] == "travel-en")
    http = httpx.Client(base_url=server.url, timeout=120, trust_env=False)
    r = http.post("/admin/library", params={"title": travel["title"]}, content="\f".join(travel["pages"]).encode(),
                  headers={"content-type": "text/plain", "x-file-name": "travel.txt"})
    assert r.status_code == 202, r.text
    path = f"/v1/library/{r.json()['id']}"
    try:
        wait_until(lambda: http.get(path).json()["status"] != "indexing", 300, "the indexer", every=0.2)
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}],
                                                    "max_tokens": 8, "temperature": 0, "library": True})
        assert r.status_code == 200, r.text
        sources = r.json()["sources"]
        assert any(s["title"] == travel["title"] and s["page"] == 3 for s in sources[:3]), sources
        assert "160" in " ".join(s["text"] for s in sources[:3])
        assert "question was not translated" not in server.log()  # found through the translation, not by luck
    finally:
        assert http.delete(path.replace("/v1/", "/admin/")).status_code == 204
