#!/usr/bin/env python3
"""The library's evaluation set (bench/library/eval/set.json: invented office documents and
questions, English and Chinese; see its "about"), measured two ways. Every figure is given by
kind (same-language, cross-language, table, unanswerable: bench/library/scoring.py) and
language.

  retrieval: in this process, on the real embedding model: each document added as text (its
             pages parted by form feeds), indexing timed (pages a minute), then hit@1 and
             hit@3 (a passage of the answer's page among the first 1 or 3) for words alone,
             meaning alone, and both fused (what chats use); unanswerable questions have no
             page and count in no hit rate.
  answers:   against a running appliance (--url; the library's admin routes answer loopback):
             the documents added through /admin/library (a table document as PDF or DOCX
             when a builder is at hand, else as text), each question asked with "library":
             true at temperature 0, and each answerable one again with its whole document
             pasted in the message instead (the baseline: a person pasting the file). Per
             answer: hit@k from the `sources` the server sent, whether it holds the fact,
             whether its citation names the right document (the server's attribution, else
             the [n] the model wrote), whether it says the library does not say (right for an
             unanswerable question, an error for an answerable one), and the first token's
             time (with the whole document: over all, and over the first question of each
             document, whose prefix no earlier question warmed).
  attached:  `answers` for the first answerable question of each document only.

    .venv/bin/python bench/library/eval.py retrieval --json out/retrieval.json
    .venv/bin/python bench/library/eval.py answers --url http://127.0.0.1:18401 --json out/answers.json
    .venv/bin/python bench/library/eval.py answers --url ... --only table,unanswerable --phases library
    .venv/bin/python bench/library/eval.py summary --lines out/library.jsonl out/attached.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import scoring

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "bench" / "library" / "eval" / "set.json"
WAYS = {"words": ("words",), "meaning": ("meaning",), "fused": ("words", "meaning")}
RATES = ("hit@1", "hit@3", "has_fact", "model_has_fact", "quoted", "attached_has_fact", "bare_has_fact",
         "cite_right", "answer_cite_right", "cite_wrong", "cited_any", "refused")
TIMES = ("ttft", "attached_ttft", "attached_ttft_cold")


def load() -> dict[str, Any]:
    return dict(json.loads(SET.read_text(encoding="utf-8")))


def as_text(doc: dict[str, Any]) -> bytes:
    return "\f".join(doc["pages"]).encode("utf-8")


def blocks(page: str) -> list[str | list[list[str]]]:
    """A table document's page as the office_files builder takes it: runs of `a | b | c` lines
    become a table (rows of cells, the first the header), the rest stays text."""
    out: list[str | list[list[str]]] = []
    for is_row, run in itertools.groupby(page.split("\n"), key=lambda line: " | " in line):
        lines = list(run)
        out.append([line.split(" | ") for line in lines] if is_row else "\n".join(lines))
    return [b for b in out if b]


def builders(helpers: Path) -> dict[str, Callable[[dict[str, Any]], bytes]]:
    """The table documents' builders by format, from the tests folder `helpers` when its
    helpers/documents.py has them (none: every document goes as text): a PDF laid out at x,y
    with its tables' cells drawn column by column, as some writers do and as the PDF issue 49
    reports lost its rows with (plain extraction gives a cell a line), and a DOCX with real
    tables. The set's first page starts with the title, which the builders set apart."""
    sys.path.insert(0, str(helpers))
    try:
        from helpers.documents import laid_out_pdf, office_docx  # type: ignore[attr-defined]
    except ImportError:
        return {}

    def parts(doc: dict[str, Any]) -> tuple[str, list[Any]]:
        first, _, rest = doc["pages"][0].partition("\n")
        pages = [rest if first.startswith(doc["title"]) else doc["pages"][0], *doc["pages"][1:]]
        return first, [blocks(p) for p in pages]

    return {"pdf": lambda doc: bytes(laid_out_pdf(*parts(doc), by_column=True)),
            "docx": lambda doc: bytes(office_docx(*parts(doc)))}


