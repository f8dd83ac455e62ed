"""The KV pool's cells and who counts on them. One owner below both the scheduler, which
reserves cells for the turns it admits, and the KV store, which pins public prefixes and
keeps idle conversations in what is left (as nano-vllm's block manager sits below its
scheduler and knows nothing of it). Each figure has one writer: the scheduler reserves and
releases (the store gives back, once, what a turn copied from a pinned prefix), the core
and the commons pin and unpin, through the methods here.

`InFlight` is what the KV code reads of the turns in flight (the scheduler satisfies it):
passed in, so kv/ never imports the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from appliance.engine.turn import Turn


class InFlight(Protocol):
    """The running turns (each holding a reservation) and the waiting ones, in the scheduler's order."""

    @property
    def running(self) -> Sequence[Turn]: ...

    @property
    def waiting(self) -> Iterable[Turn]: ...


@dataclass(slots=True)
class KVBudget:
    total: int  # the pool's cells (kv_tokens)
    pinned: int = 0  # held for good by public prefixes: no reservation may count on them
    reserved: int = 0  # promised to running turns (the sum of their Turn.reserved)

    @property
    def committed(self) -> int:
        """Cells promised or pinned: what idle conversations may not use."""
        return self.reserved + self.pinned

    def fits(self, cells: int) -> bool:
        """Whether `cells` more can be promised or pinned beside what is."""
        return self.committed + cells <= self.total

    def hold(self, turn: Turn, cells: int) -> None:
        """Make what is reserved for `turn` `cells` (0 gives it all back). Turn.reserved is the
        one record of it: a turn's kv_reserve may change as it runs (a rewound turn's prompt
        is its retry prompt, which may be shorter), what it gives back may not."""
        self.reserved += cells - turn.reserved
        turn.reserved = cells
        assert self.reserved >= 0, "released more cells than were reserved"

    def pin(self, cells: int) -> None:
        self.pinned += cells

    def unpin(self, cells: int) -> None:
        self.pinned -= cells
        assert self.pinned >= 0, "unpinned more cells than were pinned"
