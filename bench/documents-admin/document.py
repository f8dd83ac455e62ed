#!/usr/bin/env python3
"""A document in a chat, timed (issue 27; docs/benchmarks/documents-admin.md). Two parts:

- first: the same ~3,000-token document and question, streamed, to each server (the appliance
  and llama-server), --reps times with a fresh nonce so no cache answers: the first progress
  note, the first answer token, then a follow-up question's first token (the document cached).
- budget: a ~6,000-token document on two appliances (ctx_per_slot 4096 and 8192) while --users
  others stream: at 4096 the 400 and then the first part the page offers to send, at 8192 the
  whole; its TTFT, whether the answer holds a fact from the document's end, the others'
  inter-token gaps while it is read, and the server's RSS.

    bench/documents-admin/document.py first --server appliance=http://127.0.0.1:18181 --server llama-server=http://127.0.0.1:18080
    bench/documents-admin/document.py budget --server ctx4096=http://127.0.0.1:18182 --server ctx8192=http://127.0.0.1:18183
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from appliance.bench import sse
from appliance.bench.prompts import long_document
from appliance.bench.rss import listening_pid, rss_mib

QUESTION = "What is the reference code given at the end of the attached file? Answer with the code only."
FOLLOW_UP = "In one sentence: which topics does the file cover?"
OTHER = "Write a long story about a lighthouse keeper and her cat, at least 800 words."
MARGIN = 0.9  # web/js/attach.js: a cut keeps this share of the characters the tokens allow
# A fresh connection per request: llama-server may close one after a streamed answer, and
# the next request on it would fail (loopback's connect costs ~0.1 ms).
FRESH = httpx.Limits(max_keepalive_connections=0)


@dataclass
class Timed:
    """One streamed chat completion as the client saw it; times in seconds from sending."""

    status: int = 0
    progress_s: float | None = None  # the first progress note (appliance ": prompt N/M", llama-server prompt_progress)
    moved_s: float | None = None  # the first one that says some of the prompt was computed
    notes: int = 0
    ttft_s: float | None = None
    total_s: float | None = None
    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str = ""
    sent: float = 0.0  # monotonic time it was sent
    stamps: list[float] = field(default_factory=list, repr=False)  # monotonic time of each content chunk


def page_message(name: str, text: str, question: str, cut: bool = False) -> str:
    """The user message as the chat page builds it (web/js/attach.js withFiles)."""
    return f"Attached file: {name}{' (first part only)' if cut else ''}\n```\n{text}\n```\n\n{question}"


def document(tokens: int, code: str) -> str:
    """~tokens of report text opened by a fresh nonce (no cache can answer it), the fact last."""
    return long_document(tokens, uuid.uuid4().hex) + f"\nThe reference code of this file is {code}."


def count(c: httpx.Client, url: str, text: str) -> int:
    r = c.post(f"{url}/tokenize", json={"content": text})
    r.raise_for_status()
    return len(r.json()["tokens"])


def sized(c: httpx.Client, url: str, tokens: int) -> int:
    """The long_document size that comes out at ~tokens of this model's tokens."""
    got = count(c, url, document(tokens, "KX-0000"))
    return round(tokens * tokens / got)


