#!/usr/bin/env python3
"""How close the library comes to answerable and unanswerable questions (the evaluation
set's), in this process on the real embedding model: each question searched as a chat
searches it, its closeness (library/grounding.py: the nearest passage's cosine, for English;
the share of its words one passage holds) printed, then both kinds of error at the
thresholds chosen and around them: answerable questions the server would refuse ("the
library does not say"), and unanswerable ones it would let the model answer. Then the
attribution of an answer that holds the fact (its answer_contains, citing [1]) to the
sources a chat would be given: how many such answers would be flagged as unsupported.

    PYTHONPATH=$PWD .venv/bin/python bench/library/grounding.py [--set bench/library/eval/set.json] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from appliance.library import grounding
from appliance.library.about import astray
from appliance.library.attribute import Verdict, attribute
from appliance.library.grounding import Closeness, closeness

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "bench" / "library" / "eval" / "set.json"
SEARCHED = 12  # passages a chat searches (top_k 4 x retrieval.CANDIDATES 3)
GIVEN = 4  # passages a chat is given at most (top_k)
NEARS = (0.0, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 2.0)
WORDS = (0.0, 0.3, 0.4, 0.5, 0.55, 0.6, 2.0)
UNREAD = (0.0, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4)


async def search_all(data: dict[str, Any]) -> list[dict[str, Any]]:
    from appliance.documents.reader import DocumentReader
    from appliance.library.embedder import EmbedService
    from appliance.library.library import Library
    from appliance.library.store import OFFICE, LibraryStore
    from appliance.model.embedding import embedding_model_path

    service = EmbedService(embedding_model_path(fetch=False))
    service.start()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lib = Library(LibraryStore(Path(tmp)), DocumentReader(), service.embed, service.embed_sync,
                      unknown_share=service.unknown_share)
        lib.start()
        ids = {}
        for d in data["documents"]:
            row = await lib.add(OFFICE, "eval", d["id"] + ".txt", "text/plain", "\f".join(d["pages"]).encode(), d["title"])
            ids[row.id] = d["id"]
        while any(r.status == "indexing" for r in lib.documents([OFFICE])):
            await asyncio.sleep(0.05)
        for q in data["questions"]:
            found = await lib.search([OFFICE], q["question"], SEARCHED, sys.maxsize)
            gold = (q.get("doc"), q.get("page"))
            rows.append({"id": q["id"], "lang": q["lang"], "kind": kind(q), "question": q["question"],
                         "close": closeness([q["question"]], found),
                         "gold_given": any((ids[f.doc], f.page) == gold for f in found[:GIVEN]),
                         "given": [f.text for f in found[:GIVEN]], "facts": q.get("answer_contains", [])})
        lib.stop()
    service.stop()
    return rows


def kind(q: dict[str, Any]) -> str:
    return "unanswerable" if q.get("unanswerable") else "cross" if q.get("cross") else "answerable"


def errors(rows: list[dict[str, Any]], near: float, words: float, unread: float) -> tuple[int, int, int, int]:
    """(answerable refused, of; unanswerable answered, of) at these thresholds; cross-language
    questions counted with the answerable."""
    ok = [r for r in rows if r["kind"] != "unanswerable"]
    no = [r for r in rows if r["kind"] == "unanswerable"]
    refused = sum(not r["close"].close(near, words, unread) for r in ok)
    answered = sum(r["close"].close(near, words, unread) for r in no)
    return refused, len(ok), answered, len(no)


def flagged(rows: list[dict[str, Any]]) -> list[str]:
    """Answerable questions whose gold page is given, answered with the fact, that the
    attribution would call unsupported (or about.py astray: from passages not about the question)."""
    out = []
    for r in rows:
        if r["kind"] == "unanswerable" or not r["gold_given"]:
            continue
        answer = "It is " + " and ".join(r["facts"]) + " [1]."
        got, _ = attribute(answer, r["given"], r["question"])
        if got.verdict is Verdict.UNSUPPORTED or astray(r["question"], answer, r["given"]):
            out.append(r["id"])
    return out


def show(c: Closeness) -> str:
    return f"near {c.near:.3f}" if c.near is not None else "near   -  "


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    for r in rows:
        c = r["close"]
        print(f"{r['id']:>9} {r['lang']} {r['kind']:<12} {show(c)} words {c.words:.2f} "
              f"{'close' if c.close() else 'FAR  '} {r['question'][:60]}")
    read = [r for r in rows if r["close"].near is not None]
    print("\nread by meaning: answerable refused / unanswerable answered (near rows, words columns)")
    print("near\\words " + " ".join(f"{w:>11}" for w in WORDS))
    for n in NEARS:
        cells = []
        for w in WORDS:
            a, na, u, nu = errors(read, n, w, 0.0)
            cells.append(f"{a:>2}/{na} {u:>2}/{nu}")
        print(f"{n:>10} " + " ".join(f"{c:>11}" for c in cells))
    unread = [r for r in rows if r["close"].near is None]
    print("\nnot read by meaning (words alone): " + "  ".join(
        f"{w}: {e[0]}/{e[1]} {e[2]}/{e[3]}" for w in UNREAD if (e := errors(unread, 0, 0, w))))
    a, na, u, nu = errors(rows, grounding.NEAR, grounding.WORDS, grounding.WORDS_UNREAD)
    wrongly = flagged(rows)
    summary = {"near": grounding.NEAR, "words": grounding.WORDS, "words_unread": grounding.WORDS_UNREAD,
               "answerable_refused": f"{a}/{na}",
               "unanswerable_answered": f"{u}/{nu}",
               "refused": [r["id"] for r in rows if r["kind"] != "unanswerable" and not r["close"].close()],
               "answered": [r["id"] for r in rows if r["kind"] == "unanswerable" and r["close"].close()],
               "fact_answers_flagged_unsupported": wrongly,
               "fact_answers_checked": sum(r["kind"] != "unanswerable" and r["gold_given"] for r in rows)}
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", type=Path, default=SET)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = asyncio.run(search_all(json.loads(args.set.read_text(encoding="utf-8"))))
    summary = report(rows)
    print(json.dumps(summary, ensure_ascii=False, indent=1))
    if args.json:
        plain = [{**r, "close": {"near": r["close"].near, "words": r["close"].words}, "given": len(r["given"])}
                 for r in rows]
        args.json.write_text(json.dumps({"summary": summary, "rows": plain}, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
