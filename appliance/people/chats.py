"""A person's chats kept on the box: every query names the person, so a chat of someone else
is simply not found (a 404 at the route, the same as one that never was).

The page owns a conversation's shape: it puts the whole list of messages after each turn
(edits and regenerations included), bounded by `MAX_CHAT_CHARS`. A share is a random token
held as its digest; a shared chat is read by that token only, read-only.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.people.accounts import AccountError, digest
from appliance.people.db import Database, Tx

ROLES = frozenset({"user", "assistant", "system"})
MAX_CHATS = 5000  # per person
MAX_MESSAGES = 2048  # per chat, as max_messages
MAX_CHAT_CHARS = 2_000_000  # a chat's text and metadata (a long chat with attached documents' text)
MAX_TITLE = 200
SEARCH_MAX = 200  # characters of a search


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str
    meta: dict[str, Any]  # what the page shows beside it: stats, attachments' names and text

    @classmethod
    def parse(cls, raw: object) -> Message:
        if not isinstance(raw, dict) or raw.get("role") not in ROLES or not isinstance(raw.get("content"), str):
            raise AccountError("each message is {role: user|assistant|system, content: text, meta?: object}")
        meta = raw.get("meta", {})
        if not isinstance(meta, dict):
            raise AccountError("a message's meta is an object")
        return cls(raw["role"], raw["content"], meta)


def clean_title(title: object) -> str:
    if not isinstance(title, str):
        raise AccountError("a title is text")
    title = " ".join(title.split())[:MAX_TITLE]
    return title or "New chat"


def _like(query: str) -> str:
    return "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class Chats:
    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock

    def listed(self, pid: str, query: str = "", limit: int = 500) -> list[dict[str, Any]]:
        """The person's chats, newest first; with a query, those whose title or text contains it."""
        query = query.strip()[:SEARCH_MAX]
        sql = "SELECT id, title, created, updated, share FROM chats c WHERE person = ?"
        params: list[Any] = [pid]
        if query:
            sql += (" AND (title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE m.chat = c.id "
                    "AND m.content LIKE ? ESCAPE '\\'))")
            params += [_like(query), _like(query)]
        rows = self.db.read(lambda tx: tx.all(sql + " ORDER BY updated DESC LIMIT ?", (*params, limit)))
        return [{"id": cid, "title": title, "created": created, "updated": updated, "shared": share is not None}
                for cid, title, created, updated, share in rows]

    def get(self, pid: str, cid: str) -> dict[str, Any] | None:
        return self.db.read(lambda tx: self._get(tx, "c.person = ? AND c.id = ?", (pid, cid)))

    def shared(self, token: str) -> dict[str, Any] | None:
        """A chat by its share link's token (read-only; its owner's name, not their id)."""
        return self.db.read(lambda tx: self._get(tx, "c.share = ?", (digest(token),)))

    @staticmethod
    def _get(tx: Tx, where: str, params: tuple[str, ...]) -> dict[str, Any] | None:
        row = tx.one(f"SELECT c.id, c.title, c.created, c.updated, c.share, p.name FROM chats c "
                     f"JOIN people p ON p.id = c.person WHERE {where} AND p.disabled = 0", params)
        if row is None:
            return None
        messages = tx.all("SELECT role, content, meta FROM messages WHERE chat = ? ORDER BY seq", (row[0],))
        return {"id": row[0], "title": row[1], "created": row[2], "updated": row[3], "shared": row[4] is not None,
                "owner": row[5],
                "messages": [{"role": r, "content": c, "meta": json.loads(m)} for r, c, m in messages]}

    def put(self, pid: str, cid: str | None, title: object, messages: list[Message]) -> dict[str, Any]:
        """Create (cid None) or replace a chat's title and messages; its listing."""
        title = clean_title(title)
        rows = [(m.role, m.content, json.dumps(m.meta, ensure_ascii=False, separators=(",", ":"))) for m in messages]
        chars = sum(len(c) + len(m) for _, c, m in rows) + len(title)
        if len(rows) > MAX_MESSAGES:
            raise AccountError(f"a chat keeps at most {MAX_MESSAGES} messages")
        if chars > MAX_CHAT_CHARS:
            raise AccountError(f"a chat keeps at most {MAX_CHAT_CHARS:,} characters ({chars:,} sent): start a new one")
        now = self._clock()
        new = cid is None
        chat_id = secrets.token_urlsafe(16) if cid is None else cid

        def put(tx: Tx) -> dict[str, Any] | None:
            if new:
                if tx.one("SELECT count(*) FROM chats WHERE person = ?", (pid,))[0] >= MAX_CHATS:  # type: ignore[index]
                    raise AccountError(f"at most {MAX_CHATS:,} chats a person: delete some first")
                tx.run("INSERT INTO chats (id, person, title, created, updated, chars) VALUES (?, ?, ?, ?, ?, ?)",
                       (chat_id, pid, title, now, now, chars))
            elif not tx.run("UPDATE chats SET title = ?, updated = ?, chars = ? WHERE id = ? AND person = ?",
                            (title, now, chars, chat_id, pid)):
                return None
            tx.run("DELETE FROM messages WHERE chat = ?", (chat_id,))
            for seq, (role, content, meta) in enumerate(rows):
                tx.run("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?)", (chat_id, seq, role, content, meta, now))
            return {"id": chat_id, "title": title, "updated": now, "messages": len(rows)}

        done = self.db.write(put)
        if done is None:
            raise KeyError(cid)
        return done

    def rename(self, pid: str, cid: str, title: object) -> bool:
        title = clean_title(title)
        return self.db.write(lambda tx: tx.run("UPDATE chats SET title = ? WHERE id = ? AND person = ?",
                                               (title, cid, pid))) > 0

    def delete(self, pid: str, cid: str) -> bool:
        return self.db.write(lambda tx: tx.run("DELETE FROM chats WHERE id = ? AND person = ?", (cid, pid))) > 0

    def delete_all(self, pid: str) -> int:
        return self.db.write(lambda tx: tx.run("DELETE FROM chats WHERE person = ?", (pid,)))

    def share(self, pid: str, cid: str) -> str | None:
        """A new share link's token for the chat (an earlier link stops working), or None."""
        token = secrets.token_urlsafe(32)
        done = self.db.write(lambda tx: tx.run("UPDATE chats SET share = ? WHERE id = ? AND person = ?",
                                               (digest(token), cid, pid)))
        return token if done else None

    def unshare(self, pid: str, cid: str) -> bool:
        return self.db.write(lambda tx: tx.run("UPDATE chats SET share = NULL WHERE id = ? AND person = ?",
                                               (cid, pid))) > 0

    def prune(self, retention_days: float) -> int:
        """Forget chats not touched for retention_days (0 = keep them all)."""
        if retention_days <= 0:
            return 0
        cutoff = self._clock() - retention_days * 86400
        return self.db.write(lambda tx: tx.run("DELETE FROM chats WHERE updated < ?", (cutoff,)))

    def counts(self) -> dict[str, int]:
        row = self.db.read(lambda tx: tx.one("SELECT count(*), coalesce(sum(chars), 0) FROM chats"))
        return {"chats": row[0], "chars": row[1]} if row else {"chats": 0, "chars": 0}
