"""The operator's view: GET /admin (the live status page), GET /admin/status (the JSON it
polls: now, the last hour and day per minute, usage per person) and GET /admin/usage.csv
(the daily table). The guard lets only this machine or an admin key in. Counts only: no
message text is held anywhere this module reads.
"""

from __future__ import annotations

import csv
import io
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from appliance import cpu
from appliance.http.accounting import identity
from appliance.http.guard import Caller
from appliance.http.keys import KeyRing
from appliance.http.state import App
from appliance.usage.store import COLUMNS, Tally

_QUANT = re.compile(r"(?:^|[-_.])((?:i?q\d[a-z0-9_]*)|bf16|f16|f32)$", re.IGNORECASE)


async def page(app: App, request: Request) -> Response:
    return FileResponse(app.web_dir / "admin.html")


async def status(app: App, request: Request) -> Response:
    acct = app.usage
    return JSONResponse({
        "now": now(app),
        "hour": acct.minutes.series(60),
        "day": acct.minutes.series(24 * 60, step=10),
        "people": people(app),
        "persistent": acct.ledger.persistent,
        "workers": [{"name": h.name, "alive": h.alive, "depth": h.depth} for h in app.workers()],
    }, headers={"Cache-Control": "no-store"})


def now(app: App) -> dict[str, Any]:
    """The engine's published snapshot, the sensors and the minute ring: what is happening."""
    from appliance.cpu import SENSORS  # as /health does: the sensors are read here, cached for 1 s

    e, snap = app.engine, app.engine.snapshot
    mem, heat = SENSORS.read()
    stalled = e.stalled_s
    quant = _QUANT.search(app.model_id)
    return {
        "model": app.model_id, "quant": quant.group(1).upper() if quant else None,
        "state": "stalled" if stalled else e.state.value, "uptime_s": int(time.time()) - app.created,
        "slots": {"total": snap.slots, "busy": snap.running, "idle": snap.slots - snap.running},
        "queue": snap.queue, "wait_s": app.wait_estimate(snap.queue + 1) if snap.queue else 0,
        "tokens_per_s": app.usage.rate.sample(time.monotonic(), snap.counters.generated_tokens),
        "generated_tokens": snap.counters.generated_tokens,
        "requests": dict(snap.counters.finished),
        "memory": {"rss_bytes": cpu.rss_bytes(), "parked_bytes": snap.parked_bytes,
                   "park_budget_bytes": snap.park_budget, "available_bytes": mem.available,
                   "total_bytes": mem.total, "pressure_pct": mem.pressure},
        "thermal": {"throttled": heat.throttled, "max_c": max((c for _, c in heat.zones), default=None)},
        # The watchdog pings systemd while the engine loop makes progress (ops/notify.py).
        "watchdog": {"ok": not stalled and e.status in ("ok", "draining"), "stalled_s": round(stalled, 1)},
        "active_clients": app.usage.minutes.active(),
        "state_dir": app.state_dir(),
        # Its name on the LAN and whether it is announced (ops/mdns.py): `appliance status` shows them.
        "box": {"name": app.box.host, "url": app.box.url,
                "mdns": app.announcer.state if app.announcer is not None else "off"},
    }


def people(app: App) -> list[dict[str, Any]]:
    """Each identity's counts today and over the last 7 days, its quota and whether it is at it."""
    acct = app.usage
    today, week = acct.ledger.totals(1), acct.ledger.totals(7)
    quotas = _quotas(app.guard.keys)
    out = []
    for who in sorted(week, key=lambda w: (-week[w].generated_tokens, w)):
        t = today.get(who, Tally())
        quota = quotas.get(who, acct.default_quota)
        out.append({"who": who, "today": _counts(t), "week": _counts(week[who]), "quota": quota or None,
                    "at_limit": bool(quota) and t.generated_tokens >= quota})
    return out


def _quotas(keys: KeyRing) -> dict[str, int]:
    """The quota of each key's identity, where its key sets one."""
    return {identity(Caller("", k)): k.quota for k in keys.keys() if k.quota is not None}


def _counts(t: Tally) -> dict[str, int]:
    return {c: getattr(t, c) for c in COLUMNS}


async def usage_csv(app: App, request: Request) -> Response:
    """Every kept day's counts per identity, oldest day first."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(("day", "who", *COLUMNS))
    for day, who, t in app.usage.ledger.rows():
        w.writerow((day, _cell(who), *(getattr(t, c) for c in COLUMNS)))
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": 'attachment; filename="usage.csv"', "Cache-Control": "no-store"})


def _cell(text: str) -> str:
    # A spreadsheet runs a cell starting with = + - @ as a formula: a label cannot, but be sure.
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
