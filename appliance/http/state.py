"""The state the routes share: the engine, what the API says about the model, the request
bounds, the front door's policy and parse gate, the document reader, usage accounting, and
the wait estimates in queue notes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path

from appliance.documents.reader import DocumentReader
from appliance.engine.engine import Engine
from appliance.http.accounting import Accounting
from appliance.http.guard import GuardPolicy
from appliance.http.keys import KeyRing
from appliance.http.metrics import Metrics
from appliance.http.throttle import ParseGate
from appliance.http.validate import RequestBounds
from appliance.http.wire import comment

# The queue's pace: answers that ended in the last minute, from at least four of them. A
# minute holds ~30 answers at an office's busiest (35 a minute on 2 cores) and forgets a lull.
PACE_WINDOW_S = 60.0
PACE_MIN = 4
WEB_DIR = Path(__file__).resolve().parents[2] / "web"


class App:
    """State shared by the routes: the engine and what the API says about the model."""

    def __init__(self, engine: Engine, model_id: str, bounds: RequestBounds, web_dir: Path | None = None,
                 metrics: Metrics | None = None, *, system_prompts: dict[str, str] | None = None,
                 guard: GuardPolicy | None = None, parse_concurrency: int = 4, parse_per_client: int = 2,
                 documents: DocumentReader | None = None, usage: Accounting | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.model_id = model_id
        self.bounds = bounds
        self.web_dir = web_dir or WEB_DIR
        self.system_prompts = dict(system_prompts or {})
        self.guard = guard or GuardPolicy.build(KeyRing())
        self.gate = ParseGate(parse_concurrency, parse_per_client)
        self.documents = documents or DocumentReader()
        self.usage = usage or Accounting()  # counts per person, the quotas, the admin page's minutes
        self.created = int(time.time())
        self._served: deque[float] = deque(maxlen=32)  # seconds each recent request held a slot
        self._finished: deque[float] = deque(maxlen=32)  # when recent requests finished (monotonic s)
        self.clock = time.monotonic

    def refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason).inc()

    def wait_estimate(self, position: int) -> int | None:
        """Seconds until queue place `position` gets its first token: the step in progress
        ends, the places the next admission takes are admitted then, each place beyond them
        waits for an answer to end (each frees what one waiting request needs, at the pace
        answers have ended lately), and its own first step reads its prompt. Measured, not
        derived from the slot count: when the KV budget holds fewer streams than slots, the
        old `served time / slots` guess was 2-4x short; and with slots free (an office at
        capacity on 24 slots) the wait is the step in progress, which counting answers
        missed by 2x. Before PACE_MIN answers have ended in the last PACE_WINDOW_S, the old
        guess is all there is for the places beyond."""
        snap, now = self.engine.snapshot, self.clock()
        ahead = position - snap.admissible
        if ahead <= 0:
            if not snap.step_s:
                return None  # nothing has run yet: no step to go by
            per_place = 0.0
        elif (pace := self._pace(now)) is not None:
            per_place = pace
        elif self._served:
            per_place = (sum(self._served) / len(self._served)) / max(1, snap.slots)
        else:
            return None
        boundary = max(0.0, self.engine.step_ends - now)
        return max(1, math.ceil(boundary + max(0, ahead) * per_place + snap.step_s))

    def _pace(self, now: float) -> float | None:
        """Seconds between answers ending, over the last PACE_WINDOW_S (None: too few)."""
        recent = [t for t in self._finished if now - t <= PACE_WINDOW_S]
        return (now - recent[0]) / len(recent) if len(recent) >= PACE_MIN else None

    def queue_note(self, position: int) -> bytes:
        """The SSE comment a waiting stream hears: its place in the queue and the wait."""
        if not position:
            return comment("busy")
        eta = self.wait_estimate(position)
        return comment(f"queued {position} eta {eta}") if eta is not None else comment(f"queued {position}")

    def note_served(self, started: float) -> None:
        """A request that started answering at `started` (monotonic s) has finished."""
        now = self.clock()
        self._finished.append(now)
        if started:
            self._served.append(now - started)