def chat(c: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int, out: Timed | None = None) -> Timed:
    """One streamed answer, filling `out` as it comes; llama-server's own fields ask it for its
    progress events and its prompt cache (the appliance ignores both)."""
    body = {"messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True}, "return_progress": True, "cache_prompt": True}
    out = out or Timed()
    out.sent = t0 = time.monotonic()
    with c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        out.status = r.status_code
        if r.status_code != 200:
            r.read()
            out.error = r.json().get("error", {}).get("message", r.text)[:300]
            out.total_s = time.monotonic() - t0
            return out
        for ev in sse.iter_events(sse.lines(r.iter_text()), comments=True):
            seen(out, ev, time.monotonic(), t0)
    out.total_s = time.monotonic() - t0
    return out


def seen(out: Timed, ev: sse.Event, now: float, t0: float) -> None:
    """One SSE event into `out`: a progress note, answer text, the usage or llama-server's timings."""
    done = progress(ev)
    if done is not None:
        out.notes += 1
        out.progress_s = out.progress_s if out.progress_s is not None else now - t0
        if done > 0 and out.moved_s is None:
            out.moved_s = now - t0
    if not isinstance(ev, dict):
        return
    if text := sse.content(ev):
        out.ttft_s = out.ttft_s if out.ttft_s is not None else now - t0
        out.text += text
        out.stamps.append(now)
    usage = ev.get("usage") or {}
    if usage.get("prompt_tokens"):
        out.prompt_tokens = usage["prompt_tokens"]
        out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", out.cached_tokens)
    if timings := ev.get("timings"):  # llama-server: cache_n tokens reused, prompt_n computed
        out.cached_tokens = timings.get("cache_n", out.cached_tokens)


def progress(ev: sse.Event) -> int | None:
    """Prompt tokens computed so far, if `ev` is a progress note: the appliance's ": prompt N/M"
    comment, or llama-server's prompt_progress {total, cache, processed} (processed counts the cache)."""
    if isinstance(ev, sse.Comment) and ev.text.startswith("prompt "):
        return int(ev.text.split()[1].split("/")[0])
    if isinstance(ev, dict) and isinstance(p := ev.get("prompt_progress"), dict):
        return int(p.get("processed", 0)) - int(p.get("cache", 0))
    return None


def first(servers: list[tuple[str, str]], reps: int, tokens: int, max_tokens: int) -> list[dict[str, Any]]:
    """Part one: a document and a follow-up per server per rep, servers alternating in order."""
    rows = []
    with httpx.Client(timeout=600, trust_env=False, limits=FRESH) as c:
        size = sized(c, servers[0][1], tokens)
        for rep in range(reps):
            order = servers if rep % 2 == 0 else servers[::-1]
            for label, url in order:
                code = f"KX-{random.randint(1000, 9999)}"
                ask = [{"role": "user", "content": page_message(f"report-{rep}.txt", document(size, code), QUESTION)}]
                one = chat(c, url, ask, max_tokens)
                more = ask + [{"role": "assistant", "content": one.text}, {"role": "user", "content": FOLLOW_UP}]
                two = chat(c, url, more, max_tokens)
                rows.append({"server": label, "rep": rep, "code": code, "answered": code in one.text,
                             "document": summary(one), "follow_up": summary(two)})
                report_line(rows[-1])
    return rows


def summary(t: Timed) -> dict[str, Any]:
    d = asdict(t)
    d.pop("stamps")
    for k in ("progress_s", "moved_s", "ttft_s", "total_s"):
        d[k] = round(d[k], 3) if d[k] is not None else None
    d["text"] = t.text[:120]
    return d


def report_line(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


class Others:
    """--users other users streaming long answers back to back, each from its own address, until
    stopped; every content chunk's time kept per request, so gaps never span two requests."""

    def __init__(self, url: str, users: int, max_tokens: int) -> None:
        self.url, self.max_tokens = url, max_tokens
        self.streams: list[list[float]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.user, args=(i,), daemon=True) for i in range(users)]

    def user(self, i: int) -> None:
        transport = httpx.HTTPTransport(local_address=f"127.0.0.{10 + i}", limits=FRESH)
        with httpx.Client(timeout=600, trust_env=False, transport=transport) as c:
            while not self.stop.is_set():
                t = Timed()
                self.streams.append(t.stamps)  # filled while it streams
                chat(c, self.url, [{"role": "user", "content": f"{OTHER} (user {i}, {uuid.uuid4().hex[:6]})"}],
                     self.max_tokens, t)

    def __enter__(self) -> Others:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 120
        while sum(1 for s in self.streams if len(s) >= 5) < len(self.threads) and time.monotonic() < deadline:
            time.sleep(0.1)  # every other user is streaming before the document is sent
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(600)

    def gaps(self, start: float, end: float) -> list[float]:
        """Inter-token gaps of the others that overlap [start, end]."""
        return [b - a for s in self.streams for a, b in zip(s, s[1:]) if b > start and a < end]

    def tokens_per_s(self, start: float, end: float) -> float:
        n = sum(1 for s in self.streams for t in s if start <= t <= end)
        return n / (end - start) if end > start else 0.0


class Peak:
    """The RSS of the process on `url`'s port, sampled every 0.25 s while in the block."""

    def __init__(self, url: str) -> None:
        self.pid = listening_pid(urlsplit(url).port or 80)
        self.samples: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        while not self.stop.is_set():
            if self.pid is not None and (mib := rss_mib(self.pid)) is not None:
                self.samples.append(mib)
            self.stop.wait(0.25)

    def __enter__(self) -> Peak:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def context_limit(c: httpx.Client, url: str) -> int:
    """Tokens one conversation holds, as the page reads it (GET /v1/models)."""
    model = c.get(f"{url}/v1/models").json()["data"][0]
    return int(model.get("max_model_len") or model.get("meta", {}).get("n_ctx") or 0)


def fit(c: httpx.Client, url: str, text: str, ctx: int, max_tokens: int) -> str:
    """The first part of `text` the page offers to send (web/js/composer.js room(), web/js/attach.js cutFile)."""
    room = ctx - min(max_tokens, ctx // 4) - len(QUESTION) // 3 - 32
    tokens = count(c, url, text)
    for _ in range(3):
        if tokens <= room:
            break
        text = text[:int(len(text) * (room / tokens) * MARGIN)]
        tokens = count(c, url, text)
    return text


def gap_figures(others: Others, start: float, end: float) -> dict[str, float | None]:
    gaps = sorted(others.gaps(start, end))

    def pick(q: float) -> float | None:
        return round(1000 * gaps[min(len(gaps) - 1, int(q * len(gaps)))]) if gaps else None

    return {"gap_ms_p50": pick(0.5), "gap_ms_p95": pick(0.95), "gap_ms_max": pick(1.0),
            "tokens_per_s": round(others.tokens_per_s(start, end), 1)}


def budget_one(c: httpx.Client, label: str, url: str, rep: int, size: int, max_tokens: int,
               users: int) -> dict[str, Any]:
    """One document on one server while `users` others stream: the whole, or the 400 and the cut."""
    code = f"KX-{random.randint(1000, 9999)}"
    text, name = document(size, code), f"report-{rep}.txt"
    ctx, peak = context_limit(c, url), Peak(url)
    row: dict[str, Any] = {"server": label, "rep": rep, "ctx": ctx, "code": code,
                           "rss_mib_idle": rss_mib(peak.pid) if peak.pid else None}
    with Others(url, users, 400) as others, peak:
        time.sleep(5)  # the others' pace alone, to compare with
        row["others_before"] = gap_figures(others, time.monotonic() - 5, time.monotonic())
        sent = chat(c, url, user(page_message(name, text, QUESTION)), max_tokens)
        row["whole"] = summary(sent)
        if sent.status == 400:
            part = fit(c, url, text, ctx, max_tokens)
            row["cut_tokens"] = count(c, url, part)
            sent = chat(c, url, user(page_message(name, part, QUESTION, cut=True)), max_tokens)
            row["cut"] = summary(sent)
        row["answered"] = code in sent.text
        end = sent.sent + (sent.ttft_s or sent.total_s or 0.0)
        row["others_while_read"] = gap_figures(others, sent.sent, end)
    row["rss_mib_peak"] = max(peak.samples, default=None)
    return row


def budget(servers: list[tuple[str, str]], reps: int, tokens: int, max_tokens: int, users: int) -> list[dict[str, Any]]:
    """Part two: the long document on each server per rep, servers alternating in order."""
    rows = []
    with httpx.Client(timeout=600, trust_env=False, limits=FRESH) as c:
        size = sized(c, servers[0][1], tokens)
        for rep in range(reps):
            for label, url in (servers if rep % 2 == 0 else servers[::-1]):
                rows.append(budget_one(c, label, url, rep, size, max_tokens, users))
                report_line(rows[-1])
    return rows


def med(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def fmt(v: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "-" if v is None else f"{v * scale:,.{digits}f}"


def first_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| server | prompt tokens | first progress note ms | first that moved ms | TTFT ms | follow-up TTFT ms "
           "| follow-up cached tokens | answered | reps |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == label]
        doc = [r["document"] for r in mine]
        up = [r["follow_up"] for r in mine]
        out.append(f"| {label} | {fmt(med([d['prompt_tokens'] for d in doc]))} "
                   f"| {fmt(med([d['progress_s'] for d in doc]), 1000)} | {fmt(med([d['moved_s'] for d in doc]), 1000)} "
                   f"| {fmt(med([d['ttft_s'] for d in doc]), 1000)} "
                   f"| {fmt(med([u['ttft_s'] for u in up]), 1000)} | {fmt(med([u['cached_tokens'] for u in up]))} "
                   f"| {sum(r['answered'] for r in mine)}/{len(mine)} | {len(mine)} |")
    out.append("(medians over the reps; TTFT from sending to the first answer text)")
    return out


def budget_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| server | ctx | whole document | tokens sent | TTFT ms | answered | others' gap max / p95 ms while read "
           "| before | others' tok/s while read / before | RSS idle / peak MiB |",
           "|---|---:|---|---:|---:|---:|---|---|---|---:|"]
    for label in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == label]
        sent = [r.get("cut", r["whole"]) for r in mine]
        w, b = [r["others_while_read"] for r in mine], [r["others_before"] for r in mine]
        whole = "; ".join(dict.fromkeys(str(r["whole"]["status"]) for r in mine))
        out.append(f"| {label} | {mine[0]['ctx']:,} | {whole} | {fmt(med([s['prompt_tokens'] for s in sent]))} "
                   f"| {fmt(med([s['ttft_s'] for s in sent]), 1000)} | {sum(r['answered'] for r in mine)}/{len(mine)} "
                   f"| {fmt(med([x['gap_ms_max'] for x in w]))} / {fmt(med([x['gap_ms_p95'] for x in w]))} "
                   f"| {fmt(med([x['gap_ms_max'] for x in b]))} / {fmt(med([x['gap_ms_p95'] for x in b]))} "
                   f"| {fmt(med([x['tokens_per_s'] for x in w]), digits=1)} "
                   f"/ {fmt(med([x['tokens_per_s'] for x in b]), digits=1)} "
                   f"| {fmt(med([r['rss_mib_idle'] for r in mine]))} / {fmt(med([r['rss_mib_peak'] for r in mine]))} |")
    out.append("(medians over the reps; a 400 is followed by the first part the page offers, whose TTFT is shown)")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["first", "budget"])
    ap.add_argument("--server", action="append", required=True, metavar="LABEL=URL",
                    help="a server to measure; the first also sizes the document with its /tokenize")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, help="~tokens of the document (default: first 3000, budget 6000)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--users", type=int, default=4, help="budget: others streaming meanwhile")
    ap.add_argument("--json", help="also write every row here")
    args = ap.parse_args()
    servers = [tuple(s.split("=", 1)) if "=" in s else (s, s) for s in args.server]
    servers = [(label, url.rstrip("/")) for label, url in servers]
    if args.part == "first":
        rows = first(servers, args.reps, args.tokens or 3000, args.max_tokens)
        table = first_table(rows)
    else:
        rows = budget(servers, args.reps, args.tokens or 6000, args.max_tokens, args.users)
        table = budget_table(rows)
    print("\n" + "\n".join(table))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"part": args.part, "args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
