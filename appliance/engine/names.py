"""Session names, the one place a session id is digested. A session id is a bearer secret:
the engine is handed a digest that also binds the client's namespace, saved files know it by
a second digest, and log lines by a short third one, so no raw id is held, saved or logged.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

log = logging.getLogger("appliance.engine.core")  # the operator's one line per request, as it always was


def session_name(namespace: str, session: str) -> str:
    """What the engine calls a client's session: another key's (namespace's) sessions are
    out of reach, whatever id it sends."""
    return hashlib.sha256(f"{namespace}\0{session}".encode()).hexdigest()[:32]


def saved_key(session: str) -> str:
    """The digest saved files know a session by: they never hold its name."""
    return hashlib.sha256(b"appliance-session\0" + session.encode("utf-8", "surrogatepass")).hexdigest()


def log_name(session: str) -> str:
    """A short digest for log lines, enough to follow one session through the log."""
    return hashlib.sha256(session.encode()).hexdigest()[:8]


def log_finished(t: Any, reason: str, error: Any, now: float) -> None:
    """One line per request (an engine Turn) for the operator, its session by log_name."""
    if not log.isEnabledFor(logging.INFO):
        return
    ttft = f"{(t.first_token_at - t.arrival) * 1000:.0f} ms" if t.first_token_at else "-"
    wait = f"{(t.admitted_at - t.arrival) * 1000:.0f} ms" if t.admitted_at else "-"
    log.info("request %d session %s client %s: %s%s, prompt %d (reused %d), output %d, "
             "slot after %s, first token %s, total %.1f s", t.rid, log_name(t.session),
             t.client or "-", reason, f" ({error.status})" if error else "", t.n_prompt, t.n_reused,
             len(t.output), wait, ttft, now - t.arrival)
