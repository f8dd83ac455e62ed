"""The people mode's front door on the HTTP side: which signed-in person a request is (a
session cookie, or one of their own API keys), the cookie itself, and the CSRF rule.

The cookie is `HttpOnly` (no script reads it), `SameSite=Lax` (sent when a link from a chat
program or an e-mail opens the page, which `Strict` would not; not sent with a cross-site
POST or fetch), `Secure` when the page was reached over HTTPS. A change asked for with the
cookie (not with a key) must also echo the session's CSRF token in `X-CSRF-Token`: a custom
header a cross-site page cannot send without a CORS preflight, which only allowed_origins pass.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from starlette.datastructures import Headers
from starlette.requests import cookie_parser

from appliance.errors import QueueFull
from appliance.people.accounts import Account, Accounts, Session
from appliance.people.chats import Chats
from appliance.people.db import Database
from appliance.people.passwords import Hasher
from appliance.people.signin import SignInLimiter
from appliance.store.database import Database as Store
from appliance.store.errors import StoreError
from appliance.workers import Worker, WorkerBusy, WorkerStopped, settle

log = logging.getLogger(__name__)
COOKIE = "appliance_session"
CSRF_HEADER = "x-csrf-token"
PRUNE_EVERY_S = 3600.0
HASH_QUEUE = 16  # sign-ins waiting for the hash thread (~3 s of hashing) before a 429
CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
T = TypeVar("T")


class Pruner(Worker[tuple[Chats, int]]):
    """Chat retention's thread: one prune at a time, none waiting behind it; a prune still
    queued at shutdown is dropped (the next start prunes within the hour)."""

    DRAIN = False

    def __init__(self) -> None:
        super().__init__("chat-retention", max_queue=1)

    def handle(self, item: tuple[Chats, int]) -> None:
        chats, days = item
        try:
            gone = chats.prune(days)
        except StoreError:
            return  # the store's own journal line says why
        if gone:
            log.info("deleted %d chats nobody touched for %d days (chat_retention_days)", gone, days)


@dataclass(slots=True)
class HashJob:
    """A sign-in, an invite or a password change (each hashes once), and the future its
    request awaits on `loop`."""

    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


class HashWorker(Worker[HashJob]):
    """Password hashes (0.2 s and 32 MiB each) on a thread of their own, at most HASH_QUEUE
    queued or running before a 429: a burst of sign-ins neither takes the shared worker
    threads (cookie lookups, tokenizing) nor grows without bound. One thread, as Hasher's
    gate lets one hash run at a time anyway. A stop fails what is queued (WorkerStopped)
    rather than draining it: up to 3 s of hashing for requests the shutdown cuts anyway."""

    DRAIN = False

    def __init__(self) -> None:
        super().__init__("password-hash", max_queue=HASH_QUEUE, busy=lambda depth: QueueFull(
            "sign-ins are busy right now: try again in a few seconds", retry_after=2, code="signin_busy"))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the hash thread; its result or error, here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.submit(HashJob(partial(fn, *args), loop, future))
        return await future

    def handle(self, job: HashJob) -> None:
        try:
            result = job.fn()
        except Exception as e:  # this request's error (an AccountError is its 400, a StoreError its 503): the thread goes on
            settle(job.loop, job.future, error=e)
        else:
            settle(job.loop, job.future, result)

    def cancel(self, job: HashJob) -> None:
        settle(job.loop, job.future, error=self._stopped())


@dataclass(slots=True)
class People:
    """Accounts, chats and the sign-in limiter of one box. `db` None: the store could not be
    opened (one journal line); nobody can sign in until it can, the rest of the box serves."""

    db: Store | None
    retention_days: int = 0
    trouble: str = ""
    limiter: SignInLimiter = field(default_factory=SignInLimiter)
    hasher: Hasher = field(default_factory=Hasher)
    accounts: Accounts | None = None
    chats: Chats | None = None
    pruned_at: float = float("-inf")
    hash_worker: HashWorker = field(default_factory=HashWorker)
    pruner: Pruner = field(default_factory=Pruner)
    # The header a signing-in proxy names the person in (signin_header, lower case; "" = off):
    # opt-in, as a proxy that passes a client's own copy on would let anyone be anyone.
    signin_header: str = ""

    def __post_init__(self) -> None:
        if self.db is not None:
            self.accounts = self.accounts or Accounts(self.db, hasher=self.hasher)
            self.chats = self.chats or Chats(self.db)

    @classmethod
    def open(cls, state_dir: str, retention_days: int = 0, database_url: str = "", signin_header: str = "") -> People:
        """SQLite in state_dir, or PostgreSQL at database_url (several boxes, one store)."""
        try:
            if database_url:
                from appliance.people.postgres import PgDatabase  # psycopg only where it is asked for
                return cls(PgDatabase(database_url), retention_days, signin_header=signin_header.lower())
            return cls(Database(Path(state_dir) if state_dir else None), retention_days,
                       signin_header=signin_header.lower())
        except StoreError as e:
            log.error("%s; nobody can sign in until it is fixed", e)
            return cls(None, retention_days, trouble=str(e))

    def prune_due(self, now: float | None = None) -> None:
        """Forget chats older than retention_days, at most once an hour (off the event loop)."""
        now = time.monotonic() if now is None else now
        if not self.retention_days or self.chats is None or now - self.pruned_at < PRUNE_EVERY_S:
            return
        self.pruned_at = now
        if not self.pruner.started:  # the first prune starts its thread (a People need not be started)
            self.pruner.start()
        try:
            self.pruner.submit((self.chats, self.retention_days))
        except (WorkerBusy, WorkerStopped):
            pass  # a prune still runs (an hour long?), or the box is stopping: the next hour's

    def start(self) -> None:
        """The hash thread (the lifecycle starts the People the app owns; chat retention's
        thread starts with its first prune)."""
        self.hashing()

    def hashing(self) -> HashWorker:
        """The hash thread, started on first use if nobody started it (a People lent to
        several apps, in tests); after close() its run() raises WorkerStopped."""
        if not self.hash_worker.started:
            self.hash_worker.start()
        return self.hash_worker

    def workers(self) -> list[Worker[Any]]:
        """Its threads once started (a stopped one stays: alive false), for /admin/status."""
        return [w for w in (self.hash_worker, self.pruner) if w.started]

    def close(self) -> None:
        """At shutdown: the pruner and what waits for the hash thread cancelled, the store closed."""
        for worker in (self.pruner, self.hash_worker):
            if worker.started:
                worker.stop()
        if self.db is not None:
            self.db.close()

    @property
    def store_trouble(self) -> str:
        return self.trouble or (self.db.trouble if self.db else "")

    async def resolve(self, headers: Headers, token: str | None,
                      proxied: bool = False) -> tuple[Account | None, Session | None]:
        """The person asking: by one of their API keys (`token`), else by the session cookie,
        else (from a trusted proxy that signs people in) by its X-Forwarded-User."""
        if self.accounts is None:
            return None, None
        if token and (account := await asyncio.to_thread(self.accounts.find_key, token)) is not None:
            return account, None
        # A key that is not a person's (one the page kept from before people mode) does not
        # hide the session cookie.
        cookie = cookie_parser(headers.get("cookie", "")).get(COOKIE)
        if not cookie:
            forwarded = headers.get(self.signin_header, "").strip() if proxied and self.signin_header else ""
            return (await asyncio.to_thread(self.accounts.named, forwarded) if forwarded else None), None
        session = await asyncio.to_thread(self.accounts.session, cookie)
        return (session.account, session) if session else (None, None)


def csrf_ok(session: Session, headers: Headers) -> bool:
    return hmac.compare_digest(headers.get(CSRF_HEADER, "").encode(), session.csrf.encode())


def cookie_header(token: str, max_age: int, secure: bool) -> str:
    return (f"{COOKIE}={token}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax" + ("; Secure" if secure else ""))


def clear_cookie(secure: bool) -> str:
    return cookie_header("", 0, secure)
