"""The people store's tables, as numbered migrations (store/migrations.py): a store is at
version len(MIGRATIONS) once opened, each migration applied once, in one transaction with its
version number. Chats' tables are here too: they share people's file and foreign keys, and
version 1 made both, so their history is one.

Portable SQL (SQLite and PostgreSQL): TEXT ids and hex digests, DOUBLE PRECISION Unix times,
INTEGER flags; no engine-specific types.
"""

from __future__ import annotations

from appliance.store.migrations import Migrations

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
        # A chat's id is its person's own (the page names it): ids of two people never meet.
        """CREATE TABLE chats (
            person TEXT NOT NULL REFERENCES people (id) ON DELETE CASCADE, id TEXT NOT NULL,
            title TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}', created DOUBLE PRECISION NOT NULL,
            updated DOUBLE PRECISION NOT NULL, chars INTEGER NOT NULL DEFAULT 0, share TEXT UNIQUE,
            PRIMARY KEY (person, id))""",
        "CREATE INDEX chats_updated ON chats (person, updated)",
        """CREATE TABLE messages (
            person TEXT NOT NULL, chat TEXT NOT NULL, seq INTEGER NOT NULL,
            role TEXT NOT NULL, content TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}',
            PRIMARY KEY (person, chat, seq),
            FOREIGN KEY (person, chat) REFERENCES chats (person, id) ON DELETE CASCADE)""",
    ),
)

# schema_version: PostgreSQL's table for people's number, named before owners had their own.
PEOPLE = Migrations("people", MIGRATIONS, version_table="schema_version")
