"""The library and the embeddings endpoints on the real models over a real socket: the
`openai` SDK's embeddings.create and the `ollama` client's embed unchanged, scoring similar
sentences above unrelated ones in English and Chinese; a handbook added as a PDF in
/admin/library, found and cited at its page by a chat that asks for the library."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest
from helpers.documents import pdf_bytes
from helpers.live import Live
from helpers.polling import wait_until

pytestmark = pytest.mark.integration
SET = Path(__file__).resolve().parents[2] / "bench" / "library" / "eval" / "set.json"
PAIRS = [("The printer on the second floor is out of paper.", "There is no paper left in the upstairs printer.",
          "Our quarterly revenue grew by eight percent."),
         ("会议定在下周三上午十点。", "下周三上午十点开会。", "今年的年假是十五天。")]


def cos(a: Any, b: Any) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_openai_sdk_embeds_unchanged(server: Live) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    for a, b, far in PAIRS:
        got = client.embeddings.create(model="text-embedding-3-small", input=[a, b, far])
        vecs = [d.embedding for d in got.data]
        assert len(vecs) == 3 and len(vecs[0]) == 384 and got.usage.prompt_tokens > 0
        assert abs(np.linalg.norm(vecs[0]) - 1) < 1e-3  # unit length, as OpenAI's are
        assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2]) + 0.1, (a, cos(vecs[0], vecs[1]), cos(vecs[0], vecs[2]))
    # Asked for base64 (the SDK asks for it by itself and decodes it when given no format), the
    # same vector as little-endian floats.
    raw = client.embeddings.create(model="m", input=PAIRS[0][0], encoding_format="base64").data[0].embedding
    one = np.frombuffer(base64.b64decode(raw), "<f4") if isinstance(raw, str) else np.asarray(raw)
    assert cos(one, client.embeddings.create(model="m", input=PAIRS[0][0]).data[0].embedding) > 0.9999


def test_the_ollama_client_embeds_unchanged(server: Live) -> None:
    client = ollama.Client(host=server.url, trust_env=False)
    for a, b, far in PAIRS:
        got = client.embed(model="all-minilm", input=[a, b, far])
        assert len(got.embeddings) == 3 and got.prompt_eval_count
        e = got.embeddings
        assert cos(e[0], e[1]) > cos(e[0], e[2]) + 0.1
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model="all-minilm", input=[])
    assert err.value.status_code == 400


def test_a_handbook_pdf_is_cited_at_its_page(server: Live) -> None:
    data = json.loads(SET.read_text(encoding="utf-8"))
    handbook = next(d for d in data["documents"] if d["id"] == "handbook-en")
    http = httpx.Client(base_url=server.url, timeout=120, trust_env=False)
    r = http.post("/admin/library", params={"title": handbook["title"]}, content=pdf_bytes(handbook["pages"]),
                  headers={"content-type": "application/pdf", "x-file-name": "handbook.pdf"})
    assert r.status_code == 202, r.text
    doc = r.json()
    assert doc["pages"] == 10 and doc["status"] == "indexing" and doc["passages"] >= 10
    path = f"/v1/library/{doc['id']}"
    doc = wait_until(lambda: (d := http.get(path).json())["status"] != "indexing" and d, 300, "the indexer", every=0.2)
    assert doc["status"] == "ready" and doc["indexed"] == doc["passages"]

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    q = next(q for q in data["questions"] if q["id"] == "q-browser")
    answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": q["question"]}],
                                            max_tokens=64, temperature=0, extra_body={"library": True})
    sources = answer.model_extra["sources"]
    assert sources[0]["title"] == handbook["title"] and sources[0]["page"] == 7, sources
    assert "Linden" in sources[0]["text"] and answer.choices[0].message.content
    # Without the switch, nothing of the library: the same question is a plain chat.
    bare = client.chat.completions.create(model="m", messages=[{"role": "user", "content": q["question"]}],
                                          max_tokens=8, temperature=0)
    assert "sources" not in (bare.model_extra or {})
    assert http.delete(f"/admin/library/{doc['id']}").status_code == 204
