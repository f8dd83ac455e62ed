#!/usr/bin/env python3
"""Tool round trips on a running server (docs/benchmarks/structured.md, issue 37): does the
model answer after a tool's result, or call the same tool again?

Each case is an office question with four tools offered (`tool_choice` auto, temperature 0):
the first request should call a tool; its result (computed here from the arguments) goes
back as a `tool` message, and the second request is classified:

- answer: text and no tool call (the round trip ends);
- repeat: the identical call again (same name, same arguments), as a call or as the text the
  answer opens with: the failure issue 37 names;
- other: a different call; its result goes back too, up to three calls in all.

    bench/structured/tool-round-trips.py --url http://127.0.0.1:8080 [--json FILE]

Prints one line per case and the shares; a case whose first answer calls no tool is counted
apart ("no call"), not in the shares.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx


def fn(fname: str, description: str, **props: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": fname, "description": description,
        "parameters": {"type": "object", "required": list(props),
                       "properties": {k: {"type": "string", "description": v} for k, v in props.items()}}}}


TOOLS = [
    fn("get_weather", "Current weather in a city", city="the city's name"),
    fn("lookup_employee", "An employee's phone, office and role", name="the person's full name"),
    fn("convert_currency", "Convert an amount between currencies", amount="the amount, a number",
       source="ISO code to convert from", target="ISO code to convert to"),
    fn("book_room", "Book a meeting room", room="the room's name", time="start, e.g. 14:00"),
]

CASES = [
    "What is the weather in Oslo right now?",
    "Is it raining in Lisbon?",
    "How warm is it in Berlin today?",
    "What's Anna Berg's phone number?",
    "Which office is Tom Keller in?",
    "What does Maria Rossi do here?",
    "How much is 120 EUR in USD?",
    "Convert 5000 JPY to GBP.",
    "What are 300 CHF in EUR?",
    "Book the Fjord room at 14:00.",
    "Please reserve room Atlas for 9:30.",
    "Get me the Harbour room at 16:00 for the review.",
]


def result(name: str, args: dict[str, Any]) -> str:
    """A plausible tool result for the call (the model only needs something to report)."""
    if name == "get_weather":
        return json.dumps({"city": args.get("city"), "temperature_c": 7, "sky": "light rain", "wind_kmh": 18})
    if name == "lookup_employee":
        return json.dumps({"name": args.get("name"), "phone": "+47 555 0101", "office": "Building B, 3rd floor",
                           "role": "project manager"})
    if name == "convert_currency":
        return json.dumps({"amount": args.get("amount"), "from": args.get("source"), "to": args.get("target"),
                           "result": 131.4, "rate_date": "2026-12-04"})
    if name == "book_room":
        return json.dumps({"room": args.get("room"), "time": args.get("time"), "booked": True,
                           "booking_id": "R-2291"})
    return json.dumps({"error": f"no tool named {name}"})


def call(client: httpx.Client, url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    r = client.post(f"{url}/v1/chat/completions", json={
        "messages": messages, "tools": TOOLS, "tool_choice": "auto", "temperature": 0, "max_tokens": 160})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    fa, fb = a["function"], b["function"]
    return fa["name"] == fb["name"] and json.loads(fa["arguments"] or "{}") == json.loads(fb["arguments"] or "{}")


def text_call(content: str) -> dict[str, Any] | None:
    """A call the answer's text opens with (tagged, bare or fenced JSON), as the model wrote it
    where the server did not take it as a call: the repeat then reaches the user as text."""
    s = content.strip().removeprefix("<tool_call>").strip()
    s = s.removeprefix("```json").removeprefix("```").strip()
    try:
        obj, _ = json.JSONDecoder().raw_decode(s)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "name" not in obj:
        return None
    args = obj.get("arguments", {})
    return {"function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def round_trip(client: httpx.Client, url: str, question: str) -> tuple[str, str]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    made: list[dict[str, Any]] = []
    for _hop in range(3):
        msg = call(client, url, messages)
        calls = msg.get("tool_calls") or []
        if not calls:
            written = text_call(msg.get("content") or "")
            if made and written is not None and any(same(written, m) for m in made):
                return "repeat", "as text: " + (msg.get("content") or "")[:100]
            return ("answer" if made else "no call"), (msg.get("content") or "")[:100]
        if any(same(c, m) for c in calls for m in made):
            return "repeat", calls[0]["function"]["name"] + " " + calls[0]["function"]["arguments"]
        made += calls
        messages.append({"role": "assistant", "content": msg.get("content"), "tool_calls": calls})
        for c in calls:
            args = json.loads(c["function"]["arguments"] or "{}")
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result(c["function"]["name"], args)})
    return "other", "three calls, no answer"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--json", help="write the outcomes here")
    a = ap.parse_args()
    outcomes: list[dict[str, str]] = []
    with httpx.Client(timeout=600, trust_env=False) as client:
        for q in CASES:
            outcome, detail = round_trip(client, a.url.rstrip("/"), q)
            outcomes.append({"question": q, "outcome": outcome, "detail": detail})
            print(f"{outcome:8} {q}  ->  {detail!r}", flush=True)
    called = [o for o in outcomes if o["outcome"] != "no call"]
    counts = {k: sum(1 for o in called if o["outcome"] == k) for k in ("answer", "repeat", "other")}
    print(f"round trips: {len(called)} of {len(outcomes)} cases called a tool; "
          + ", ".join(f"{k} {v} ({v / max(1, len(called)):.0%})" for k, v in counts.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"outcomes": outcomes, "counts": counts}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
