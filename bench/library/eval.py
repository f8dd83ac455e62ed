#!/usr/bin/env python3
"""The library's evaluation set (bench/library/eval/set.json: invented office documents and
questions, English and Chinese, each answered on one page), measured two ways.

  retrieval: in this process, on the real embedding model: each document added as text (its
             pages parted by form feeds), indexing timed (pages a minute), then hit@1 and
             hit@3 (a passage of the answer's page among the first 1 or 3) for words alone,
             meaning alone, and both fused (what chats use).
  answers:   against a running appliance (--url): the documents added through /admin/library,
             each question asked with "library": true and without, at temperature 0: hit@k
             from the `sources` the server sent, whether the answer holds the fact, and the
             first token's time; then, for a few questions, the whole document attached
             instead, for the first token's time beside the library's.

    .venv/bin/python bench/library/eval.py retrieval --json out/retrieval.json
    .venv/bin/python bench/library/eval.py answers --url http://127.0.0.1:18401 --json out/answers.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "bench" / "library" / "eval" / "set.json"
WAYS = {"words": ("words",), "meaning": ("meaning",), "fused": ("words", "meaning")}


def load() -> dict[str, Any]:
    return json.loads(SET.read_text(encoding="utf-8"))


def as_text(doc: dict[str, Any]) -> bytes:
    return "\f".join(doc["pages"]).encode("utf-8")


def hit(found: list[tuple[str, int | None]], q: dict[str, Any], k: int) -> bool:
    return any(title == q["doc"] and page == q["page"] for title, page in found[:k])


def holds(q: dict[str, Any], text: str) -> bool:
    """The answer holds the fact: every answer_contains string, case aside."""
    return all(a.lower() in text.lower() for a in q["answer_contains"])


def rates(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    out = {}
    for lang in ("en", "zh", "all"):
        sel = [r[key] for r in rows if lang == "all" or r["lang"] == lang]
        out[lang] = round(sum(sel) / len(sel), 3) if sel else 0.0
    return out


async def retrieval() -> dict[str, Any]:
    from appliance.documents.reader import DocumentReader
    from appliance.library.embedder import EmbedService
    from appliance.library.library import Library, LibraryLimits
    from appliance.library.store import OFFICE, LibraryStore
    from appliance.model.embedding import embedding_model_path

    data = load()
    service = EmbedService(embedding_model_path(fetch=False))
    service.start()
    with tempfile.TemporaryDirectory() as tmp:
        weight = os.environ.get("MEANING_WEIGHT")  # the default's, unless asked to compare
        limits = LibraryLimits(meaning_weight=float(weight)) if weight else LibraryLimits()
        lib = Library(LibraryStore(Path(tmp)), DocumentReader(), service.embed, service.embed_sync, limits,
                      unknown_share=service.unknown_share)
        lib.start()
        ids: dict[str, str] = {}
        pages = sum(len(d["pages"]) for d in data["documents"])
        t0 = time.perf_counter()
        for d in data["documents"]:
            row = await lib.add(OFFICE, "eval", d["id"] + ".txt", "text/plain", as_text(d), d["title"])
            ids[row.id] = d["id"]
        while any(r.status == "indexing" for r in lib.documents([OFFICE])):
            await asyncio.sleep(0.05)
        index_s = time.perf_counter() - t0
        rows = []
        for q in data["questions"]:
            row: dict[str, Any] = {"id": q["id"], "lang": q["lang"]}
            for name, ways in WAYS.items():
                found = await lib.search([OFFICE], q["question"], top_k=3, budget=10**9, ways=ways)
                got = [(ids[f.doc], f.page) for f in found]
                row[f"{name}@1"], row[f"{name}@3"] = hit(got, q, 1), hit(got, q, 3)
            rows.append(row)
        passages = sum(r.passages for r in lib.documents([OFFICE]))
        lib.stop()
    service.stop()
    summary = {f"{name}@{k}": rates(rows, f"{name}@{k}") for name in WAYS for k in (1, 3)}
    return {"questions": len(rows), "documents": len(ids), "pages": pages, "passages": passages,
            "index_s": round(index_s, 1), "pages_per_minute": round(pages / index_s * 60), "summary": summary,
            "rows": rows}


def ask(client: httpx.Client, content: str, library: bool, max_tokens: int = 96) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], "stream": True, "temperature": 0,
            "max_tokens": max_tokens, "library": library}
    t0, first, text, sources = time.perf_counter(), None, [], []
    with client.stream("POST", "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for raw in r.iter_lines():
            if not raw.startswith("data: ") or raw == "data: [DONE]":
                continue
            chunk = json.loads(raw[6:])
            sources = chunk.get("sources", sources)
            for c in chunk.get("choices", []):
                piece = (c.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - t0
                text.append(piece)
    return {"text": "".join(text), "ttft": first, "sources": sources}


def add_all(client: httpx.Client, data: dict[str, Any]) -> dict[str, str]:
    ids = {}
    for d in data["documents"]:
        r = client.post("/admin/library", content=as_text(d), params={"title": d["title"]},
                        headers={"Content-Type": "text/plain", "X-File-Name": d["id"] + ".txt"})
        r.raise_for_status()
        ids[r.json()["id"]] = d["id"]
    while any(doc["status"] == "indexing" for doc in client.get("/admin/library").json()["data"]):
        time.sleep(0.5)
    return ids


def attach_whole(client: httpx.Client, data: dict[str, Any], most: int) -> list[dict[str, Any]]:
    """The first question of each document (so that no two share a cached prefix), asked with
    the whole document in the message instead of the library."""
    docs, firsts = {d["id"]: d for d in data["documents"]}, {}
    for q in data["questions"]:
        firsts.setdefault(q["doc"], q)
    out = []
    for q in list(firsts.values())[:most]:
        doc = docs[q["doc"]]
        content = f"{doc['title']}\n\n" + "\n\n".join(doc["pages"]) + f"\n\nQuestion: {q['question']}"
        r, lib = ask(client, content, False), ask(client, q["question"], True)
        out.append({"id": q["id"], "ttft": r["ttft"], "has_fact": holds(q, r["text"]), "library_ttft": lib["ttft"],
                    "library_has_fact": holds(q, lib["text"])})
        print(json.dumps(out[-1], ensure_ascii=False), file=sys.stderr)
    return out


def attached_only(url: str, whole: int) -> dict[str, Any]:
    out = attach_whole(httpx.Client(base_url=url, timeout=600), load(), whole)
    def median(key: str) -> float | None:
        got = [r[key] for r in out if r[key] is not None]
        return round(statistics.median(got), 2) if got else None
    return {"summary": {"ttft_attached_median_s": median("ttft"), "ttft_library_median_s": median("library_ttft"),
                        "attached_has_fact": round(sum(r["has_fact"] for r in out) / len(out), 3),
                        "library_has_fact": round(sum(r["library_has_fact"] for r in out) / len(out), 3)},
            "attached": out}


def answers(url: str, whole: int) -> dict[str, Any]:
    data = load()
    client = httpx.Client(base_url=url, timeout=600)
    ids = add_all(client, data)
    rows = []
    for q in data["questions"]:
        lib, bare = ask(client, q["question"], True), ask(client, q["question"], False)
        got = [(ids.get(s["document"], ""), s["page"]) for s in lib["sources"]]
        rows.append({"id": q["id"], "lang": q["lang"], "hit@1": hit(got, q, 1), "hit@3": hit(got, q, 3),
                     "library_has_fact": holds(q, lib["text"]), "bare_has_fact": holds(q, bare["text"]),
                     "library_ttft": lib["ttft"], "answer": lib["text"][:300]})
        print(json.dumps(rows[-1], ensure_ascii=False), file=sys.stderr)
    attached = attach_whole(client, data, whole)
    lib_ttft = [r["library_ttft"] for r in rows if r["library_ttft"] is not None]
    att_ttft = [r["ttft"] for r in attached if r["ttft"] is not None]
    summary = {key: rates(rows, key) for key in ("hit@1", "hit@3", "library_has_fact", "bare_has_fact")}
    summary["ttft_library_median_s"] = round(statistics.median(lib_ttft), 2) if lib_ttft else None
    summary["ttft_attached_median_s"] = round(statistics.median(att_ttft), 2) if att_ttft else None
    summary["attached_has_fact"] = round(sum(r["has_fact"] for r in attached) / len(attached), 3) if attached else None
    return {"questions": len(rows), "summary": summary, "rows": rows, "attached": attached}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("retrieval", "answers", "attached"))
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--whole", type=int, default=8, help="questions asked again with the whole document attached")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.mode == "retrieval":
        result = asyncio.run(retrieval())
    else:
        result = (answers if args.mode == "answers" else attached_only)(args.url, args.whole)
    text = json.dumps(result, ensure_ascii=False, indent=1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text, encoding="utf-8")
    print(json.dumps(result["summary"], ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
