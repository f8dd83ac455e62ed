"""The state the routes share: the engine, what the API says about the model, the request
bounds, the front door's policy and parse gate, the document reader, usage accounting, and
the wait estimates in queue notes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from appliance.documents.reader import DocumentReader
from appliance.engine.engine import Engine
from appliance.engine.pace import wait_estimate
from appliance.http.accounting import Accounting
from appliance.http.guard import GuardPolicy
from appliance.http.keys import KeyRing
from appliance.http.metrics import Metrics
from appliance.http.people import People
from appliance.http.reach import Box
from appliance.http.throttle import ParseGate
from appliance.http.validate import RequestBounds
from appliance.http.wire import comment
from appliance.library.library import Library
from appliance.tls.trust import Trust
from appliance.workers import Health, Worker


class Embeddings(Protocol):
    """What the HTTP side uses of library/embedder.EmbedService (named, not imported: the
    service loads llama.cpp)."""

    model_id: str
    max_tokens: int

    @property
    def dim(self) -> int: ...
    def count_tokens(self, text: str) -> int: ...
    async def embed(self, texts: list[str], background: bool = False) -> np.ndarray: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def workers(self) -> Sequence[Worker[Any]]: ...


class Announcing(Protocol):
    """What the app holds of ops/mdns.Announcer: a worker the lifespan starts and stops, and
    how its announcement went (/admin/status)."""

    state: str

    def start(self) -> None: ...
    def stop(self, timeout: float | None = None) -> None: ...
    def health(self) -> Health: ...


WEB_DIR = Path(__file__).resolve().parents[2] / "web"


class App:
    """State shared by the routes: the engine and what the API says about the model."""

    def __init__(self, engine: Engine, model_id: str, bounds: RequestBounds, web_dir: Path | None = None,
                 metrics: Metrics | None = None, *, system_prompts: dict[str, str] | None = None,
                 guard: GuardPolicy | None = None, parse_concurrency: int = 4, parse_per_client: int = 2,
                 documents: DocumentReader | None = None, usage: Accounting | None = None,
                 people: People | None = None, library: Library | None = None, embedder: Embeddings | None = None,
                 store: People | None = None, box: Box | None = None,
                 announcer: Announcing | None = None) -> None:
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
        self.people = people  # people mode: accounts and chats on the box (None: open mode)
        # The store of people and chats this app owns, closed when it stops (the composition
        # root hands it over): people's, or without people mode the one several boxes share
        # the usage table through (database_url). A People lent to several apps (tests) is not.
        self.store = store
        self.library = library  # the office's documents, searched by chats (None: off)
        self.embedder = embedder  # library/embedder.EmbedService: /v1/embeddings and the library (None: off)
        # Workers the process runs beside these services, listed by /admin/status too (the
        # systemd watchdog, which ops/serve.py starts around the server).
        self.beside: list[Worker[Any]] = []
        self.box = box or Box()  # its name on the LAN: links made on the box itself carry it (http/reach.py)
        # The mDNS announcer (ops/mdns.py), started and stopped by the lifespan (None: mdns off).
        self.announcer = announcer
        self.trust: Trust | None = None  # the box's own CA, for /trust (set by the composition root)
        self.created = int(time.time())

    def refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason).inc()

    def state_dir(self) -> dict[str, object] | None:
        """The state directory's health, as /health, /admin and `appliance status` say it:
        the usage ledger writes there every second there are counts, so it is the first to
        see a disk turned read-only or full (None: no state directory)."""
        ledger = self.usage.ledger
        writable = ledger.writable
        if writable is None:
            return None
        return {"writable": writable, "error": None if writable else ledger.trouble}

    def workers(self) -> list[Health]:
        """The background threads of the services this app holds (the engine's loop is its
        own: /health and the watchdog watch it), for /admin/status."""
        found: list[Worker[Any] | Announcing] = [*self.usage.ledger.workers(), *self.beside]
        if self.announcer is not None:
            found.append(self.announcer)
        if self.people is not None:
            found += self.people.workers()
        if self.embedder is not None:
            found += self.embedder.workers()
        if self.library is not None:
            found += self.library.workers()
        return [w.health() for w in found]

    def wait_estimate(self, position: int) -> int | None:
        """Seconds until queue place `position` gets its first token (engine/pace.py)."""
        return wait_estimate(self.engine.snapshot, position, self.engine.now())

    def queue_note(self, position: int, background: bool = False) -> bytes:
        """The SSE comment a waiting stream hears: its place in the queue and the wait (for
        background work, that it waits behind people: no estimate, people may keep coming)."""
        if not position:
            return comment("busy")
        if background:
            return comment(f"queued {position} behind people")
        eta = self.wait_estimate(position)
        return comment(f"queued {position} eta {eta}") if eta is not None else comment(f"queued {position}")
