"""`appliance status`: the admin page's "now" and today's usage per person in a terminal
(like `ollama ps`), read from a running server's GET /admin/status.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import urllib.error
import urllib.request
from typing import Any

from appliance.config import Config
from appliance.ops import address

KEY_ENV = "APPLIANCE_ADMIN_KEY"  # an admin key, for a server on another machine


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="", help="the server's root URL (default: this machine, the config's port)")
    p.add_argument("--key", default="", help=f"an admin API key, for a server on another machine (or ${KEY_ENV})")
    p.add_argument("--json", action="store_true", help="print the status JSON as it came")


def status_url(cfg: Config, url: str = "") -> str:
    """The status endpoint: `url`'s root if given, else this machine's server by the config."""
    if not url:
        scheme = address.scheme(cfg)
        host = "127.0.0.1" if cfg.host in ("0.0.0.0", "", "127.0.0.1") else ("[::1]" if cfg.host == "::" else cfg.host)
        url = f"{scheme}://{host}:{cfg.port}"
    return url.rstrip("/") + "/admin/status"


def fetch(url: str, key: str = "", timeout_s: float = 5.0) -> dict[str, Any]:
    """The status JSON; raises OSError (unreachable) or ValueError (refused, not JSON) with a sentence."""
    headers = {"Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, headers=headers)
    # A self-signed certificate on this machine's own server is the usual case for https here.
    context = ssl._create_unverified_context() if url.startswith("https://127.") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        why = "only from the server's machine, or with an admin key (--key or $" + KEY_ENV + ")" \
            if e.code in (401, 403) else f"HTTP {e.code}"
        raise ValueError(f"{url}: refused: {why}") from None
    except urllib.error.URLError as e:
        raise OSError(f"{url}: cannot reach the server ({e.reason}); is it running?") from None
    if not isinstance(body, dict) or "now" not in body:
        raise ValueError(f"{url}: not an appliance status answer")
    return body


def _mib(n: int | None) -> str:
    return f"{(n or 0) / 2**20:,.0f} MiB"


def _uptime(s: int) -> str:
    d, rest = divmod(int(s), 86400)
    h, m = rest // 3600, rest % 3600 // 60
    return f"{d} d {h} h" if d else f"{h} h {m} min" if h else f"{m} min"


def render(body: dict[str, Any]) -> str:
    """The "now" view and today's usage per person, as aligned lines."""
    n = body["now"]
    mem, heat, dog, slots = n["memory"], n["thermal"], n["watchdog"], n["slots"]
    quant = f" ({n['quant']})" if n.get("quant") else ""
    temp = "–" if heat.get("max_c") is None else f"{heat['max_c']:.0f} °C"
    wait = f" (wait ~{n['wait_s']} s)" if n["queue"] and n.get("wait_s") is not None else ""
    lines = [
        f"model      {n['model']}{quant}: {n['state']}, up {_uptime(n['uptime_s'])}",
        f"slots      {slots['busy']} busy, {slots['idle']} idle of {slots['total']}; queue {n['queue']}{wait}",
        f"tokens/s   {n['tokens_per_s']:,.1f}  ({n['generated_tokens']:,} generated since start)",
        f"memory     RSS {_mib(mem['rss_bytes'])}, parked {_mib(mem['parked_bytes'])} of "
        f"{_mib(mem['park_budget_bytes'])}, {_mib(mem['available_bytes'])} available",
        f"cpu        {temp}, {'THROTTLED' if heat['throttled'] else 'not throttled'}; watchdog "
        + ("ok" if dog["ok"] else f"STALLED {dog['stalled_s']} s"),
        f"clients    {n['active_clients']} active in the last 5 min",
    ]
    box = n.get("box")
    if box is not None:
        lines.insert(0, f"box        {box['url']} (mDNS: {box['mdns']})")
    state = n.get("state_dir")
    if state is not None and not state.get("writable", True):
        lines.append(f"state dir  NOT WRITABLE: {state.get('error') or '?'} (counting in memory, retried every minute)")
    people = body.get("people") or []
    if people:
        width = max(12, *(len(p["who"]) for p in people))
        lines += ["", f"{'TODAY':<{width}}  {'REQUESTS':>8}  {'PROMPT':>9}  {'CACHED':>9}  {'GENERATED':>9}  "
                      f"{'REFUSED':>7}  QUOTA"]
        for p in people:
            t = p["today"]
            quota = f"{p['quota']:,}" + (" (reached)" if p["at_limit"] else "") if p.get("quota") else "-"
            lines.append(f"{p['who']:<{width}}  {t['requests']:>8,}  {t['prompt_tokens']:>9,}  {t['cached_tokens']:>9,}  "
                         f"{t['generated_tokens']:>9,}  {t['refusals']:>7,}  {quota}")
    return "\n".join(lines)


def run(cfg: Config, url: str = "", key: str = "", as_json: bool = False) -> tuple[int, str]:
    """(exit code, what to print) for `appliance status`."""
    target = status_url(cfg, url)
    try:
        body = fetch(target, key or os.environ.get(KEY_ENV, ""))
    except (OSError, ValueError) as e:
        return 1, f"appliance status: {e}"
    return 0, json.dumps(body, indent=2) if as_json else render(body)
