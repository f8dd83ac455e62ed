"""`appliance bench`: a closed-loop load generator for OpenAI-compatible streaming chat servers.

Reports tokens/s, TTFT, end-to-end and inter-token latency per concurrency level, optionally
side by side with peer servers measured in the same invocation under the same machine load.
Workloads: chat (questions, or multi-turn users with think time), rewrite, burst (N requests
let go at once: do all come back?) and soak (steady load for a fixed time, the server's RSS
sampled). Each simulated user has its own connection and, against a loopback URL, its own
source address. Output: tables (fixed-width or Markdown), JSON, JSON lines, a plot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib
import ipaddress
import json
import math
import os
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TextIO

import httpx

from . import sse

Arrival = Literal["together", "staggered"]

# Staggered arrival: worker i starts i * STAGGER_S after the level opens (people reaching
# their keyboards one by one rather than a thundering herd).
STAGGER_S = 0.25
CHARS_PER_TOKEN = 4  # rough English average, good enough to size the long paste

DEFAULT_SYSTEM = (
    "You are a helpful assistant for a small office. Answer clearly and concisely, "
    "use plain language, and say so when you are not sure. Keep answers short unless "
    "the user asks for detail."
)

PROMPTS: tuple[str, ...] = (
    "What is the difference between a list and a tuple in Python?",
    "Write a short polite email declining a meeting invitation.",
    "Explain what DNS does in two sentences.",
    "Give me three tips for writing clear commit messages.",
    "How do I convert Celsius to Fahrenheit?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "What does HTTP status code 404 mean?",
    "Suggest a name for a team wiki page about onboarding.",
    "How can I find the largest files on a Linux disk?",
    "What is a good way to structure a weekly status report?",
    "Explain recursion to a beginner with a small example.",
    "What are the pros and cons of working from home?",
    "Write a SQL query that counts orders per customer.",
    "How do I make a strong password that I can remember?",
    "What is the capital of Australia, and why not Sydney?",
    "Rewrite this sentence to be more formal: we gotta ship it by friday.",
)

# Turns 2..T of a conversation; short, so the growing history is mostly the model's answers.
FOLLOW_UPS: tuple[str, ...] = (
    "Can you say more?",
    "Give me an example.",
    "Summarise that in one line.",
    "Why is that?",
    "What would you do differently?",
    "Explain it to a beginner.",
    "Is there a simpler way?",
    "What are the risks?",
)

# --workload rewrite: the user pastes text and asks for it back with small fixes, so most of
# the answer copies the prompt (what n-gram speculative decoding drafts from). Prose and code
# alternate, so neighbouring users differ in kind as well as in text. Paragraphs are 60-120
# words with a few typos, snippets 8-15 lines with one small bug: one answer fits in ~160 tokens.
_PROSE: tuple[str, ...] = (
    "Next monday the finance team will move from the third floor to the new offices on the "
    "ground floor. Please pack your desks by Friday afternoon and label every box with your "
    "name and teh room number. The movers will arrive at seven in the morning, so the lifts "
    "will be busy untill about ten. If you have equipment that needs special handling, such as "
    "monitors or the shared scanner, tell Maria before Thursday so she can arange extra help. "
    "Thank you for your patience during the move.",
    "From the first of next month, all staff accounts will require a password of at least "
    "twelve characters. The IT team recomends using a short sentence that is easy to remember "
    "but hard to guess, rather than a single word with numbers added at the end. Passwords will "
    "no longer expire every ninety days, but you must change yours immediatly if you think "
    "someone else has seen it. Never share your password by email or chat, even with colleages "
    "from IT, who will never ask for it.",
    "Thank you for contacting us about the late delivery of your order. We are sorry that the "
    "parcel arrived four days after the date we promised, and we understand how frustating this "
    "must have been. The delay was caused by a problem at our regional warehouse, which has now "
    "been resolved. As an apology, we have refunded the delivery charge to your orginal payment "
    "method; it should apear within five working days. Please do not hesitate to get in touch "
    "if there is anything else we can do for you.",
    "In this week's planning meeting the team aggreed to postpone the website redesign until "
    "the new brand guidelines are finished. Sam will complete the accessibility audit of the "
    "current site by the end of the month, and the results will decide which pages we fix "
    "first. Priya raised concerns about the hosting costs, wich have risen by almost a third "
    "since last year. We will compare at least two other providers before the contract renews "
    "in Febuary. The next meeting is on Tuesday at half past ten in the small conference room.",
    "The new standing desk adjusts smoothly from 65 to 125 centimetres at the touch of a "
    "button, and it remembers up to four height settings. Its steel frame supports loads of up "
    "to eighty kilograms, which is enough for two large monitors and a laptop. The desktop is "
    "made from recycled wood with a scratch-resistent finish that is easy to clean. Assembly "
    "takes about thirty minutes with the tools included in the box. Every desk comes with a "
    "five year waranty on the frame and the motor, and a two year waranty on the controls.",
    "Our spring clean-up day was a great sucess thanks to the forty volunteers who joined us in "
    "the park on Saturday. Together we collected more than sixty bags of litter, cleared the "
    "overgrown path by the pond and planted two hundred bulbs along the main entrance. The local "
    "bakery kindly donated coffee and pastries for everyone, and several children made posters "
    "asking visitors to take there rubbish home. We will definately organise another event in "
    "the autumn, so keep an eye on the noticeboard and our website for the date.",
    "Employees who wish to take annual leave should submit a request through the HR portal at "
    "least two weeks in advance. Requests for more then five consecutive days need approvel "
    "from both your manager and the head of department. Unused leave of up to five days can be "
    "carryed over into the next year, but it must be taken before the end of March or it will "
    "be lost. If you are unsure how many days you have left, the portal shows your current "
    "balance on the home page under the heading 'My Absences'.",
    "Version 2.4 of the reporting tool introduces sheduled exports, so you can have any saved "
    "report emailed to you every morning as a spreadsheet. We have also rewritten the search "
    "page, which now returns results about three times faster on large acounts. Charts can be "
    "copied directly into presentations with thier colours and labels intact. This release "
    "fixes a bug that caused some dates to be shown in the wrong time zone after the clocks "
    "changed. As always, please report any problems through the feedback button in the top "
    "right corner of the screen.",
)

# (fence tag, language name, snippet); each has exactly one small bug or typo.
_CODE: tuple[tuple[str, str, str], ...] = (
    ("python", "Python", '''\
def average_order_value(orders):
    """Return the mean total of the given orders, or 0.0 if there are none."""
    if not orders:
        return 0.0
    total = 0
    for order in orders:
        total += order["total"]
    return total / len(order)'''),
    ("javascript", "JavaScript", '''\
function formatPrice(cents, currency = "EUR") {
  if (!Number.isInteger(cents)) {
    throw new TypeError("cents must be an integer");
  }
  const amount = cents / 100;
  return new Intl.NumberFormat("en-GB", {
    style: "currency",
    currency: currency,
  }).format(amout);
}

console.log(formatPrice(1999));'''),
    ("sql", "SQL", '''\
SELECT c.customer_id,
       c.name,
       COUNT(o.order_id) AS orders,
       SUM(o.total) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.customer_id
WHERE o.created_at >= DATE '2024-01-01'
GROUP BY c.customer_id, c.name
ORDER BY revenu DESC
LIMIT 10;'''),
    ("python", "Python", '''\
import csv


def load_prices(path):
    prices = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name = row["product"].strip()
            price = float(row["price"])
            if price < 0:
                raise ValueError(f"negative price for {name}")
            prices[name] = price
    retrun prices'''),
    ("javascript", "JavaScript", '''\
async function fetchUsers(baseUrl) {
  const response = await fetch(`${baseUrl}/api/users`);
  if (!response.ok) {
    throw new Error(`request failed: ${response.status}`);
  }
  const users = response.json();
  return users
    .filter((user) => user.active)
    .map((user) => ({ id: user.id, name: user.name }));
}'''),
    ("python", "Python", '''\
def chunk(items, size):
    """Split items into lists of at most `size` elements."""
    if size < 1:
        raise ValueError("size must be at least 1")
    chunks = []
    for start in range(0, len(items), size):
        chunks.append(items[start:start + size - 1])
    return chunks


print(chunk([1, 2, 3, 4, 5], 2))'''),
    ("sql", "SQL", '''\
UPDATE employees
SET salary = salary * 1.05,
    updated_at = CURRENT_TIMESTAMP,
WHERE department_id = (
    SELECT department_id
    FROM departments
    WHERE name = 'Support'
)
AND hired_on < DATE '2023-01-01';'''),
    ("python", "Python", '''\
from datetime import date


def age_on(birthday: date, today: date) -> int:
    """Whole years between birthday and today."""
    years = today.year - birthday.year
    if (today.month, today.day) > (birthday.month, birthday.day):
        years -= 1
    return years


assert age_on(date(2000, 6, 15), date(2024, 6, 14)) == 23'''),
)

# Later turns ask for the whole text again, so they copy too (from the previous answer).
_PROSE_FOLLOW_UPS: tuple[str, ...] = (
    "Now also make it more formal and return the whole text again.",
    "Now split the longest sentence in two and return the whole text again.",
    "Now use British spelling throughout and return the whole text again.",
    "Now replace any informal words and return the whole text again.",
)
_CODE_FOLLOW_UPS: tuple[str, ...] = (
    "Now also add a short comment explaining the fix and return the whole code again.",
    "Now rename any unclear variable and return the whole code again.",
    "Now format it consistently and return the whole code again.",
    "Now add a one-line comment at the top saying what it does and return the whole code again.",
)


def _rewrite_prompt(i: int) -> tuple[str, tuple[str, ...]]:
    """Prompt i of the rewrite pool and its follow-ups: prose at even i, code at odd i."""
    if i % 2 == 0:
        ask = ("Fix the typos in this paragraph and return only the corrected text:"
               if i % 4 == 0 else
               "Correct the spelling and grammar of this paragraph, changing as little as "
               "possible, and return only the corrected text:")
        return f"{ask}\n\n{_PROSE[i // 2]}", _PROSE_FOLLOW_UPS
    tag, language, code = _CODE[i // 2]
    return (f"Fix the bug in this {language} code and return only the corrected code:\n\n"
            f"```{tag}\n{code}\n```", _CODE_FOLLOW_UPS)


_REWRITE = [_rewrite_prompt(i) for i in range(len(_PROSE) + len(_CODE))]
REWRITE_PROMPTS: tuple[str, ...] = tuple(p for p, _ in _REWRITE)
REWRITE_FOLLOW_UPS: tuple[tuple[str, ...], ...] = tuple(f for _, f in _REWRITE)

# --workload burst: one person pastes a list of products and asks for a description of each,
# all at once (a script, or 20 browser tabs); every answer must come back.
PRODUCTS: tuple[str, ...] = (
    "a stainless steel water bottle", "a wireless ergonomic mouse", "a standing desk mat",
    "a noise-cancelling headset", "a recycled paper notebook", "a USB-C docking station",
    "a desk lamp with a dimmer", "a whiteboard with magnetic markers", "a mesh office chair",
    "a 27-inch monitor arm", "a compact label printer", "a ceramic coffee mug",
    "a cable management tray", "a portable projector", "a mechanical keyboard",
    "a filing cabinet with a lock", "a webcam with a privacy shutter", "a shredder for paper and cards",
    "a laptop stand made of bamboo", "a set of reusable sticky notes",
)
BURST_PROMPTS: tuple[str, ...] = tuple(
    f"Write a 2-sentence description for this product in our online shop: {p}." for p in PRODUCTS)
BURST_SIZE = len(PRODUCTS)

WorkloadName = Literal["chat", "rewrite", "burst", "soak"]
# What each --workload sends: prompts[k] opens conversation k, follow_ups[k % len] continues it.
# soak is chat for a fixed time; burst sends one opening each (no follow-ups unless --turns).
PROMPT_SETS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {
    "chat": (PROMPTS, (FOLLOW_UPS,)),
    "rewrite": (REWRITE_PROMPTS, REWRITE_FOLLOW_UPS),
    "burst": (BURST_PROMPTS, (FOLLOW_UPS,)),
    "soak": (PROMPTS, (FOLLOW_UPS,)),
}
# Concurrency levels when --concurrency is not given: a burst is its size, a soak one load.
DEFAULT_LEVELS: dict[str, list[int]] = {"chat": [1, 4, 8, 16], "rewrite": [1, 4, 8, 16],
                                        "burst": [BURST_SIZE], "soak": [8]}


_LONG_SENTENCES = (
    "The quarterly report covers revenue, costs and headcount across all regional offices.",
    "Several teams noted that the new ticketing process reduced response times noticeably.",
    "Facilities requested budget for replacing the ageing printers on the second floor.",
    "The security review recommended rotating shared credentials every ninety days.",
    "Customer feedback highlighted slow delivery in the northern region during winter.",
    "Training sessions for the accounting software will continue through next month.",
)


@dataclass(frozen=True, slots=True)
class Workload:
    """What every request of a level sends; `model` is per server (see resolve_model)."""

    model: str = "default"
    system: str = DEFAULT_SYSTEM
    prompts: tuple[str, ...] = PROMPTS  # conversation k opens with prompts[k % len]
    # Conversation k's turn t+1 sends follow_ups[k % len][(k + t - 1) % len(...)]: one pool
    # for all (chat), or one per prompt (rewrite: prose and code are followed up differently).
    follow_ups: tuple[tuple[str, ...], ...] = (FOLLOW_UPS,)
    # Conversation k's first prompt gets a ~prompt_mix[k % len]-token document up front
    # (0 = none), so users arriving together send prompts of mixed lengths; () = off.
    prompt_mix: tuple[int, ...] = ()
    max_tokens: int = 64
    temperature: float = 0.0
    long_prompt_tokens: int = 0  # 0 = no extra long-paste client
    turns: int = 1  # > 1: each concurrent client is one user holding a conversation this long
    think_s: float = 1.0  # a user's pause between reading an answer and sending the next turn
    # Most OpenAI clients send no session id; the server must then tell users apart by
    # address and prompt prefix, so runs should measure both ways.
    session_ids: bool = True
    # All requests from one address (burst: one person's script); else one per simulated user.
    one_address: bool = False


@dataclass(slots=True)
class RequestResult:
    """One streamed request; times are time.perf_counter() seconds."""

    t_start: float
    t_end: float = 0.0
    status: int = 0  # HTTP status, 0 = no response (connection error, timeout)
    token_times: list[float] = field(default_factory=list)  # each non-empty content chunk
    usage_tokens: int | None = None
    prompt_tokens: int | None = None  # from the usage chunk, when the server sends it
    text: str = ""  # the streamed answer, sent back as history on the next turn
    turn: int = 1  # 1-based position in its conversation
    pad_tokens: int | None = None  # the conversation's --prompt-mix document, None = no mix
    done: bool = False  # saw `data: [DONE]`
    reason: str = ""  # why it failed; empty when it succeeded

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and not self.reason

    @property
    def rejected(self) -> bool:
        # 429/503 are the server shedding load on purpose: counted apart from real failures.
        return self.status in (429, 503)

    @property
    def completion_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.t_start if self.token_times else None

    @property
    def gaps(self) -> list[float]:
        """Inter-token latency per chunk (a chunk may carry more than one token)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


