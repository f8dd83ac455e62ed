"""One Database over either engine: a transaction (Tx) runs an owner's statements, `read`
and `write` each run a function in one, and every failure is a StoreError in the owner's words.

The statements are the same on both engines (`?` placeholders, portable types); each backend
adapts them. `Backend` holds what both do the same: the failure's wording and the `trouble`
line (the last failure, "" again after the next write that works), logged once per outage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from appliance.store.errors import StoreError
from appliance.store.migrations import Migrations

log = logging.getLogger(__name__)
T = TypeVar("T")
Params = Sequence[Any]


class Tx(Protocol):
    """One transaction's statements."""

    def run(self, sql: str, params: Params = ()) -> int: ...
    def one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None: ...
    def all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]: ...


class Database(Protocol):
    """What an owner's code (accounts, chats, the usage table, the library) uses of a database."""

    path: str
    trouble: str

    def read(self, fn: Callable[[Tx], T]) -> T: ...
    def write(self, fn: Callable[[Tx], T]) -> T: ...
    def migrate(self, migrations: Migrations) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Naming:
    """How an owner's failures read: `what` (the journal's and the client's name for the
    store) and the error codes a failed read and a failed write carry."""

    what: str = "store"
    read_code: str = "store_unavailable"
    write_code: str = "store_unavailable"
    journal: bool = True  # False: the owner writes its own line per outage (the usage ledger)


class Backend:
    """The failure bookkeeping both engines share."""

    def __init__(self, path: str, naming: Naming) -> None:
        self.path, self.naming = path, naming
        self.trouble = ""  # the last failure, "" since the last write that worked (or never failed)

    def _open_failed(self, detail: object) -> StoreError:
        return StoreError(f"the {self.naming.what} cannot be opened ({self.path}: {detail})",
                          code=self.naming.read_code)

    def _failed(self, detail: object, writing: bool) -> StoreError:
        """The error to raise; the first of a run of failures is one journal line."""
        n = self.naming
        err = (StoreError(f"not saved: the {n.what} cannot be changed now ({self.path}: {detail})", code=n.write_code)
               if writing else
               StoreError(f"the {n.what} cannot be read now ({self.path}: {detail})", code=n.read_code))
        if not self.trouble and n.journal:
            log.error("%s; what it holds is still read where it can be, changes are not being saved", err)
        self.trouble = str(err)
        return err

    def _worked(self) -> None:
        if self.trouble and self.naming.journal:
            log.warning("the %s %s works again: changes are saved", self.naming.what, self.path)
        self.trouble = ""
