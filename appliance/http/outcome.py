"""What a request adds to the counts, each in one place: a refusal (/metrics' rejected
requests by its code, or the front door's reason, and the caller's usage when the caller is
known), and the outcome of a request the engine ran (the caller's usage: its choices' tokens,
or its failure). Nothing else on the HTTP side writes to either.
"""

from __future__ import annotations

from collections.abc import Sequence

from appliance.engine.events import Done
from appliance.errors import ApplianceError
from appliance.http.guard import Caller
from appliance.http.state import App


def refused(app: App, label: str | None, caller: Caller | None = None, err: ApplianceError | None = None) -> None:
    """A request refused before its answer started: counted in /metrics under `label` (the
    error's code; the front door's reason), and in the caller's usage when there is one (the
    ledger keeps 429s and 503s, the minute ring 5xx failures; a client's 400 is its own)."""
    if label:
        app.refused(label)
    if caller is not None and err is not None:
        app.usage.refused(caller, err)


def ran(app: App, caller: Caller, ends: Sequence[Done], ttft_s: float | None, failed: ApplianceError | None) -> None:
    """A request the engine ran: failed (counted as a refusal in the caller's usage, not in
    /metrics, which counts the engine's failures itself), or ended with these choices' tokens
    (those of a client that left included: what the engine generated before the cancel)."""
    if failed is not None:
        app.usage.refused(caller, failed)
    elif ends:
        app.usage.ended(caller, ends, ttft_s)
