"""The people store's tables, as numbered migrations: a store is at version len(MIGRATIONS)
once opened, each migration applied once, in one transaction with its version number.

Portable SQL (SQLite and PostgreSQL): TEXT ids and hex digests, DOUBLE PRECISION Unix times,
INTEGER flags; no engine-specific types.
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: people, invites, sessions, their keys; chats, messages, shares
        """CREATE TABLE people (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, name_key TEXT NOT NULL UNIQUE,
            role TEXT NOT NULL, quota INTEGER, password TEXT, disabled INTEGER NOT NULL DEFAULT 0,
            created DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE invites (
            digest TEXT PRIMARY KEY, person TEXT NOT NULL REFERENCES people (id) ON DELETE CASCADE,
            expires DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE sessions (
            digest TEXT PRIMARY KEY, person TEXT NOT NULL REFERENCES people (id) ON DELETE CASCADE,
            csrf TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, expires DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX sessions_person ON sessions (person)",
        """CREATE TABLE person_keys (
            digest TEXT PRIMARY KEY, id TEXT NOT NULL UNIQUE,
            person TEXT NOT NULL REFERENCES people (id) ON DELETE CASCADE,
            label TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX person_keys_person ON person_keys (person)",
        """CREATE TABLE chats (
            id TEXT PRIMARY KEY, person TEXT NOT NULL REFERENCES people (id) ON DELETE CASCADE,
            title TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL,
            chars INTEGER NOT NULL DEFAULT 0, share TEXT UNIQUE)""",
        "CREATE INDEX chats_person ON chats (person, updated)",
        """CREATE TABLE messages (
            chat TEXT NOT NULL REFERENCES chats (id) ON DELETE CASCADE, seq INTEGER NOT NULL,
            role TEXT NOT NULL, content TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}',
            created DOUBLE PRECISION NOT NULL, PRIMARY KEY (chat, seq))""",
    ),
)
