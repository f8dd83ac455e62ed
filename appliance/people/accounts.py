"""People, their sign-in sessions, invites and API keys, in the store (db.py, over store.Database).

Secrets (session tokens, invite links, API keys) are 256 random bits, shown once and held only
as SHA-256 digests. A session is issued at sign-in only (never one the browser brings:
no fixation) and ends at sign-out, at "sign out everywhere", when its person is disabled or
removed, or after `session_days`.

A session or key seen in the last `cache_s` is answered from memory: each API request checks
its caller, and a revocation made on this box clears it at once (another box sharing the store
sees it within cache_s). When the store fails, what was seen before keeps working (stale), so a
broken disk does not sign the office out.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from appliance.people.passwords import Hasher, check_new
from appliance.store.database import Database, Tx
from appliance.store.errors import StoreError

log = logging.getLogger(__name__)
KEY_PREFIX = "ap-"  # a person's API key, as shown once: recognisable in a leaked config
NAME_MAX = 64
KEY_LABEL_MAX = 64
MAX_KEYS = 20  # per person
MAX_SESSIONS = 50  # per person: the oldest end beyond it


class Role(StrEnum):
    USER = "user"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Account:
    id: str
    name: str
    role: Role
    quota: int | None  # generated tokens a day; None = the configured default
    disabled: bool = False
    has_password: bool = True

    @property
    def admin(self) -> bool:
        return self.role is Role.ADMIN


@dataclass(frozen=True, slots=True)
class Session:
    account: Account
    csrf: str  # the token the page echoes in X-CSRF-Token on every change it asks for
    digest: str
    expires: float = float("inf")  # Unix time: also while the store is down, it ends then


class AccountError(ValueError):
    """A request about accounts that cannot be done; str() is for the person asking."""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def name_key(name: str) -> str:
    return unicodedata.normalize("NFKC", name).strip().casefold()


def clean_name(name: str) -> str:
    name = unicodedata.normalize("NFKC", name).strip()
    if not name or len(name) > NAME_MAX or not all(ch.isprintable() for ch in name):
        raise AccountError(f"a name is 1-{NAME_MAX} printable characters")
    return name


_ACCOUNT = "SELECT p.id, p.name, p.role, p.quota, p.disabled, p.password IS NOT NULL FROM people p"


def _account(row: tuple[Any, ...]) -> Account:
    return Account(row[0], row[1], Role(row[2]), row[3], bool(row[4]), bool(row[5]))


class Accounts:
    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time, hasher: Hasher | None = None,
                 session_days: float = 30, invite_days: float = 7, cache_s: float = 2.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self._clock, self._monotonic = clock, monotonic
        self._hasher = hasher or Hasher()
        self.session_s, self.invite_s, self._cache_s = session_days * 86400, invite_days * 86400, cache_s
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[Session | Account, float]] = {}  # digest -> (what, when looked up)
        self._unsaved: dict[str, tuple[Session, float]] = {}  # digest -> (session, expires): store not writable

    # -- people (the operator's) --------------------------------------------------------------

    def add(self, name: str, role: Role = Role.USER, quota: int | None = None) -> tuple[Account, str]:
        """A new person and their one-time invite link's token."""
        name = clean_name(name)
        pid = secrets.token_urlsafe(12)

        def add(tx: Tx) -> None:
            if tx.one("SELECT 1 FROM people WHERE name_key = ?", (name_key(name),)):
                raise AccountError(f"there is already a person named {name!r}")
            tx.run("INSERT INTO people (id, name, name_key, role, quota, created) VALUES (?, ?, ?, ?, ?, ?)",
                   (pid, name, name_key(name), role.value, quota, self._clock()))

        self._write(add)
        return Account(pid, name, role, quota, has_password=False), self.invite(pid)

    def invite(self, pid: str) -> str:
        """A new invite link's token for the person (earlier links stop working)."""
        token = secrets.token_urlsafe(32)

        def invite(tx: Tx) -> None:
            if not tx.one("SELECT 1 FROM people WHERE id = ?", (pid,)):
                raise AccountError("no such person")
            tx.run("DELETE FROM invites WHERE person = ?", (pid,))
            tx.run("INSERT INTO invites VALUES (?, ?, ?)", (digest(token), pid, self._clock() + self.invite_s))

        self._write(invite)
        return token

    def invited(self, token: str) -> Account | None:
        """Whom an invite link is for, while it is valid."""
        row = self._read(lambda tx: tx.one(
            f"{_ACCOUNT} JOIN invites i ON i.person = p.id WHERE i.digest = ? AND i.expires > ? AND p.disabled = 0",
            (digest(token), self._clock())))
        return _account(row) if row else None

    def update(self, pid: str, *, role: Role | None = None, quota: int | None | bool = False,
               disabled: bool | None = None) -> Account:
        """Change a person's role, quota (None = the default) or disabled flag. Disabling ends
        their sessions and keys at once."""
        def update(tx: Tx) -> Account:
            row = tx.one(f"{_ACCOUNT} WHERE p.id = ?", (pid,))
            if row is None:
                raise AccountError("no such person")
            if role is not None:
                tx.run("UPDATE people SET role = ? WHERE id = ?", (role.value, pid))
            if quota is not False:
                tx.run("UPDATE people SET quota = ? WHERE id = ?", (quota, pid))
            if disabled is not None:
                tx.run("UPDATE people SET disabled = ? WHERE id = ?", (int(disabled), pid))
                if disabled:
                    self._end_all(tx, pid, keys=True)
            return _account(tx.one(f"{_ACCOUNT} WHERE p.id = ?", (pid,)) or row)

        account = self._write(update)
        self._forget(lambda what: _person_of(what) == pid)
        return account

    def remove(self, pid: str) -> bool:
        """Remove a person and everything of theirs (sessions, keys, chats)."""
        gone = self._write(lambda tx: tx.run("DELETE FROM people WHERE id = ?", (pid,))) > 0
        self._forget(lambda what: _person_of(what) == pid)
        return gone

    def people(self) -> list[tuple[Account, dict[str, int]]]:
        """Every person with counts of their chats, keys and sessions (what the operator sees)."""
        def people(tx: Tx) -> list[tuple[Account, dict[str, int]]]:
            rows = tx.all(f"""{_ACCOUNT.replace(' FROM people p', '')},
                (SELECT count(*) FROM chats c WHERE c.person = p.id),
                (SELECT count(*) FROM person_keys k WHERE k.person = p.id),
                (SELECT count(*) FROM sessions s WHERE s.person = p.id AND s.expires > ?)
                FROM people p ORDER BY p.name_key""", (self._clock(),))
            return [(_account(r), {"chats": r[6], "keys": r[7], "sessions": r[8]}) for r in rows]

        return self._read(people)

    def get(self, pid: str) -> Account | None:
        row = self._read(lambda tx: tx.one(f"{_ACCOUNT} WHERE p.id = ?", (pid,)))
        return _account(row) if row else None

    # -- signing in ---------------------------------------------------------------------------

    def accept(self, token: str, password: str) -> tuple[Session, str]:
        """Set the password an invite link asks for; the new session and its token."""
        account = self.invited(token)
        if account is None:
            raise AccountError("this invite link is not valid any more: ask for a new one")
        check_new(password, account.name)
        hashed = self._hasher.hash(password)

        def accept(tx: Tx) -> None:
            if not tx.run("DELETE FROM invites WHERE digest = ? AND expires > ?", (digest(token), self._clock())):
                raise AccountError("this invite link is not valid any more: ask for a new one")
            tx.run("UPDATE people SET password = ? WHERE id = ?", (hashed, account.id))
            self._end_all(tx, account.id, keys=False)  # a new password ends the old sessions

        self._write(accept)
        self._forget(lambda what: isinstance(what, Session) and what.account.id == account.id)
        return self._new_session(Account(account.id, account.name, account.role, account.quota))

    def sign_in(self, name: str, password: str) -> tuple[Session, str] | None:
        """A new session for name and password, or None (which of the two was wrong is not said,
        and an unknown name costs the same hash)."""
        row = self._read(lambda tx: tx.one(
            "SELECT id, password FROM people WHERE name_key = ? AND disabled = 0", (name_key(name),)))
        stored = row[1] if row else None
        if not self._hasher.verify(password, stored) or row is None:
            return None
        account = self.get(row[0])
        if account is None or account.disabled:
            return None
        if self._hasher.needs_rehash(stored or ""):
            hashed = self._hasher.hash(password)
            self._write(lambda tx: tx.run("UPDATE people SET password = ? WHERE id = ?", (hashed, account.id)))
        return self._new_session(account)

    def change_password(self, session: Session, old: str, new: str) -> tuple[Session, str]:
        row = self._read(lambda tx: tx.one("SELECT password FROM people WHERE id = ?", (session.account.id,)))
        if not self._hasher.verify(old, row[0] if row else None):
            raise AccountError("the current password is not right")
        check_new(new, session.account.name)
        hashed = self._hasher.hash(new)

        def change(tx: Tx) -> None:
            tx.run("UPDATE people SET password = ? WHERE id = ?", (hashed, session.account.id))
            self._end_all(tx, session.account.id, keys=False)

        self._write(change)
        self._forget(lambda what: isinstance(what, Session) and what.account.id == session.account.id)
        return self._new_session(session.account)

    def _new_session(self, account: Account) -> tuple[Session, str]:
        token, csrf, now = secrets.token_urlsafe(32), secrets.token_urlsafe(24), self._clock()

        def new(tx: Tx) -> None:
            tx.run("DELETE FROM sessions WHERE expires <= ?", (now,))
            tx.run("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)", (digest(token), account.id, csrf, now,
                                                                 now + self.session_s))
            tx.run("""DELETE FROM sessions WHERE person = ? AND digest NOT IN
                      (SELECT digest FROM sessions WHERE person = ? ORDER BY created DESC LIMIT ?)""",
                   (account.id, account.id, MAX_SESSIONS))

        session = Session(account, csrf, digest(token), now + self.session_s)
        try:
            self._write(new)
        except StoreError:
            # A store that cannot be written (a read-only disk) still lets people sign in: the
            # session lives in this process's memory until it ends or the box restarts.
            with self._lock:
                self._unsaved[session.digest] = (session, now + self.session_s)
        return session, token

    def session(self, token: str) -> Session | None:
        """The live session a cookie's token names, or None."""
        with self._lock:
            unsaved = self._unsaved.get(digest(token))
        if unsaved is not None and unsaved[1] > self._clock():
            return unsaved[0]
        def look(tx: Tx) -> Session | None:
            row = tx.one(f"{_ACCOUNT} JOIN sessions s ON s.person = p.id "
                         "WHERE s.digest = ? AND s.expires > ? AND p.disabled = 0", (digest(token), self._clock()))
            more = tx.one("SELECT csrf, expires FROM sessions WHERE digest = ?", (digest(token),)) if row else None
            return Session(_account(row), more[0], digest(token), more[1]) if row and more else None

        found = self._cached(digest(token), look)
        return found if isinstance(found, Session) and found.expires > self._clock() else None

    def sign_out(self, session: Session) -> None:
        self._forget(lambda what: isinstance(what, Session) and what.digest == session.digest)
        self._write(lambda tx: tx.run("DELETE FROM sessions WHERE digest = ?", (session.digest,)))

    def sign_out_everywhere(self, pid: str) -> None:
        self._forget(lambda what: isinstance(what, Session) and what.account.id == pid)
        self._write(lambda tx: self._end_all(tx, pid, keys=False))

    @staticmethod
    def _end_all(tx: Tx, pid: str, keys: bool) -> None:
        tx.run("DELETE FROM sessions WHERE person = ?", (pid,))
        if keys:  # disabled: their keys go, and an invite sent before does not come back with them
            tx.run("DELETE FROM person_keys WHERE person = ?", (pid,))
            tx.run("DELETE FROM invites WHERE person = ?", (pid,))

    # -- a person's own API keys --------------------------------------------------------------

    def new_key(self, pid: str, label: str) -> tuple[dict[str, Any], str]:
        """A new API key for the person: its listing and the key itself (shown once)."""
        label = label.strip()
        if not label or len(label) > KEY_LABEL_MAX or not label.isprintable():
            raise AccountError(f"a key's label is 1-{KEY_LABEL_MAX} printable characters")
        token, kid, now = KEY_PREFIX + secrets.token_urlsafe(32), secrets.token_urlsafe(9), self._clock()

        def new(tx: Tx) -> None:
            if tx.one("SELECT count(*) FROM person_keys WHERE person = ?", (pid,))[0] >= MAX_KEYS:  # type: ignore[index]
                raise AccountError(f"at most {MAX_KEYS} keys a person: revoke one first")
            tx.run("INSERT INTO person_keys VALUES (?, ?, ?, ?, ?)", (digest(token), kid, pid, label, now))

        self._write(new)
        return {"id": kid, "label": label, "created": now, "hint": token[:7] + "…"}, token

    def keys(self, pid: str) -> list[dict[str, Any]]:
        rows = self._read(lambda tx: tx.all(
            "SELECT id, label, created FROM person_keys WHERE person = ? ORDER BY created", (pid,)))
        return [{"id": kid, "label": label, "created": created} for kid, label, created in rows]

    def revoke_key(self, pid: str, kid: str) -> bool:
        gone = self._write(lambda tx: tx.run("DELETE FROM person_keys WHERE person = ? AND id = ?", (pid, kid))) > 0
        self._forget(lambda what: isinstance(what, Account) and what.id == pid)
        return gone

    def find_key(self, token: str) -> Account | None:
        """The person whose API key this is (a live, enabled person), or None."""
        if not token.startswith(KEY_PREFIX):
            return None

        def look(tx: Tx) -> Account | None:
            row = tx.one(f"{_ACCOUNT} JOIN person_keys k ON k.person = p.id WHERE k.digest = ? AND p.disabled = 0",
                         (digest(token),))
            return _account(row) if row else None

        found = self._cached(digest(token), look)
        return found if isinstance(found, Account) else None

    def named(self, name: str) -> Account | None:
        """An enabled person by name (a signing-in proxy's X-Forwarded-User), or None."""
        def look(tx: Tx) -> Account | None:
            row = tx.one(f"{_ACCOUNT} WHERE p.name_key = ? AND p.disabled = 0", (name_key(name),))
            return _account(row) if row else None

        found = self._cached("name:" + name_key(name), look)
        return found if isinstance(found, Account) else None

    # -- the store, and what was seen of it ---------------------------------------------------

    def _cached(self, key: str, look: Callable[[Tx], Session | Account | None]) -> Session | Account | None:
        now = self._monotonic()
        with self._lock:
            seen = self._seen.get(key)
        if seen is not None and now - seen[1] < self._cache_s:
            return seen[0]
        try:
            found = self.db.read(look)
        except StoreError:
            return seen[0] if seen is not None else None  # the store is down: what we saw still holds
        with self._lock:
            if found is None:
                self._seen.pop(key, None)
            else:
                self._seen[key] = (found, now)
                if len(self._seen) > 10_000:  # ~2 MiB; the oldest go
                    self._seen.pop(next(iter(self._seen)))
        return found

    def _forget(self, which: Callable[[Session | Account], bool]) -> None:
        with self._lock:
            for key in [k for k, (what, _) in self._seen.items() if which(what)]:
                del self._seen[key]
            for key in [k for k, (what, _) in self._unsaved.items() if which(what)]:
                del self._unsaved[key]

    def _read(self, fn: Callable[[Tx], Any]) -> Any:
        return self.db.read(fn)

    def _write(self, fn: Callable[[Tx], Any]) -> Any:
        return self.db.write(fn)


def _person_of(what: Session | Account) -> str:
    return what.account.id if isinstance(what, Session) else what.id
