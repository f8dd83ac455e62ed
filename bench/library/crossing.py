#!/usr/bin/env python3
"""A question in the other language than its document's (issue 49): retrieval hit@1, @3 and @4
(a chat is given 4 passages) before and after the question is also searched in the library's other language, put into it
by the real chat model (http/translate.py's instruction and bounds, through a real server's
/v1/chat/completions, one question at a time, the model otherwise idle), and the time that
translation adds before the first token.

The library runs in this process on the real embedding model, as bench/library/eval.py's
retrieval does; the chat model in a server this script starts (library off: it only
translates). Every question of the set is measured: the cross-language ones (`"cross": true`)
for the gain, the others for what translating costs them (the set's library holds both
languages, so every question is translated). The translated search's best takes every 2nd,
3rd or 4th place (LibraryLimits.translated_every), each measured. Columns: `before`, the
question alone; `gloss`, the question and its words by the dictionary (library/lexicon.py),
no translation; `everyN`, both and the translation.

    .venv/bin/python bench/library/crossing.py --json out/crossing.json [--set path/to/set.json]
    .venv/bin/python bench/library/crossing.py --translations out/crossing.json   # the searches again, no model
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from inprocess import set_library

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "bench" / "library" / "eval" / "set.json"
EVERY = (2, 3, 4)  # the translated search's best takes every 2nd, 3rd or 4th place (LibraryLimits.translated_every)
KS = (1, 3, 4)  # hit@k: a chat is given 4 passages at most


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(state: Path, model: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The real appliance, library off, waited on until its model has loaded."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    log = open(state / "server.log", "wb")  # noqa: SIM115 - the server's, closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "appliance", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--model", str(model), "--state-dir", str(state / "state"), "--library", "false"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1800):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: see {state / 'server.log'}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the model did not load in 3 minutes")


def translate(client: httpx.Client, question: str, into: Any) -> dict[str, Any]:
    """What translate.translate asks the engine, asked through the API: the text and its times."""
    from appliance.http.translate import MAX_TOKENS, MOST_CHARS, messages

    body = {"messages": messages(question[:MOST_CHARS], into), "max_tokens": MAX_TOKENS, "temperature": 0,
            "stop": ["\n"]}
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body, timeout=120)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    got = r.json()
    timings = got.get("timings", {})
    return {"text": got["choices"][0]["message"]["content"].strip(), "wall_s": round(wall, 3),
            "prompt_ms": timings.get("prompt_ms"), "predicted_ms": timings.get("predicted_ms"),
            "tokens": got["usage"]["completion_tokens"], "prompt_tokens": got["usage"]["prompt_tokens"]}


def hit(found: list[tuple[str, int | None]], q: dict[str, Any], k: int) -> bool:
    return any(doc == q["doc"] and page == q["page"] for doc, page in found[:k])


async def measure(data: dict[str, Any], url: str, known: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    from appliance.library.store import OFFICE

    rows = []
    async with contextlib.AsyncExitStack() as stack:
        lib, ids = await stack.enter_async_context(set_library(data))
        client = stack.enter_context(httpx.Client(base_url=url, trust_env=False))
        questions = [q for q in data["questions"] if q.get("doc")]  # the unanswerable have no page to hit
        if not known:  # the model's first answer reads its weights from disk: not counted
            translate(client, questions[0]["question"], (await lib.crossing([OFFICE], questions[0]["question"])))
        for q in questions:
            t0 = time.perf_counter()
            into = await lib.crossing([OFFICE], q["question"])
            row: dict[str, Any] = {"id": q["id"], "lang": q["lang"], "cross": bool(q.get("cross")),
                                   "decide_ms": round((time.perf_counter() - t0) * 1000, 2)}
            got = [(ids[f.doc], f.page) for f in await lib.search([OFFICE], q["question"], 4, 10**9, gloss=False)]
            row.update({f"before@{k}": hit(got, q, k) for k in KS})
            got = [(ids[f.doc], f.page) for f in await lib.search([OFFICE], q["question"], 4, 10**9)]
            row.update({f"gloss@{k}": hit(got, q, k) for k in KS})  # the dictionary alone: no translation came
            tr = known.get(q["id"]) or (translate(client, q["question"], into) if into is not None else {"text": ""})
            row["translation"] = tr
            for every in EVERY:
                lib.limits = dataclasses.replace(lib.limits, translated_every=every)
                got = [(ids[f.doc], f.page) for f in await lib.search([OFFICE], q["question"], 4, 10**9,
                                                                       also=tr["text"])]
                row.update({f"every{every}@{k}": hit(got, q, k) for k in KS})
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    groups = {f"{kind}-{lang}": [r for r in rows if r["cross"] == (kind == "cross") and r["lang"] == lang]
              for kind in ("cross", "same") for lang in ("en", "zh")}
    groups |= {"cross": [r for r in rows if r["cross"]], "same": [r for r in rows if not r["cross"]]}
    for name, sel in groups.items():
        keys = [f"{name}@{k}" for name in ("before", "gloss") for k in KS] + [f"every{every}@{k}" for every in EVERY for k in KS]
        out[name] = {"n": len(sel), **{k: round(sum(r[k] for r in sel) / len(sel), 3) for k in keys}} if sel else {}
    done = [r["translation"] for r in rows if r["translation"].get("wall_s") is not None]
    out["translation"] = {
        "n": len(done),
        "median_wall_s": round(statistics.median(t["wall_s"] for t in done), 3),
        "median_prompt_ms": round(statistics.median(t["prompt_ms"] for t in done), 1),
        "median_predicted_ms": round(statistics.median(t["predicted_ms"] for t in done), 1),
        "median_tokens": statistics.median(t["tokens"] for t in done),
        "median_prompt_tokens": statistics.median(t["prompt_tokens"] for t in done),
    }
    out["median_decide_ms"] = round(statistics.median(r["decide_ms"] for r in rows), 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", type=Path, default=SET)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--translations", type=Path, help="a previous run's --json: its translations (and their times) "
                                                          "reused, to compare the ways of searching alone")
    args = ap.parse_args()
    data = json.loads(args.set.read_text(encoding="utf-8"))
    known = {r["id"]: r["translation"] for r in json.loads(args.translations.read_text())["rows"]} \
        if args.translations else {}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve(Path(tmp), args.model) if not known else (None, "http://127.0.0.1:9")  # no model needed
        try:
            rows = asyncio.run(measure(data, url, known))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(60)
    result = {"summary": summary(rows), "rows": rows}
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, ensure_ascii=False, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
