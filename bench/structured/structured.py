#!/usr/bin/env python3
"""What structured output and n cost, measured side by side (docs/benchmarks/structured.md):

- a JSON-schema grammar against free text, at 1 and 8 concurrent clients, on the appliance
  and on llama-server (both through `response_format`, same prompts, greedy, same max_tokens);
- `n=4` in one request against four separate requests sent together (the appliance only:
  llama-server's chat endpoint has no `n`).

    bench/structured/structured.py --appliance http://127.0.0.1:8080 --peer http://127.0.0.1:18080

Prints one table and, with --json FILE, writes the figures. Ratios from one run only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "city", "phone", "kind", "vip"],
          "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                         "phone": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                         "kind": {"type": "string", "enum": ["customer", "supplier", "partner", "other"]},
                         "vip": {"type": "boolean"}}}
PROMPTS = [
    "Anna Berg lives in Oslo, phone 555-0101. She is a VIP customer. Reply with her contact as JSON.",
    "Tom from Lyon is a supplier, no phone. Reply with his contact as JSON.",
    "Dr. Li Wei, Shanghai office, +86 21 5555 0000, key account. Reply with the contact as JSON.",
    "Maria Rossi, Rome, press contact, not a VIP. Reply with her contact as JSON.",
    "Jonas from Berlin, mobile 0170 5555555, a partner. Reply with his contact as JSON.",
    "Priya Nair, Bangalore, interested in the cloud plan. Reply with her contact as JSON.",
    "Kenji Sato, Osaka, 06-5555-1234, customer. Reply with his contact as JSON.",
    "Fatima Zahra, Casablanca, VIP since 2019. Reply with her contact as JSON.",
]
MAX_TOKENS = 64


def post(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return dict(r.json())


def throughput(url: str, clients: int, grammar: bool, rounds: int) -> float:
    """Completion tokens per second over `rounds` waves of `clients` concurrent requests."""
    def one(i: int) -> int:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                "max_tokens": MAX_TOKENS, "temperature": 0}
        if grammar:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "contact", "schema": SCHEMA}}
        with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:
            return int(post(c, body)["usage"]["completion_tokens"])

    tokens, t0 = 0, time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for r in range(rounds):
            tokens += sum(pool.map(one, range(r * clients, (r + 1) * clients)))
    return tokens / (time.perf_counter() - t0)


def computed(url: str) -> int:
    return int(httpx.get(url + "/health", trust_env=False).json()["engine"]["prompt_tokens_computed"])


def n_versus_separate(url: str) -> dict[str, float]:
    system = "You are a poet who writes about the sea. " * 30  # a prompt worth sharing
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "One line, please."}],
            "max_tokens": 32, "temperature": 0.8, "seed": 1}
    out: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:
        before, t0 = computed(url), time.perf_counter()
        post(c, {**body, "n": 4})
        out["n4_s"], out["n4_prompt_computed"] = time.perf_counter() - t0, computed(url) - before
    # Fresh words so nothing is cached from the n=4 run, then 4 requests sent together.
    body["messages"][0]["content"] = "You are a poet who writes about mountains. " * 30

    def one(i: int) -> None:
        with httpx.Client(base_url=url, timeout=600, trust_env=False) as c2:
            post(c2, {**body, "seed": i})

    before, t0 = computed(url), time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    out["separate_s"], out["separate_prompt_computed"] = time.perf_counter() - t0, computed(url) - before
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appliance", required=True)
    ap.add_argument("--peer", help="llama-server's URL")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", dest="json_path")
    a = ap.parse_args()
    rows: dict[str, dict[str, float]] = {}
    for name, url in (("appliance", a.appliance), ("llama-server", a.peer)):
        if not url:
            continue
        throughput(url, 1, True, 1)  # warm up (and compile the grammar once)
        for clients in (1, 8):
            free = throughput(url, clients, False, a.rounds)
            schema = throughput(url, clients, True, a.rounds)
            rows[f"{name} {clients}"] = {"free_tok_s": free, "schema_tok_s": schema, "ratio": schema / free}
            print(f"{name:13} {clients} clients: free {free:6.1f} tok/s, schema {schema:6.1f} tok/s, "
                  f"grammar keeps {schema / free:.2f}x", flush=True)
    n4 = n_versus_separate(a.appliance)
    print(f"appliance n=4: {n4['n4_s']:.1f} s, prompt tokens computed {n4['n4_prompt_computed']:.0f}; "
          f"4 separate requests: {n4['separate_s']:.1f} s, computed {n4['separate_prompt_computed']:.0f}")
    if a.json_path:
        with open(a.json_path, "w") as f:
            json.dump({"grammar": rows, "n4": n4}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