CONTENT_TYPES = {"pdf": "application/pdf",
                 "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}


def payload(doc: dict[str, Any], built: dict[str, Callable[[dict[str, Any]], bytes]]) -> tuple[str, str, bytes]:
    """A document's file name, content type and bytes as uploaded."""
    fmt = doc.get("format")
    if fmt in built:
        return f"{doc['id']}.{fmt}", CONTENT_TYPES[fmt], built[fmt](doc)
    return doc["id"] + ".txt", "text/plain", as_text(doc)


def retrieval_row(q: dict[str, Any], got: dict[str, list[tuple[str, int | None]]]) -> dict[str, Any]:
    row: dict[str, Any] = {"id": q["id"], "lang": q["lang"], "kind": scoring.kind(q)}
    for name, found in got.items():
        answerable = row["kind"] != "unanswerable"
        row[f"{name}@1"] = scoring.hit(found, q, 1) if answerable else None
        row[f"{name}@3"] = scoring.hit(found, q, 3) if answerable else None
    return row


async def retrieval() -> dict[str, Any]:
    from appliance.documents.document import DocumentLimits
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
        reader = DocumentReader(DocumentLimits(wall_s=300))  # a busy shared box reads a text file in over 10 s
        lib = Library(LibraryStore(Path(tmp)), reader, service.embed, service.embed_sync, limits,
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
            got = {}
            for name, ways in WAYS.items():
                found = await lib.search([OFFICE], q["question"], top_k=3, budget=10**9, ways=ways)
                got[name] = [(ids[f.doc], f.page) for f in found]
            rows.append(retrieval_row(q, got))
        passages = sum(r.passages for r in lib.documents([OFFICE]))
        lib.stop()
    service.stop()
    summary = scoring.summarize(rows, [f"{name}@{k}" for name in WAYS for k in (1, 3)])
    return {"questions": len(rows), "documents": len(ids), "pages": pages, "passages": passages,
            "index_s": round(index_s, 1), "pages_per_minute": round(pages / index_s * 60), "summary": summary,
            "rows": rows}


def ask(client: httpx.Client, content: str, library: bool, max_tokens: int = 96) -> dict[str, Any]:
    """One streamed chat at temperature 0: its text, first token's time, the `sources` of the
    first chunk that has them (the passages given) and of the last (the server's attribution,
    with `used` flags, when it makes one), the `grounding` verdict if sent, and the finish
    reason ("length" short of max_tokens: the server's request_timeout_s cut it on a busy box)."""
    body = {"messages": [{"role": "user", "content": content}], "stream": True, "temperature": 0,
            "max_tokens": max_tokens, "library": library}
    t0, first, text = time.perf_counter(), None, []
    out: dict[str, Any] = {"sources": None, "final_sources": None, "grounding": None, "finish": None}
    with client.stream("POST", "/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for raw in r.iter_lines():
            if not raw.startswith("data: ") or raw == "data: [DONE]":
                continue
            chunk = json.loads(raw[6:])
            if "sources" in chunk:
                out["sources"] = out["sources"] if out["sources"] is not None else chunk["sources"]
                out["final_sources"] = chunk["sources"]
            out["grounding"] = chunk.get("grounding", out["grounding"])
            for c in chunk.get("choices", []):
                out["finish"] = c.get("finish_reason") or out.get("finish")
                piece = (c.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - t0
                text.append(piece)
    return {**out, "text": "".join(text), "ttft": first}


def add_all(client: httpx.Client, data: dict[str, Any], helpers: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The set's documents in the office library, added unless one of the same title is there
    (a run cut short goes on against the same server): server id -> set id, and how each was
    uploaded (its file name)."""
    there = {doc["title"]: doc for doc in client.get("/admin/library").json()["data"]}
    ids, how, built = {}, {}, builders(helpers)
    for d in data["documents"]:
        if d["title"] in there:
            ids[there[d["title"]]["id"]], how[d["id"]] = d["id"], there[d["title"]]["name"]
            continue
        name, ctype, content = payload(d, built)
        r = client.post("/admin/library", content=content, params={"title": d["title"]},
                        headers={"Content-Type": ctype, "X-File-Name": name})
        r.raise_for_status()
        ids[r.json()["id"]], how[d["id"]] = d["id"], name
    while any(doc["status"] == "indexing" for doc in client.get("/admin/library").json()["data"]):
        time.sleep(0.5)
    return ids, how


def whole(doc: dict[str, Any], q: dict[str, Any]) -> str:
    """The question with the whole document pasted before it, as a person would."""
    return f"{doc['title']}\n\n" + "\n\n".join(doc["pages"]) + f"\n\nQuestion: {q['question']}"


def tag(q: dict[str, Any]) -> dict[str, Any]:
    """What every row of q starts with."""
    return {"id": q["id"], "lang": q["lang"], "kind": scoring.kind(q)}


def library_row(q: dict[str, Any], got: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """The library's answer to q, scored."""
    row: dict[str, Any] = {**tag(q), "ttft": got["ttft"], "finish": got["finish"], "refused": scoring.refused(got),
                           "verdict": (got["grounding"] or {}).get("verdict")}
    docs, row["cite_by"] = scoring.cited(got, ids)
    row["cited_any"], row["quoted"] = bool(docs), scoring.quoted(got["text"])
    if row["kind"] != "unanswerable":
        found = [(ids.get(s["document"], ""), s["page"]) for s in got["sources"] or []]
        row.update({"hit@1": scoring.hit(found, q, 1), "hit@3": scoring.hit(found, q, 3),
                    "has_fact": scoring.holds(q, got["text"]), "cite_right": q["doc"] in docs,
                    "model_has_fact": scoring.holds(q, scoring.model_words(got["text"])),
                    "answer_cite_right": q["doc"] in scoring.cited(got, ids, quotes=False)[0],
                    "cite_wrong": bool(docs - {q["doc"]})})
    row["cited"], row["answer"] = sorted(docs), got["text"][:300]
    return row


def turns(groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The groups' items taken in turn: the first of each, then the second of each, ..."""
    return [q for turn in itertools.zip_longest(*groups) for q in turn if q is not None]


def select(questions: list[dict[str, Any]], only: str | None, firsts: bool, first: int | None = None) -> list[dict[str, Any]]:
    """The questions of the kinds asked for (all: None), the kinds taken in turn and within a
    kind the languages, so that the `first` N (a run's documented subset, or one cut short)
    have some of each; with `firsts`, only the first answerable one of each document."""
    kinds = only.split(",") if only else list(scoring.KINDS)
    if firsts:
        seen: dict[str, dict[str, Any]] = {}
        for q in questions:
            if scoring.kind(q) in kinds and scoring.kind(q) != "unanswerable":
                seen.setdefault(q["doc"], q)
        return list(seen.values())
    by_kind = [turns([[q for q in questions if scoring.kind(q) == k and q["lang"] == lang] for lang in ("en", "zh")])
               for k in kinds]
    return turns(by_kind)[:first]


def attach(client: httpx.Client, q: dict[str, Any], doc: dict[str, Any], max_tokens: int,
           warm: set[str]) -> dict[str, Any]:
    """Answerable question q asked with its whole document pasted instead of the library."""
    got = ask(client, whole(doc, q), False, max_tokens)
    row = {**tag(q), "attached_has_fact": scoring.holds(q, got["text"]), "attached_ttft": got["ttft"],
           "attached_finish": got["finish"], "attached_answer": got["text"][:300]}
    if doc["id"] not in warm:
        row["attached_ttft_cold"] = got["ttft"]
    warm.add(doc["id"])
    return row


def phase(rows: dict[str, dict[str, Any]], qs: list[dict[str, Any]],
          one: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    for q in qs:
        got = one(q)
        rows.setdefault(q["id"], {}).update(got)
        print(json.dumps(got, ensure_ascii=False), file=sys.stderr, flush=True)


def answers(opts: argparse.Namespace, firsts: bool = False) -> dict[str, Any]:
    """Every question asked with the library; then the answerable ones with the whole document
    (grouped by document, so that each document's prefix is computed once), then (--bare)
    with neither. Each answer is printed as a JSON line on stderr as it comes (`summary` mode
    scores such lines from a run cut short)."""
    data = load()
    client = httpx.Client(base_url=opts.url, timeout=900, trust_env=False)
    n, phases = opts.max_tokens, opts.phases.split(",")
    ids, uploaded = add_all(client, data, opts.helpers) if "library" in phases else ({}, {})
    qs = select(data["questions"], opts.only, firsts, opts.first)[opts.start:]
    if opts.ids:
        qs = [q for q in qs if q["id"] in opts.ids.split(",")]
    docs, rows = {d["id"]: d for d in data["documents"]}, {}
    if "library" in phases:
        phase(rows, qs, lambda q: library_row(q, ask(client, q["question"], True, n), ids))
    answerable = sorted((q for q in qs if scoring.kind(q) != "unanswerable"), key=lambda q: list(docs).index(q["doc"]))
    warm: set[str] = set()
    if "attached" in phases:
        phase(rows, answerable, lambda q: attach(client, q, docs[q["doc"]], n, warm))
    if "bare" in phases:
        phase(rows, answerable, lambda q: {**tag(q), "bare_has_fact": scoring.holds(
            q, ask(client, q["question"], False, n)["text"])})
    return {"questions": len(rows), "uploaded": uploaded, **summary(list(rows.values()))}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"summary": scoring.summarize(rows, RATES, TIMES), "rows": rows}


def from_lines(paths: list[Path]) -> dict[str, Any]:
    """The summary of the JSON lines `answers` runs printed on stderr (merged by question)."""
    rows: dict[str, dict[str, Any]] = {}
    for line in (line for path in paths for line in path.read_text(encoding="utf-8").splitlines()):
        if line.startswith("{"):
            got = json.loads(line)
            rows.setdefault(got["id"], {}).update(got)
    return {"questions": len(rows), **summary([r for r in rows.values() if "kind" in r])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("retrieval", "answers", "attached", "summary"))
    ap.add_argument("--lines", type=Path, nargs="+", help="summary: the JSON lines (stderr) of answers runs")
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--only", help="comma-separated kinds: " + ",".join(scoring.KINDS))
    ap.add_argument("--phases", default="library,attached",
                    help="answers: what to ask, of library (with the library), attached (the whole document pasted: the "
                         "baseline), bare (neither); phases run on two servers at once merge in `summary`")
    ap.add_argument("--first", type=int, help="answers: only the first N questions, the kinds and languages in turn")
    ap.add_argument("--start", type=int, default=0, help="answers: skip the first N of those (a run cut short goes on)")
    ap.add_argument("--ids", help="answers: only these questions (comma-separated ids), e.g. a change's suspects")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--helpers", type=Path, default=ROOT / "tests",
                    help="answers: the tests folder whose helpers/documents.py builds the table documents")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.mode == "retrieval":
        result = asyncio.run(retrieval())
    elif args.mode == "summary":
        result = from_lines(args.lines)
    else:
        result = answers(args, firsts=args.mode == "attached")
    text = json.dumps(result, ensure_ascii=False, indent=1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text, encoding="utf-8")
    if args.mode == "retrieval":
        print(json.dumps(result["summary"], ensure_ascii=False, indent=1))
    else:
        print(scoring.markdown(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
