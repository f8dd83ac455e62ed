"""A person's chats kept on the box: every query names the person, and a chat's id is its
person's own (the page names its chats), so a chat of someone else is simply not there (a
404 at the route, the same as one that never was) and no id of theirs can collide with it.

The page owns a conversation's shape: it puts the whole list of messages after each turn
(edits and regenerations included), bounded by `MAX_CHAT_CHARS`. A share is a random token
held as its digest; a shared chat is read by that token only, read-only.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.people.accounts import AccountError, digest
from appliance.store.database import Database, Tx

ROLES = frozenset({"user", "assistant", "system"})
MAX_CHATS = 2000  # per person: the list the page loads is all of them (~200 KB of titles)
MAX_PERSON_CHARS = 50_000_000  # a person's chats in all (~50-200 MB on disk): one person cannot fill the card
MAX_MESSAGES = 2048  # per chat, as max_messages
MAX_CHAT_CHARS = 2_000_000  # a chat's text and metadata (a long chat with attached documents' text)
MAX_TITLE = 200
SEARCH_MAX = 200  # characters of a search
CHAT_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")  # as session ids: the page uses one for both


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str
    meta: dict[str, Any]  # what the page shows beside it: stats, attachments' names and text

    @classmethod
    def parse(cls, raw: object) -> Message:
        if not isinstance(raw, dict) or raw.get("role") not in ROLES or not isinstance(raw.get("content"), str) \
                or not storable(raw["content"]):
            raise AccountError("each message is {role: user|assistant|system, content: text, meta?: object} "
                               "(text without NUL or unpaired surrogates)")
        meta = raw.get("meta", {})
        if not isinstance(meta, dict):
            raise AccountError("a message's meta is an object")
        return cls(raw["role"], raw["content"], meta)


class ChatChanged(Exception):
    """The chat was changed (on another device) since the writer last read it."""


def storable(text: str) -> bool:
    """Text both engines keep as sent: no NUL (PostgreSQL refuses it) and no unpaired surrogate
    (not UTF-8: SQLite's driver refuses it)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean_title(title: object) -> str:
    if not isinstance(title, str) or not storable(title):
        raise AccountError("a title is text (no NUL, no unpaired surrogate)")
    title = " ".join(title.split())[:MAX_TITLE]
    return title or "New chat"


def _like(query: str) -> str:
    return "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class Chats:
    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock

    def listed(self, pid: str, query: str = "", limit: int = MAX_CHATS) -> list[dict[str, Any]]:
        """The person's chats, newest first; with a query, those whose title or text contains it."""
        query = query.strip()[:SEARCH_MAX]
        sql = "SELECT id, title, meta, created, updated, share FROM chats c WHERE person = ?"
        params: list[Any] = [pid]
        if query:
            # lower() on both sides: LIKE ignores case in SQLite, not in PostgreSQL.
            sql += (" AND (lower(title) LIKE lower(?) ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE "
                    "m.person = c.person AND m.chat = c.id AND lower(m.content) LIKE lower(?) ESCAPE '\\'))")
            params += [_like(query), _like(query)]
        rows = self.db.read(lambda tx: tx.all(sql + " ORDER BY updated DESC LIMIT ?", (*params, limit)))
        return [{"id": cid, "title": title, "meta": json.loads(meta), "created": created, "updated": updated,
                 "shared": share is not None} for cid, title, meta, created, updated, share in rows]

    def get(self, pid: str, cid: str) -> dict[str, Any] | None:
        return self.db.read(lambda tx: self._get(tx, "c.person = ? AND c.id = ?", (pid, cid)))

    def shared(self, token: str) -> dict[str, Any] | None:
        """A chat by its share link's token (read-only; its owner's name, not their id)."""
        return self.db.read(lambda tx: self._get(tx, "c.share = ?", (digest(token),)))

    @staticmethod
    def _get(tx: Tx, where: str, params: tuple[str, ...]) -> dict[str, Any] | None:
        row = tx.one(f"SELECT c.id, c.title, c.meta, c.created, c.updated, c.share, p.name, c.person FROM chats c "
                     f"JOIN people p ON p.id = c.person WHERE {where} AND p.disabled = 0", params)
        if row is None:
            return None
        messages = tx.all("SELECT role, content, meta FROM messages WHERE person = ? AND chat = ? ORDER BY seq",
                          (row[7], row[0]))
        return {"id": row[0], "title": row[1], "meta": json.loads(row[2]), "created": row[3], "updated": row[4],
                "shared": row[5] is not None, "owner": row[6],
                "messages": [{"role": r, "content": c, "meta": json.loads(m)} for r, c, m in messages]}

    def put(self, pid: str, cid: str, title: object, messages: list[Message],
            meta: dict[str, Any] | None = None, base: float | None = None) -> dict[str, Any]:
        """Create or replace the person's chat `cid`: its title, messages and meta; its listing.
        `base`: the `updated` the writer last saw; a chat changed since (on another device) is
        not overwritten (ChatChanged), so a stale tab cannot undo a newer turn."""
        title = clean_title(title)
        meta_text = _json(meta or {})
        rows = [(m.role, m.content, _json(m.meta)) for m in messages]
        chars = sum(len(c) + len(m) for _, c, m in rows) + len(title) + len(meta_text)
        if len(rows) > MAX_MESSAGES:
            raise AccountError(f"a chat keeps at most {MAX_MESSAGES} messages")
        if chars > MAX_CHAT_CHARS:
            raise AccountError(f"a chat keeps at most {MAX_CHAT_CHARS:,} characters ({chars:,} sent): start a new one")
        now = self._clock()

        def put(tx: Tx) -> dict[str, Any]:
            count, total, mine = tx.one("SELECT count(*), coalesce(sum(chars), 0), coalesce(sum(CASE WHEN id = ? "
                                        "THEN chars ELSE 0 END), 0) FROM chats WHERE person = ?", (cid, pid)) or (0, 0, 0)
            if not tx.one("SELECT 1 FROM chats WHERE person = ? AND id = ?", (pid, cid)) and count >= MAX_CHATS:
                raise AccountError(f"at most {MAX_CHATS:,} chats a person: delete some first")
            seen = tx.one("SELECT updated FROM chats WHERE person = ? AND id = ?", (pid, cid))
            if base is not None and seen is not None and seen[0] != base:
                raise ChatChanged(cid)
            # `updated` is the chat's version too: it moves on at every save, whatever the clock does.
            stamp = now if seen is None else max(now, seen[0] + 0.001)
            if total - mine + chars > MAX_PERSON_CHARS:
                raise AccountError(f"your chats hold {MAX_PERSON_CHARS:,} characters, the most a person keeps here: "
                                   "delete some first")
            tx.run("INSERT INTO chats (person, id, title, meta, created, updated, chars) VALUES (?, ?, ?, ?, ?, ?, ?) "
                   "ON CONFLICT (person, id) DO UPDATE SET title = excluded.title, meta = excluded.meta, "
                   "updated = excluded.updated, chars = excluded.chars", (pid, cid, title, meta_text, now, stamp, chars))
            tx.run("DELETE FROM messages WHERE person = ? AND chat = ?", (pid, cid))
            for seq, (role, content, m) in enumerate(rows):
                tx.run("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?)", (pid, cid, seq, role, content, m))
            return {"id": cid, "title": title, "updated": stamp, "messages": len(rows)}

        return self.db.write(put)

    def rename(self, pid: str, cid: str, title: object) -> bool:
        title = clean_title(title)
        return self.db.write(lambda tx: tx.run("UPDATE chats SET title = ? WHERE person = ? AND id = ?",
                                               (title, pid, cid))) > 0

    def delete(self, pid: str, cid: str) -> bool:
        return self.db.write(lambda tx: tx.run("DELETE FROM chats WHERE person = ? AND id = ?", (pid, cid))) > 0

    def delete_all(self, pid: str) -> int:
        return self.db.write(lambda tx: tx.run("DELETE FROM chats WHERE person = ?", (pid,)))

    def share(self, pid: str, cid: str) -> str | None:
        """A new share link's token for the chat (an earlier link stops working), or None."""
        token = secrets.token_urlsafe(32)
        done = self.db.write(lambda tx: tx.run("UPDATE chats SET share = ? WHERE person = ? AND id = ?",
                                               (digest(token), pid, cid)))
        return token if done else None

    def unshare(self, pid: str, cid: str) -> bool:
        return self.db.write(lambda tx: tx.run("UPDATE chats SET share = NULL WHERE person = ? AND id = ?",
                                               (pid, cid))) > 0

    def prune(self, retention_days: float) -> int:
        """Forget chats not touched for retention_days (0 = keep them all)."""
        if retention_days <= 0:
            return 0
        cutoff = self._clock() - retention_days * 86400
        return self.db.write(lambda tx: tx.run("DELETE FROM chats WHERE updated < ?", (cutoff,)))

    def counts(self) -> dict[str, int]:
        row = self.db.read(lambda tx: tx.one("SELECT count(*), coalesce(sum(chars), 0) FROM chats"))
        return {"chats": row[0], "chars": row[1]} if row else {"chats": 0, "chars": 0}


def _json(value: dict[str, Any]) -> str:
    # ASCII: a NUL or a lone surrogate anywhere in the meta is escaped, which both engines keep.
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))