@dataclass(slots=True)
class LevelResult:
    """All requests of one server at one concurrency level (possibly several rounds merged)."""

    label: str
    concurrency: int
    wall_s: float
    results: list[RequestResult]
    long_results: list[RequestResult] = field(default_factory=list)
    itl_during_long: list[float] = field(default_factory=list)  # short-stream gaps, s
    # --workload soak: the server's RSS as (seconds since the load started, MiB), the first
    # taken before it starts and the last after it ended; warm-up ends at warmup_s.
    rss_mib: list[tuple[float, float]] = field(default_factory=list)
    warmup_s: float = 0.0

    @classmethod
    def merge(cls, parts: list[LevelResult]) -> LevelResult:
        first = parts[0]
        return cls(
            first.label, first.concurrency, sum(p.wall_s for p in parts),
            [r for p in parts for r in p.results], [r for p in parts for r in p.long_results],
            [g for p in parts for g in p.itl_during_long],
            first.rss_mib, first.warmup_s,  # RSS is one soak's story: the first round tells it
        )

    def rss_points(self) -> dict[str, float | None]:
        """RSS (MiB) before the load, once warmed up, after it ended, and the highest seen."""
        s = self.rss_mib
        if not s:
            return {"start": None, "warm": None, "end": None, "max": None}
        warm = next((mib for t, mib in s if t >= self.warmup_s), s[-1][1])
        return {"start": s[0][1], "warm": warm, "end": s[-1][1], "max": max(mib for _, mib in s)}

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def num_rejected(self) -> int:
        return sum(1 for r in self.results if r.rejected)

    @property
    def num_failed(self) -> int:
        """Failures other than rejections."""
        return sum(1 for r in self.results if not r.ok and not r.rejected)

    @property
    def failure_reasons(self) -> Counter[str]:
        return Counter(r.reason for r in self.results if not r.ok)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.completed)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def requests_per_min(self) -> float:
        return len(self.completed) * 60.0 / self.wall_s if self.wall_s > 0 else 0.0

    def ttfts(self, later: bool | None = None) -> list[float]:
        """later: None = every turn, False = turn 1 only, True = turns 2..T only."""
        return [t for r in self.completed if (t := r.ttft) is not None
                and (later is None or (r.turn > 1) == later)]

    def latencies(self) -> list[float]:
        return [r.t_end - r.t_start for r in self.completed]

    def itls(self) -> list[float]:
        return [g for r in self.completed for g in r.gaps]

    def prompt_tokens_by_turn(self) -> list[float | None]:
        """Mean usage.prompt_tokens of turn 1, 2, ...: shows how the history grows."""
        by_turn: defaultdict[int, list[int]] = defaultdict(list)
        for r in self.completed:
            if r.prompt_tokens is not None:
                by_turn[r.turn].append(r.prompt_tokens)
        last = max((r.turn for r in self.results), default=0)
        return [round(statistics.fmean(v), 1) if (v := by_turn[t]) else None
                for t in range(1, last + 1)]

    def by_pad(self) -> dict[str, dict[str, Any]]:
        """Turn-1 numbers per --prompt-mix document size (JSON keys: tokens as text).

        Shows whether the short prompts of users arriving together wait behind the long ones.
        """
        groups: defaultdict[int, list[RequestResult]] = defaultdict(list)
        for r in self.results:
            if r.turn == 1 and r.pad_tokens is not None:
                groups[r.pad_tokens].append(r)
        out: dict[str, dict[str, Any]] = {}
        for pad, rs in sorted(groups.items()):
            ok = [r for r in rs if r.ok]
            ttfts = [t for r in ok if (t := r.ttft) is not None]
            sizes = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
            out[str(pad)] = {"requests": len(rs), "completed": len(ok),
                             "prompt_tokens": round(statistics.fmean(sizes), 1) if sizes else None,
                             "ttft_ms_p50": _ms(percentile(ttfts, 50)),
                             "ttft_ms_p95": _ms(percentile(ttfts, 95))}
        return out

    def summary(self) -> dict[str, Any]:
        """Plain JSON-able numbers; latencies in ms, None where nothing was measured."""
        long_ttfts = [t for r in self.long_results if r.ok and (t := r.ttft) is not None]
        by_turn = {f"{name}_ttft_ms_p{q}": _ms(percentile(self.ttfts(later), q))
                   for name, later in (("turn1", False), ("later", True)) for q in (50, 95)}
        return {
            "label": self.label,
            "concurrency": self.concurrency,
            "requests": len(self.results),
            "completed": len(self.completed),
            "rejected": self.num_rejected,
            "failed": self.num_failed,
            "failure_reasons": dict(self.failure_reasons),
            "completion_tokens": self.completion_tokens,
            "wall_s": round(self.wall_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "requests_per_min": round(self.requests_per_min, 2),
            "ttft_ms_p50": _ms(percentile(self.ttfts(), 50)),
            "ttft_ms_p95": _ms(percentile(self.ttfts(), 95)),
            "e2e_ms_p50": _ms(percentile(self.latencies(), 50)),
            "e2e_ms_p95": _ms(percentile(self.latencies(), 95)),
            "itl_ms_p50": _ms(percentile(self.itls(), 50)),
            "itl_ms_p95": _ms(percentile(self.itls(), 95)),
            "itl_ms_p95_during_long": _ms(percentile(self.itl_during_long, 95)),
            # p95 hides a server that stalls every stream once for seconds: show the worst gap.
            "itl_ms_max_during_long": _ms(max(self.itl_during_long, default=None)),
            "long_ttft_ms_p50": _ms(percentile(long_ttfts, 50)),
            "long_failed": sum(1 for r in self.long_results if not r.ok),
            **by_turn,
            "prompt_tokens_by_turn": self.prompt_tokens_by_turn(),
            "by_prompt_mix": self.by_pad(),  # {} without --prompt-mix
            # The last answer's end, from the moment all requests were let go (burst: how long
            # the person waits for the whole list).
            "last_answer_s": round(max((r.t_end for r in self.results), default=0.0)
                                   - min((r.t_start for r in self.results), default=0.0), 3),
            "rss_mib": self.rss_points(),  # all None unless --workload soak found the server
            "rss_samples": [[round(t, 1), mib] for t, mib in self.rss_mib],
            "warmup_s": self.warmup_s,
        }


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def base_url(url: str) -> str:
    """Server root from any of `host:port`, `.../v1` or `.../v1/chat/completions`."""
    url = url.rstrip("/")
    for suffix in ("/chat/completions", "/v1"):
        url = url.removesuffix(suffix)
    return url


def is_loopback(url: str) -> bool:
    """True for 127.x.y.z and localhost: the only targets we can reach from many addresses."""
    host = httpx.URL(base_url(url)).host
    if host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    # IPv6 has one loopback address (::1), so there is nothing to spread users over.
    return addr.version == 4 and addr.is_loopback


def user_address(i: int) -> str:
    """Source address of simulated user i (0-based): 127.0.0.2, 127.0.0.3, ...

    The whole of 127/8 reaches the local host, so each user can arrive from their own address
    as each PC in an office does; the server keys cache reuse and fairness by it. 127.0.0.1
    stays for everything that is not a user (health checks, resolve_model).
    """
    hi, lo = divmod(i, 253)  # .2 to .254 in each /24
    if hi > 255:
        raise ValueError(f"no loopback address for user {i}")
    return f"127.0.{hi}.{lo + 2}"


def fresh_system(system: str) -> str:
    """A random tag up front, so no server can have this system prompt cached already."""
    return f"[run {uuid.uuid4().hex[:8]}] {system}"


def _opening(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def long_document(n_tokens: int) -> str:
    # A fresh nonce up front defeats prefix caching, so every round pays the full prefill.
    parts = [f"Document {uuid.uuid4().hex}."]
    size, i = len(parts[0]), 0
    while size < n_tokens * CHARS_PER_TOKEN:
        parts.append(_LONG_SENTENCES[i % len(_LONG_SENTENCES)])
        size += len(parts[-1]) + 1
        i += 1
    return " ".join(parts)


def first_prompt(workload: Workload, k: int) -> tuple[str, int | None]:
    """Conversation k's opening user message and its --prompt-mix document size (tokens)."""
    prompt = workload.prompts[k % len(workload.prompts)]
    if not workload.prompt_mix:
        return prompt, None
    pad = workload.prompt_mix[k % len(workload.prompt_mix)]
    # The document goes before the question, as a pasted email or log does.
    return (f"{long_document(pad)}\n\n{prompt}" if pad else prompt), pad


def follow_up(workload: Workload, k: int, turn: int) -> str:
    """What conversation k sends after the answer to `turn` (1-based)."""
    pool = workload.follow_ups[k % len(workload.follow_ups)]
    return pool[(k + turn - 1) % len(pool)]


async def resolve_model(url: str, timeout: float = 10.0) -> str:
    """First id from GET /v1/models; "default" when the server does not say."""
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            resp = await client.get(base_url(url) + "/v1/models")
            resp.raise_for_status()
            return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, LookupError, TypeError):
        return "default"


class Progress:
    """One line on stderr: which server and level, a bar, answers so far; redrawn at most
    10 times a second, wiped when the level ends. Silent when off (not a TTY, or --quiet)."""

    WIDTH = 24  # characters of bar

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.title, self.total, self.timed = "", 1.0, False
        self.t0 = self.drawn = 0.0
        self.num_done = self.num_ok = 0

    def begin(self, title: str, total: float, timed: bool = False) -> None:
        """total: requests expected, or seconds when timed (a soak)."""
        self.title, self.total, self.timed = title, max(total, 1e-9), timed
        self.t0, self.drawn, self.num_done, self.num_ok = time.perf_counter(), 0.0, 0, 0
        self._draw(force=True)

    def update(self, results: list[RequestResult]) -> None:
        self.num_done, self.num_ok = len(results), sum(1 for r in results if r.ok)
        self._draw(force=not self.timed and self.num_done >= self.total)

    def end(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.t0
        frac = min(1.0, (elapsed if self.timed else self.num_done) / self.total)
        bar = "#" * round(frac * self.WIDTH)
        count = f"{elapsed:.0f}/{self.total:.0f} s" if self.timed else f"{self.num_done}/{self.total:.0f}"
        failed = self.num_done - self.num_ok
        return (f"{self.title}  [{bar.ljust(self.WIDTH, '.')}] {count}  ok {self.num_ok}"
                + (f"  not ok {failed}" if failed else "") + f"  {elapsed:.1f} s")

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.drawn < 0.1):
            return
        self.drawn = now
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()


def listening_pid(port: int) -> int | None:
    """The process listening on TCP `port` of this host (Linux /proc), lowest pid first; None
    when there is none or it cannot be seen (another user's process, another namespace)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            # local_address is HEX_IP:HEX_PORT, state 0A is LISTEN, field 9 the socket inode.
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    pids = sorted(int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
    for pid in pids:
        try:
            if any(os.readlink(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return pid
        except OSError:
            continue  # gone, or not ours to look at
    return None


def rss_mib(pid: int) -> float | None:
    """VmRSS of `pid` in MiB, None when the process is gone or unreadable."""
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmRSS:"):
                return round(int(row.split()[1]) / 1024.0, 1)  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def server_pid(url: str, pid: int | None = None) -> int | None:
    """The pid to sample for `url`: the one given, else whoever listens on its loopback port."""
    if pid is not None:
        return pid
    if not is_loopback(url):
        return None
    u = httpx.URL(base_url(url))
    return listening_pid(u.port or (443 if u.scheme == "https" else 80))


async def _request(
    client: httpx.AsyncClient, endpoint: str, workload: Workload,
    messages: list[dict[str, str]], timeout: float, session: str | None = None,
    first_token: asyncio.Event | None = None,
) -> RequestResult:
    body = {
        "model": workload.model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": workload.max_tokens, "temperature": workload.temperature,
        "messages": messages,
    }
    headers = {"X-Session-Id": session or f"bench-{uuid.uuid4()}"} if workload.session_ids else {}
    res = RequestResult(t_start=time.perf_counter())
    try:
        # httpx timeouts are per read; asyncio.timeout bounds the whole request.
        async with asyncio.timeout(timeout):
            async with client.stream("POST", endpoint, json=body, headers=headers) as resp:
                res.status = resp.status_code
                if resp.status_code != 200:
                    await resp.aread()
                    res.reason = f"http {resp.status_code}"
                    return res
                await _read_stream(resp, res, first_token)
    except TimeoutError:
        res.reason = "timeout"
    except httpx.HTTPError as e:
        res.reason = type(e).__name__
    finally:
        res.t_end = time.perf_counter()
    if not res.reason and not res.done:
        res.reason = "stream ended without [DONE]"
    return res


async def _read_stream(
    resp: httpx.Response, res: RequestResult, first_token: asyncio.Event | None
) -> None:
    try:
        async for event in sse.aiter_events(sse.alines(resp.aiter_text())):
            if event == sse.DONE:
                res.done = True
                return
            if not isinstance(event, dict):
                continue
            if "error" in event:
                err = event["error"]
                kind = (err.get("type") or err.get("code")) if isinstance(err, dict) else None
                res.reason = f"stream error: {kind or 'error'}"
                return
            if isinstance(usage := event.get("usage"), dict):
                if isinstance(n := usage.get("completion_tokens"), int):
                    res.usage_tokens = n
                if isinstance(n := usage.get("prompt_tokens"), int):
                    res.prompt_tokens = n
            # A role-only or empty delta is not a token: TTFT starts at the first visible text.
            if content := sse.content(event):
                res.token_times.append(time.perf_counter())
                res.text += content
                if first_token is not None:
                    first_token.set()
    except ValueError:
        res.reason = "bad json in stream"


async def measure(
    url: str, concurrency: int, requests: int, workload: Workload, *,
    label: str = "appliance", timeout: float = 300.0, arrival: Arrival = "together",
    stagger_s: float = STAGGER_S, duration_s: float | None = None, progress: Progress | None = None,
) -> LevelResult:
    """Run `requests` streamed requests through `concurrency` closed-loop workers.

    With workload.turns > 1 `requests` is ignored: each worker is one user holding one
    conversation of `turns` requests, and wall time includes the users' think time.
    With `duration_s` (soak) `requests` is ignored too: each worker starts conversation after
    conversation until the time is up, then finishes the request it has in flight.
    """
    multi_turn = workload.turns > 1
    if multi_turn:
        requests = concurrency
    expected = concurrency * workload.turns if multi_turn else requests
    endpoint = base_url(url) + "/v1/chat/completions"
    results: list[RequestResult] = []
    long_results: list[RequestResult] = []
    gate, first_token = asyncio.Event(), asyncio.Event()
    next_index = 0  # shared counter; safe without a lock: only awaits switch tasks
    deadline: float | None = None  # perf_counter() time a soak ends; set when the clock starts
    local = is_loopback(url)
    # One TLS context for all users: building one loads the CA bundle (~10 ms of CPU each).
    tls = httpx.create_ssl_context()

    def user_client(i: int) -> httpx.AsyncClient:
        # One client per simulated user: its own connection and, on loopback, its own source
        # address, so the server sees an office of users rather than one very busy one.
        address = user_address(0 if workload.one_address else i) if local else None
        transport = httpx.AsyncHTTPTransport(
            verify=tls, local_address=address,
            limits=httpx.Limits(max_connections=2, max_keepalive_connections=2))
        return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)

    async with contextlib.AsyncExitStack() as stack:
        # Made before the clock starts: users 0..concurrency-1 are the workers, the last
        # one pastes the long document.
        clients = [await stack.enter_async_context(user_client(i))
                   for i in range(concurrency + (1 if workload.long_prompt_tokens else 0))]

        async def conversation(client: httpx.AsyncClient, k: int) -> None:
            # One session id for the whole conversation, so per-session caches can reuse it.
            session = f"bench-{uuid.uuid4()}"
            # Texts go by k, not by worker, so a run sends the same requests every time.
            prompt, pad = first_prompt(workload, k)
            messages = _opening(workload.system, prompt)
            for turn in range(1, workload.turns + 1):
                res = await _request(client, endpoint, workload, messages, timeout, session,
                                     first_token)
                res.turn, res.pad_tokens = turn, pad
                results.append(res)
                if progress is not None:
                    progress.update(results)
                if not res.ok or turn == workload.turns:
                    return  # done, or no answer to follow up on: this user gives up
                await asyncio.sleep(workload.think_s)
                if deadline is not None and time.perf_counter() >= deadline:
                    return  # the soak is over: no new turn
                messages += [{"role": "assistant", "content": res.text},
                             {"role": "user", "content": follow_up(workload, k, turn)}]

        async def worker(i: int) -> None:
            nonlocal next_index
            await gate.wait()
            if arrival == "staggered":
                await asyncio.sleep(i * stagger_s)
            while (next_index < requests if deadline is None else time.perf_counter() < deadline):
                k, next_index = next_index, next_index + 1
                await conversation(clients[i], k)
                if multi_turn and deadline is None:
                    return  # one user, one conversation: no worker takes a second one

        async def long_client() -> None:
            # Paste once the short streams are decoding, so the prefill lands mid-output.
            await first_token.wait()
            doc = long_document(workload.long_prompt_tokens)
            prompt = "Summarise the following document in three sentences.\n\n" + doc
            long_results.append(await _request(clients[-1], endpoint, workload,
                                               _opening(workload.system, prompt), timeout))

        async def ticker() -> None:
            # A soak's bar moves with the clock, not only when a request ends.
            while True:
                await asyncio.sleep(0.5)
                if progress is not None:
                    progress.update(results)

        workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        paster = asyncio.create_task(long_client()) if workload.long_prompt_tokens else None
        if progress is not None:
            progress.begin(f"{label} c={concurrency}", duration_s or expected, timed=duration_s is not None)
        tick = asyncio.create_task(ticker()) if progress is not None and duration_s else None
        t0 = time.perf_counter()
        deadline = t0 + duration_s if duration_s else None
        gate.set()
        try:
            await asyncio.gather(*workers)
        finally:
            if tick is not None:
                tick.cancel()
            if progress is not None:
                progress.end()
        wall = time.perf_counter() - t0
        first_token.set()  # all short requests failed: let the paste run anyway, then finish
        if paster is not None:
            await paster

    during: list[float] = []
    for lr in long_results:
        # A gap belongs to the long request's flight if the stalled token arrived within it.
        for r in results:
            if r.ok:
                t = r.token_times
                during += [b - a for a, b in zip(t, t[1:], strict=False) if lr.t_start < b <= lr.t_end]
    return LevelResult(label, concurrency, wall, results, long_results, during)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") \
            from None
    if not values:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    return values


def _concurrency_list(text: str) -> list[int]:
    levels = _int_list(text)
    if min(levels) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return levels


def _prompt_mix(text: str) -> tuple[int, ...]:
    sizes = _int_list(text)
    if min(sizes) < 0:
        raise argparse.ArgumentTypeError("prompt-mix sizes must be token counts >= 0")
    return tuple(sizes)


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return n


def _positive_float(text: str) -> float:
    x = float(text)
    if not x > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return x


def _non_negative_float(text: str) -> float:
    x = float(text)
    if not x >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return x


def _compare(text: str) -> tuple[str | None, str]:
    """--compare URL, or LABEL=URL (a label holds no ':' or '/', so a URL's query is no label)."""
    label, sep, url = text.partition("=")
    if sep and label and url and not any(ch in label for ch in ":/"):
        return label, url
    return None, text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--url", default="http://127.0.0.1:8080", help="server base URL (…/v1 also accepted)")
    a("--compare", metavar="[LABEL=]URL", type=_compare, action="append", default=[],
      help="another server measured in the same run, level by level; repeat for more "
           "(LABEL=URL names it, else --compare-label)")
    a("--label", default="appliance", help="name of --url in the report")
    a("--compare-label", default="peer", help="name of an unlabelled --compare in the report")
    a("--concurrency", type=_concurrency_list, default=None,
      help="comma-separated concurrency levels (default 1,4,8,16; burst: its size, "
           f"{BURST_SIZE}; soak: 8)")
    a("--requests", type=_positive_int, default=None,
      help="requests per level per server per round (default max(2*concurrency, 8); "
           "ignored by burst, soak and --turns > 1)")
    a("--workload", choices=tuple(PROMPT_SETS), default="chat",
      help="chat (default): office users asking short questions; with --turns T each client "
           "is one user holding a T-turn conversation that resends its growing history, "
           "pausing --think-s between turns. "
           "rewrite: paste a paragraph with typos or a code "
           "snippet with a bug and ask for it back fixed, so answers mostly copy the prompt "
           "(what n-gram speculative decoding speeds up); later --turns ask for the whole text "
           "again with another small edit. Use --max-tokens 160 --temperature 0 with it. "
           f"Both pick texts round-robin ({len(PROMPTS)} chat, {len(REWRITE_PROMPTS)} rewrite), "
           "so two runs send the same requests. "
           "burst: N requests for a 2-sentence product description let go at once from one "
           "address (one person's list of N products), N = each --concurrency level: reports "
           "how many came back and when the last did, and exits 1 unless all did. "
           "soak: chat at a steady --concurrency (default 8) for --duration-s per server, "
           "sampling the server's RSS (VmRSS of the process listening on a loopback port, or "
           "--pid) every --rss-every-s")
    a("--prompt-mix", type=_prompt_mix, default=None, metavar="N1,N2,...",
      help="put a ~N-token document before the first prompt of conversation i (request i; "
           "user i with --turns), N = N[i %% len] (0 = none), e.g. 20,60,150,300,600: with --arrival together and "
           "--concurrency 8 this measures TTFT for users arriving at once with prompts of mixed "
           "lengths (reported per size too). Default off")
    a("--max-tokens", type=_positive_int, default=64)
    a("--temperature", type=float, default=0.0)
    a("--system", default=DEFAULT_SYSTEM, help="shared system prompt")
    a("--model", default=None, help="model name (default: first id of GET /v1/models)")
    a("--timeout", type=_positive_float, default=300.0, help="seconds per request")
    a("--rounds", type=_positive_int, default=1,
      help="repeat each level, alternating server order per round (A B, B A, ...)")
    a("--arrival", choices=("together", "staggered"), default="together")
    a("--long-prompt-tokens", type=_positive_int, default=0, metavar="N",
      help="one extra client pastes a ~N-token document during each level")
    a("--fresh-system", action="store_true",
      help="tag the system prompt afresh per level, server and round: measures it uncached")
    a("--turns", type=_positive_int, default=1,
      help="> 1: each concurrent client is one user sending T turns of one growing "
           "conversation (--requests is then ignored; a failed turn ends that conversation)")
    a("--think-s", type=_non_negative_float, default=1.0,
      help="seconds a user pauses between an answer and its next turn (default 1.0)")
    a("--no-session-id", dest="session_ids", action="store_false",
      help="send no X-Session-Id, as most OpenAI clients do (users are then told apart "
           "by source address: on loopback each simulated user has its own 127.0.0.N)")
    a("--duration-s", type=_positive_float, default=180.0,
      help="soak: seconds of steady load per server and level (default 180)")
    a("--warmup-s", type=_non_negative_float, default=30.0,
      help="soak: the 'warm' RSS is the first sample this many seconds into the load (default 30)")
    a("--rss-every-s", type=_positive_float, default=5.0,
      help="soak: seconds between RSS samples (default 5)")
    a("--pid", type=_positive_int, default=None,
      help="soak: pid of the --url server (default: the process listening on its loopback port)")
    a("--json", metavar="PATH", help="also write the results as JSON")
    a("--jsonl", metavar="PATH",
      help="append one JSON line per level per server, so several runs can share a file "
           "(what --plot --from reads)")
    a("--tag", default="",
      help="name of this run in --jsonl lines and plot legends; with --from, the runs to draw "
           "(comma-separated; default all)")
    a("--markdown", action="store_true", help="print the report as Markdown tables")
    a("--quiet", action="store_true",
      help="no progress bar on stderr (there is none when stderr is not a terminal)")
    a("--plot", metavar="FILE.png",
      help="draw tokens/s and TTFT p50 against clients, one line per server and --tag: of "
           "this run, or with --from of JSONL files only (nothing is measured then). Needs "
           "matplotlib: pip install 'appliance[plot]'")
    a("--from", dest="plot_from", metavar="PATH", action="append", default=[],
      help="with --plot: a --jsonl file to draw (repeatable)")


def _targets(args: argparse.Namespace) -> list[tuple[str, str]]:
    targets = [(args.label, args.url)]
    unnamed = 0
    for label, url in args.compare:
        if label is None:
            unnamed += 1
            label = args.compare_label if unnamed == 1 else f"{args.compare_label}{unnamed}"
        targets.append((label, url))
    return targets


def run(args: argparse.Namespace) -> int:
    """Entry point of `appliance bench`.

    Exit codes: 0 every server completed requests (burst: all of them), 1 one did not (down,
    always rejecting, or a burst answer missing), 2 bad arguments or no plot, 130 interrupted
    (what was measured is still printed).
    """
    if args.plot_from:
        if not args.plot:
            print("bench: --from goes with --plot", file=sys.stderr)
            return 2
        try:
            records = read_jsonl(args.plot_from)
        except (OSError, ValueError) as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        if args.tag:
            tags = set(args.tag.split(","))
            records = [r for r in records if r.get("tag") in tags]
        return _plot(records, args.plot)
    targets = _targets(args)
    labels = [lb for lb, _ in targets]
    if len(set(labels)) < len(labels):
        print("bench: server labels must differ (--label, --compare-label, LABEL=URL)", file=sys.stderr)
        return 2
    progress = Progress(enabled=False if args.quiet else None)
    # Filled in as levels finish, so Ctrl-C still reports everything measured so far.
    done: dict[int, dict[str, LevelResult]] = {}
    rounds: dict[int, dict[str, list[LevelResult]]] = {}  # the same, round by round
    models: dict[str, str] = {}
    interrupted = False
    try:
        asyncio.run(_run(args, targets, models, done, rounds, progress))
    except KeyboardInterrupt:
        interrupted = True
        progress.end()
        print("\ninterrupted; results so far:")
    print(format_report(done, labels, workload=args.workload, markdown=args.markdown))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(_json_report(args, targets, models, done, rounds), f, indent=2)
            f.write("\n")
    records = jsonl_records(args, targets, models, done)
    if args.jsonl:
        with open(args.jsonl, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    if args.plot and (code := _plot(records, args.plot)):
        return code
    if interrupted:
        return 130
    levels = [lv[lb] for lv in done.values() for lb in labels if lb in lv]
    if args.workload == "burst" and any(len(lv.completed) < len(lv.results) for lv in levels):
        return 1  # every answer of a burst must come back
    completed = [sum(len(lv[lb].completed) for lv in done.values() if lb in lv) for lb in labels]
    return 0 if all(completed) else 1


async def _run(args: argparse.Namespace, targets: list[tuple[str, str]], models: dict[str, str],
               done: dict[int, dict[str, LevelResult]], rounds: dict[int, dict[str, list[LevelResult]]],
               progress: Progress | None = None) -> None:
    for lb, url in targets:
        models[lb] = args.model or await resolve_model(url)
    prompts, follow_ups = PROMPT_SETS[args.workload]
    base = Workload(prompts=prompts, follow_ups=follow_ups, prompt_mix=args.prompt_mix or (),
                    max_tokens=args.max_tokens, temperature=args.temperature,
                    long_prompt_tokens=args.long_prompt_tokens, turns=args.turns,
                    think_s=args.think_s, session_ids=args.session_ids,
                    one_address=args.workload == "burst")
    for c in args.concurrency or DEFAULT_LEVELS[args.workload]:
        n = c if args.workload == "burst" else args.requests or max(2 * c, 8)
        parts: dict[str, list[LevelResult]] = {lb: [] for lb, _ in targets}
        rounds[c] = parts
        for rnd in range(args.rounds):
            # Alternate who goes first so neither server always gets the cooler machine.
            order = targets if rnd % 2 == 0 else targets[::-1]
            for lb, url in order:
                system = fresh_system(args.system) if args.fresh_system else args.system
                wl = replace(base, model=models[lb], system=system)
                if args.workload == "soak":
                    lv = await soak(url, c, wl, args.duration_s, label=lb, timeout=args.timeout,
                                    arrival=args.arrival, pid=args.pid if lb == args.label else None,
                                    every_s=args.rss_every_s, warmup_s=args.warmup_s, progress=progress)
                else:
                    lv = await measure(url, c, n, wl, label=lb, timeout=args.timeout,
                                       arrival=args.arrival, progress=progress)
                parts[lb].append(lv)
                done[c] = {k: LevelResult.merge(v) for k, v in parts.items() if v}


async def soak(url: str, concurrency: int, workload: Workload, duration_s: float, *,
               label: str = "appliance", timeout: float = 300.0, arrival: Arrival = "together",
               pid: int | None = None, every_s: float = 5.0, warmup_s: float = 30.0,
               progress: Progress | None = None) -> LevelResult:
    """measure() for duration_s while the server's RSS is sampled every every_s: once before the
    load, then on the interval, then once after (no samples when its process is not found)."""
    found = server_pid(url, pid)
    if found is None:
        print(f"bench: no RSS for {label}: no process found behind {url} (give --pid)", file=sys.stderr)
    samples: list[tuple[float, float]] = []
    t0 = time.perf_counter()

    def take() -> None:
        if found is not None and (mib := rss_mib(found)) is not None:
            samples.append((time.perf_counter() - t0, mib))

    async def sampler() -> None:
        while True:
            await asyncio.sleep(every_s)
            take()

    take()
    task = asyncio.create_task(sampler())
    try:
        level = await measure(url, concurrency, 0, workload, label=label, timeout=timeout,
                              arrival=arrival, duration_s=duration_s, progress=progress)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    take()
    level.rss_mib, level.warmup_s = samples, warmup_s
    return level


def _ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 3) if num is not None and den else None


def _ratios(level: dict[str, LevelResult], a: str, b: str) -> dict[str, float | None]:
    """tokens/s a/b and TTFT p50 b/a (all turns, turns 2..T): all > 1 when `a` is better."""
    def ttft(label: str, later: bool | None = None) -> float | None:
        return percentile(level[label].ttfts(later), 50)

    return {"tokens_per_s": _ratio(level[a].tokens_per_s, level[b].tokens_per_s),
            "ttft_p50": _ratio(ttft(b), ttft(a)),
            "later_ttft_p50": _ratio(ttft(b, True), ttft(a, True))}


def _level_ratios(level: dict[str, LevelResult], labels: list[str]) -> dict[str, dict[str, float | None]]:
    """The first server against each other one measured at this level."""
    a = labels[0]
    return {b: _ratios(level, a, b) for b in labels[1:] if a in level and b in level}


def _ratio_row(b: str, labels: list[str]) -> str:
    return "ratio" if len(labels) == 2 else f"ratio {b}"


_COLUMNS = [("ok", "completed", 5), ("rej", "rejected", 5), ("fail", "failed", 5),
            ("tok/s", "tokens_per_s", 8), ("req/min", "requests_per_min", 8),
            ("ttft50", "ttft_ms_p50", 8), ("ttft95", "ttft_ms_p95", 8),
            ("e2e50", "e2e_ms_p50", 8), ("e2e95", "e2e_ms_p95", 8),
            ("itl50", "itl_ms_p50", 7), ("itl95", "itl_ms_p95", 7),
            ("itl95@long", "itl_ms_p95_during_long", 11), ("itlmax@long", "itl_ms_max_during_long", 12)]
# Shown as a second table when a run had multi-turn conversations.
_TURN_COLUMNS = [("ttft50@1", "turn1_ttft_ms_p50", 10), ("ttft95@1", "turn1_ttft_ms_p95", 10),
                 ("ttft50@2+", "later_ttft_ms_p50", 11), ("ttft95@2+", "later_ttft_ms_p95", 11)]
# Which _ratios entry the ratio row shows under which column.
_RATIO_OF = {"tokens_per_s": "tokens_per_s", "ttft_ms_p50": "ttft_p50",
             "later_ttft_ms_p50": "later_ttft_p50"}


def _cell(v: Any, width: int = 0) -> str:
    if v is None:
        return "-".rjust(width)
    return (f"{v:.1f}" if isinstance(v, float) else str(v)).rjust(width)


def _render(head: list[str], rows: list[list[str]], note: str, markdown: bool,
            widths: list[int] | None = None) -> list[str]:
    """Rows of cells as a fixed-width table (conc, server, then right-aligned columns) or as
    Markdown, where columns with nothing in them are left out."""
    if markdown:
        keep = [i for i in range(len(head)) if i < 2 or any(r[i] not in ("", "-") for r in rows)]
        line = lambda cells: "| " + " | ".join(cells[i] for i in keep) + " |"
        return ([line(head), "|" + "|".join(":---" if i == 1 else "---:" for i in keep) + "|"]
                + [line(r) for r in rows] + ["", f"({note})"])
    if widths is None:
        widths = [max(len(x) for x in col) + (2 if i > 1 else 0)
                  for i, col in enumerate(zip(head, *rows, strict=True))]
    fixed = lambda cells: (cells[0].rjust(widths[0]) + "  " + cells[1].ljust(widths[1])
                           + "".join(x.rjust(w) for x, w in zip(cells[2:], widths[2:], strict=True)))
    return [fixed(head) + f"   ({note})"] + [fixed(r).rstrip() for r in rows]


def _table(done: dict[int, dict[str, LevelResult]], labels: list[str],
           columns: list[tuple[str, str, int]], lw: int, note: str, markdown: bool = False) -> list[str]:
    rows = []
    for c, level in done.items():
        for lb in labels:
            if lb in level:
                s = level[lb].summary()
                rows.append([str(c), lb] + [_cell(s[k]) for _, k, _ in columns])
        for b, r in _level_ratios(level, labels).items():
            rows.append([str(c), _ratio_row(b, labels)]
                        + [f"{v:.2f}x" if (v := r.get(_RATIO_OF.get(k, ""))) is not None else ""
                           for _, k, _ in columns])
    head = ["conc", "server"] + [h for h, _, _ in columns]
    return _render(head, rows, note, markdown, [4, lw] + [w for *_, w in columns])


def _pad_table(done: dict[int, dict[str, LevelResult]], labels: list[str], lw: int,
               markdown: bool = False) -> list[str]:
    columns = [("ok", "completed", 5), ("prompt", "prompt_tokens", 8),
               ("ttft50", "ttft_ms_p50", 8), ("ttft95", "ttft_ms_p95", 8)]
    rows = [[str(c), lb, pad] + [_cell(s[k]) for _, k, _ in columns]
            for c, level in done.items() for lb in labels
            for pad, s in (level[lb].by_pad() if lb in level else {}).items()]
    return _render(["conc", "server", "pad"] + [h for h, _, _ in columns], rows,
                   "turn 1 by --prompt-mix document, tokens; times in ms", markdown,
                   [4, lw, 6] + [w for *_, w in columns])


def _burst_table(done: dict[int, dict[str, LevelResult]], labels: list[str], markdown: bool) -> list[str]:
    rows = []
    for c, level in done.items():
        for lb in labels:
            if lb in level:
                s = level[lb].summary()
                rows.append([str(c), lb, f"{s['completed']}/{s['requests']}", _cell(s["last_answer_s"]),
                             _cell(s["ttft_ms_p50"]), _cell(s["ttft_ms_p95"]), _cell(s["tokens_per_s"])])
    return _render(["burst", "server", "back", "last s", "ttft50", "ttft95", "tok/s"], rows,
                   "answers back of those sent at once; seconds until the last one; TTFT in ms",
                   markdown)


def _soak_table(done: dict[int, dict[str, LevelResult]], labels: list[str], markdown: bool) -> list[str]:
    rows = []
    for c, level in done.items():
        for lb in labels:
            if lb in level:
                lv = level[lb]
                rss = lv.rss_points()
                growth = (f"{(rss['end'] - rss['warm']) / rss['warm'] * 100:+.1f}%"
                          if rss["end"] is not None and rss["warm"] else "-")
                rows.append([str(c), lb, str(len(lv.results)), str(len(lv.completed)),
                             str(lv.num_rejected), str(lv.num_failed), _cell(round(lv.wall_s, 1)),
                             *(_cell(rss[k]) for k in ("start", "warm", "end", "max")), growth])
    warm = next((lv.warmup_s for level in done.values() for lv in level.values()), 0.0)
    return _render(["conc", "server", "tried", "answered", "refused", "failed", "s",
                    "rss0", "rss@warm", "rss end", "rss max", "end/warm"], rows,
                   f"refused = 429/503; RSS in MiB before the load, {warm:g} s into it, after it, "
                   "highest", markdown)


def format_report(done: dict[int, dict[str, LevelResult]], labels: list[str], *,
                  workload: str = "chat", markdown: bool = False) -> str:
    """Fixed-width (or Markdown) tables: per turn if multi-turn, per document size if
    --prompt-mix, a burst's answers back, a soak's RSS; ratio rows are >1 when the first is better."""
    lw = max(len(lb) for lb in labels + [_ratio_row(b, labels) for b in labels[1:]] + ["ratio"])
    lines = _table(done, labels, _COLUMNS, lw, "times in ms", markdown)
    multi_turn = any(r.turn > 1 for level in done.values() for lv in level.values()
                     for r in lv.results)
    if multi_turn:
        lines += [""] + _table(done, labels, _TURN_COLUMNS, lw, "TTFT of turn 1 / turns 2+, ms", markdown)
    if any(lv.by_pad() for level in done.values() for lv in level.values()):
        lines += [""] + _pad_table(done, labels, lw, markdown)
    if workload == "burst" and done:
        lines += [""] + _burst_table(done, labels, markdown)
    if workload == "soak" and done:
        lines += [""] + _soak_table(done, labels, markdown)
    later = ", ttft50@2+ = {b}/{a}" if multi_turn else ""
    if len(labels) == 2:
        a, b = labels
        lines.append(f"ratio: tok/s = {a}/{b}, ttft50 = {b}/{a}{later.format(a=a, b=b)} (>1 = {a} is better)")
    elif len(labels) > 2:
        a = labels[0]
        lines.append(f"ratio X: tok/s = {a}/X, ttft50 = X/{a}{later.format(a=a, b='X')} (>1 = {a} is better)")
    notes = [f"  c={c} {lb}: " + ", ".join(f"{r} x{n}" for r, n in why.items())
             for c, level in done.items() for lb in labels
             if lb in level and (why := level[lb].failure_reasons)]
    if notes:
        lines += ["failures:"] + notes
    return "\n".join(lines)


def _median_of_rounds(parts: list[LevelResult]) -> dict[str, float | None]:
    """Each round measured on its own, then the median across rounds: robust to one noisy round."""
    def med(values: list[float | None]) -> float | None:
        vals = [v for v in values if v is not None]
        return round(statistics.median(vals), 2) if vals else None

    return {"tokens_per_s": med([p.tokens_per_s for p in parts]),
            "ttft_ms_p50": med([_ms(percentile(p.ttfts(), 50)) for p in parts]),
            "later_ttft_ms_p50": med([_ms(percentile(p.ttfts(True), 50)) for p in parts])}


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    soak = args.workload == "soak"
    return {"workload": args.workload,
            "prompt_mix": list(args.prompt_mix) if args.prompt_mix else None,
            "max_tokens": args.max_tokens, "temperature": args.temperature,
            "rounds": args.rounds, "arrival": args.arrival,
            "long_prompt_tokens": args.long_prompt_tokens,
            "fresh_system": args.fresh_system, "turns": args.turns,
            "think_s": args.think_s, "session_ids": args.session_ids,
            "requests": args.requests, "timeout": args.timeout,
            "duration_s": args.duration_s if soak else None,
            "warmup_s": args.warmup_s if soak else None,
            "rss_every_s": args.rss_every_s if soak else None}


def _json_report(args: argparse.Namespace, targets: list[tuple[str, str]],
                 models: dict[str, str], done: dict[int, dict[str, LevelResult]],
                 rounds: dict[int, dict[str, list[LevelResult]]] | None = None) -> dict[str, Any]:
    labels = [lb for lb, _ in targets]
    levels = []
    for c, level in done.items():
        entry: dict[str, Any] = {"concurrency": c,
                                 "results": {lb: lv.summary() for lb, lv in level.items()}}
        ratios = _level_ratios(level, labels)
        if len(labels) == 2 and ratios:
            entry["ratio"] = ratios[labels[1]]
        if ratios:
            entry["ratios"] = ratios  # {other server: first vs it}
        if rounds and args.rounds > 1:
            entry["median_of_rounds"] = {lb: _median_of_rounds(parts) for lb, parts in rounds[c].items()}
        levels.append(entry)
    return {
        "servers": [{"label": lb, "url": url, "model": models.get(lb)} for lb, url in targets],
        "settings": _settings(args),
        "percentiles": "linear interpolation between closest ranks",
        "levels": levels,
    }


def jsonl_records(args: argparse.Namespace, targets: list[tuple[str, str]],
                  models: dict[str, str], done: dict[int, dict[str, LevelResult]]) -> list[dict[str, Any]]:
    """One record per level per server: the summary, what was run, and (for every server but
    the first) the first one's ratios against it."""
    labels = [lb for lb, _ in targets]
    urls = dict(targets)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    records = []
    for level in done.values():
        ratios = _level_ratios(level, labels)
        for lb in labels:
            if lb in level:
                rec = {"time": when, "tag": args.tag, "workload": args.workload, "url": urls[lb],
                       "model": models.get(lb), **level[lb].summary(), "settings": _settings(args)}
                if lb in ratios:
                    rec["ratio"] = {"of": labels[0], **ratios[lb]}
                records.append(rec)
    return records


def read_jsonl(paths: list[str]) -> list[dict[str, Any]]:
    """Every record of the given --jsonl files, in order; blank lines are skipped."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    raise ValueError(f"{path}:{n}: not a JSON line") from None
                if not isinstance(rec, dict) or not {"label", "concurrency"} <= rec.keys():
                    raise ValueError(f"{path}:{n}: not an `appliance bench --jsonl` record")
                records.append(rec)
    return records


class PlotError(Exception):
    """--plot cannot draw: matplotlib is missing, or there is nothing to draw."""


def plot(records: list[dict[str, Any]], path: str) -> None:
    """tokens/s and TTFT p50 against clients: one colour per server, one line style per run
    (--tag, else workload); a later record of the same line and level replaces an earlier one."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'appliance[plot]' "
                        "(.venv/bin/pip install -e '.[plot]')") from None
    matplotlib.use("Agg")  # files only: no display needed
    pyplot = importlib.import_module("matplotlib.pyplot")
    if not records:
        raise PlotError("nothing to plot")
    series: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in records:
        run = str(r.get("tag") or r.get("workload") or "")
        series.setdefault((str(r["label"]), run), {})[int(r["concurrency"])] = r
    labels = list(dict.fromkeys(lb for lb, _ in series))
    runs = list(dict.fromkeys(run for _, run in series))

    def values(points: dict[int, dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
        return [v * scale if isinstance(v := points[x].get(key), int | float) else math.nan
                for x in sorted(points)]

    fig, (tps, ttft) = pyplot.subplots(1, 2, figsize=(8.0, 3.4), dpi=100)
    for (label, run), points in series.items():
        xs = sorted(points)
        style = {"marker": "o", "color": f"C{labels.index(label) % 10}",
                 "linestyle": ("-", "--", ":", "-.")[runs.index(run) % 4],
                 "label": label + (f" ({run})" if len(runs) > 1 else "")}
        tps.plot(xs, values(points, "tokens_per_s"), **style)
        ttft.plot(xs, values(points, "ttft_ms_p50", 1e-3), **style)
    clients = sorted({x for points in series.values() for x in points})
    for ax, title, ylabel in ((tps, "Throughput", "tokens/s, all clients"),
                              (ttft, "Time to first token", "TTFT p50, s (log)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("clients")
        ax.set_ylabel(ylabel)
        ax.set_xticks(clients)
        ax.grid(alpha=0.3)
    tps.set_ylim(bottom=0)
    # A server that queues requests one by one is 10-100x slower to its first token at 8
    # clients than one that batches: on a linear axis the batching servers merge into one line.
    ttft.set_yscale("log")
    handles, names = tps.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 3), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * ((len(names) + 2) // 3) + 0.02, 1, 1))
    fig.savefig(path)
    pyplot.close(fig)


def _plot(records: list[dict[str, Any]], path: str) -> int:
    try:
        plot(records, path)
    except PlotError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    print(f"plot: {path}", file=sys.stderr)
    return 0
