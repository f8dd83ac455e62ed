"""The people store on PostgreSQL (`database_url`): store/postgres.py's database with people's
and chats' tables; the usage table registers its own on the same connection (usage/shared.py).
Imports psycopg: imported only when database_url is set."""

from __future__ import annotations

from appliance.people.db import NAMING
from appliance.people.schema import PEOPLE
from appliance.store.postgres import PgDatabase as Shared


class PgDatabase(Shared):
    def __init__(self, url: str) -> None:
        super().__init__(url, (PEOPLE,), NAMING)
