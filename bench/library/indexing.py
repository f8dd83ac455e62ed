#!/usr/bin/env python3
"""Indexing beside chats, for bench/library/indexing.sh: `pdf OUT` writes a 100-page PDF (the
evaluation set's English pages, numbered and repeated; ~1,200 characters a page, ~30,000
words); `loop URL PDF` adds it to /admin/library, waits until it is indexed, replaces it
(indexed again), and so on until SIGTERM, printing one JSON line a round (pages a minute).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.documents import pdf_bytes  # noqa: E402  (the tests' PDF writer: real text pages)

PAGES = 100


def make_pdf(out: Path) -> None:
    data = json.loads((ROOT / "bench" / "library" / "eval" / "set.json").read_text(encoding="utf-8"))
    english = [p for d in data["documents"] if d["lang"] == "en" for p in d["pages"]]
    pages = [f"Page {n + 1}.\n" + "\n".join(english[n % len(english)].split(". ")) for n in range(PAGES)]
    out.write_bytes(pdf_bytes(pages))


def loop(url: str, pdf: Path, rounds: int = 0) -> None:
    """Add, index, replace, ... until SIGTERM, or for `rounds` rounds (0: no end)."""
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    client = httpx.Client(base_url=url, timeout=600, trust_env=False)
    headers = {"content-type": "application/pdf", "x-file-name": pdf.name}
    doc = None
    done_rounds = 0
    while not stop and (rounds == 0 or done_rounds < rounds):
        t0 = time.perf_counter()
        path = "/admin/library" if doc is None else f"/admin/library/{doc['id']}"
        r = client.request("POST" if doc is None else "PUT", path, content=pdf.read_bytes(), headers=headers)
        r.raise_for_status()
        doc = r.json()
        read_s = time.perf_counter() - t0
        while not stop and (doc := client.get(f"/admin/library/{doc['id']}").json())["status"] == "indexing":
            time.sleep(0.5)
        took = time.perf_counter() - t0
        share = doc["indexed"] / max(doc["passages"], 1)  # a round cut short by SIGTERM: its part so far
        print(json.dumps({"pages": doc["pages"], "passages": doc["passages"], "indexed": doc["indexed"],
                          "read_s": round(read_s, 1), "total_s": round(took, 1), "whole": not stop,
                          "pages_per_minute": round(doc["pages"] * share / took * 60, 1)}), flush=True)
        done_rounds += 1


if __name__ == "__main__":
    if sys.argv[1] == "pdf":
        make_pdf(Path(sys.argv[2]))
    else:
        loop(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
