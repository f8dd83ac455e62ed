"""The Responses API's previous_response_id: a bounded map from a response id to the session
that holds its conversation in the KV cache and the messages that led to it, per caller
(another caller's id is unknown here), evicted by age and by count. Pure; clock injected.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TTL_S = 3600.0  # an hour: a conversation left longer than that starts again from its messages
MAX_ENTRIES = 1024  # responses kept in all; the least recently used goes first


@dataclass(frozen=True, slots=True)
class Stored:
    session: str  # the engine session the conversation continues (the server's own id)
    messages: list[dict[str, Any]]  # the conversation so far, the answer included, without instructions
    at: float  # when it was stored or last continued (clock s)


class ResponseStore:
    """response id -> Stored, keyed by (caller, id) so that one caller cannot name another's."""

    def __init__(self, ttl_s: float = TTL_S, max_entries: int = MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._items: OrderedDict[tuple[str, str], Stored] = OrderedDict()

    def put(self, caller: str, rid: str, session: str, messages: list[dict[str, Any]]) -> None:
        self._expire()
        self._items[(caller, rid)] = Stored(session, messages, self.clock())
        self._items.move_to_end((caller, rid))
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def get(self, caller: str, rid: str) -> Stored | None:
        self._expire()
        got = self._items.get((caller, rid))
        if got is not None:  # used again: the youngest now, so the oldest stays first to expire
            got = self._items[(caller, rid)] = dataclasses.replace(got, at=self.clock())
            self._items.move_to_end((caller, rid))
        return got

    def __len__(self) -> int:
        return len(self._items)

    def _expire(self) -> None:
        cutoff = self.clock() - self.ttl_s
        while self._items and next(iter(self._items.values())).at < cutoff:
            self._items.popitem(last=False)
