"""Where the appliance's engine time went during a run: its /metrics counters read before and
after (appliance_engine_seconds, appliance_batch_rows, ...), as a breakdown. A server without
them (llama-server) has none; the bench stays a plain HTTP client of either."""

from __future__ import annotations

import re

import httpx

_LINE = re.compile(r'^(appliance_[a-z_]+)(?:\{([a-z]+)="([^"]*)"\})?\s+([-+0-9.eE]+|NaN)$')
_WANTED = ("appliance_engine_seconds", "appliance_batch_rows", "appliance_decode_steps",
           "appliance_generated_tokens", "appliance_prompt_tokens_received", "appliance_prompt_tokens_computed",
           "appliance_session_events", "appliance_queue_wait_seconds_sum", "appliance_queue_wait_seconds_count")


def parse(text: str) -> dict[str, float]:
    """The wanted counters of a Prometheus text page, as {"name" or "name:label": value}
    (the _total suffix prometheus_client adds is dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name = m.group(1).removesuffix("_total")
        if name in _WANTED:
            out[name + (f":{m.group(3)}" if m.group(2) else "")] = float(m.group(4))
    return out


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float] | None:
    """The counters of GET url (a server's /metrics); None when it has none or does not answer."""
    try:
        resp = await client.get(url)
    except httpx.HTTPError:
        return None
    counters = parse(resp.text) if resp.status_code == 200 else {}
    return counters if "appliance_decode_steps" in counters else None


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the counters added over a run (rounds' deltas add up)."""
    return {k: after[k] - before.get(k, 0.0) for k in after}


def add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()}


def breakdown(d: dict[str, float], wall_s: float) -> dict[str, float]:
    """A run's engine time by phase (s and share of the wall time), its rows by kind, rows
    per step, restores and recomputes, and the mean wait for a slot, from its counters' delta."""
    out: dict[str, float] = {"wall_s": round(wall_s, 2)}
    for phase in ("decode", "sample", "admit", "other", "idle"):
        sec = d.get(f"appliance_engine_seconds:{phase}", 0.0)
        out[f"{phase}_s"] = round(sec, 2)
        out[f"{phase}_share"] = round(sec / wall_s, 3) if wall_s > 0 else 0.0
    steps = d.get("appliance_decode_steps", 0.0)
    rows = {kind: d.get(f"appliance_batch_rows:{kind}", 0.0) for kind in ("decode", "prefill", "draft")}
    out.update(steps=steps, decode_rows=rows["decode"], prefill_rows=rows["prefill"], draft_rows=rows["draft"],
               rows_per_step=round(sum(rows.values()) / steps, 1) if steps else 0.0,
               decode_rows_per_step=round(rows["decode"] / steps, 1) if steps else 0.0,
               generated=d.get("appliance_generated_tokens", 0.0),
               prompt_received=d.get("appliance_prompt_tokens_received", 0.0),
               prompt_computed=d.get("appliance_prompt_tokens_computed", 0.0),
               restored=d.get("appliance_session_events:restored", 0.0),
               recomputed=d.get("appliance_session_events:recomputed", 0.0),
               parked=d.get("appliance_session_events:parked", 0.0),
               promoted=d.get("appliance_session_events:promoted", 0.0))
    waits = d.get("appliance_queue_wait_seconds_count", 0.0)
    out["slot_wait_ms_mean"] = round(1000 * d.get("appliance_queue_wait_seconds_sum", 0.0) / waits, 1) if waits else 0.0
    out["slot_waits"] = waits
    # llama_decode's own pace over the run: what a roof from llama-batched-bench compares with.
    dec = out["decode_s"]
    out["decode_rows_per_s"] = round(sum(rows.values()) / dec, 1) if dec else 0.0
    return out
