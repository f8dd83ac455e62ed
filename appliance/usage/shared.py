"""The daily usage table in the store several boxes share (PostgreSQL at `database_url`):
the same table as usage/store.py's SQLite file, added to by every box, so a person's quota
counts what they used on all of them (the ledger reads today's rows back after each write).
"""

from __future__ import annotations

from appliance.usage.store import UsageTable


class SharedUsageStore(UsageTable):
    """The table on the people store's connection (its migrations registered there)."""

    def close(self) -> None:
        """The connection is the people store's too: it stays open."""
