#!/usr/bin/env python3
"""The sentence the server would quote after an answer that does not stand (library/closest.py),
for every question of the evaluation set: which source it comes from, whether that is the
question's document, whether it holds the fact, and the share of the question's words it
holds; and whether the question names a thing no document mentions (then nothing is quoted).

In this process, on the real embedding model, no chat model: each question searched as a chat
searches it (4 passages), with its translation from a `bench/library/crossing.py --json` run
when one is given (the answerable questions only; the others are searched with the dictionary
alone). One JSON line a question, then the rows with a quote, by share.

    PYTHONPATH=. .venv/bin/python bench/library/closest.py [--translations out/crossing.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import scoring
from inprocess import set_library

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "bench" / "library" / "eval" / "set.json"


async def measure(data: dict[str, Any], translations: dict[str, str]) -> list[dict[str, Any]]:
    from appliance.library.closest import closest
    from appliance.library.store import OFFICE

    rows = []
    async with set_library(data) as (lib, ids):
        for q in data["questions"]:
            also = translations.get(q["id"], "")
            found = await lib.search([OFFICE], q["question"], 4, 10**9, also=also)
            row: dict[str, Any] = {"id": q["id"], "kind": scoring.kind(q),
                                   "unmentioned": await lib.unmentioned([OFFICE], q["question"])}
            near = closest([q["question"], also], [f.text for f in found])
            if near is not None:
                doc = ids[found[near.n - 1].doc]
                row.update({"share": near.share, "n": near.n, "doc": doc, "right": doc == q.get("doc"),
                            "fact": bool(q.get("answer_contains")) and scoring.holds(q, near.sentence),
                            "sentence": near.sentence})
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", type=Path, default=SET)
    ap.add_argument("--translations", type=Path, help="a crossing.py --json run: its translations")
    args = ap.parse_args()
    translations = {r["id"]: (r.get("translation") or {}).get("text", "") for r in
                    json.loads(args.translations.read_text())["rows"]} if args.translations else {}
    rows = asyncio.run(measure(json.loads(args.set.read_text(encoding="utf-8")), translations))
    print(file=sys.stderr)
    for r in sorted((r for r in rows if "share" in r), key=lambda r: -r["share"]):
        print(f"{r['id']:10} {r['kind']:13} {r['share']:.2f} {'right' if r['right'] else '-----'} "
              f"{'fact' if r['fact'] else '    '} {'unmentioned' if r['unmentioned'] else ''} {r['sentence'][:70]}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
