"""Turns that share a prompt compute it once: a turn whose prompt a running turn (its
leader) is computing more of than any cache entry holds waits for that leader and copies
its cells (`leader`, `resolve`), so a client's requests arriving together (n choices, a
burst) compute their common prompt once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from appliance.engine.turn import State, Turn
from appliance.model.prompt import common_prefix


class CopyOps(Protocol):
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...


def leader(turn: Turn, running: Iterable[Turn], share_all: bool) -> tuple[Turn | None, int]:
    """The running turn it may share with that has (or computes) the longest part of its
    prompt, and how many tokens of it: another client's only when everything is shared."""
    best, best_n = None, 0
    for other in running:
        if other is turn or other.leader is not None or other.seq_id < 0:
            continue
        if other.client != turn.client and not share_all:
            continue
        cap = min(len(turn.prompt) - 1, len(other.prompt))
        n = min(common_prefix(other.prompt, turn.prompt), cap)
        if n > best_n:
            best, best_n = other, n
    return best, best_n


def resolve(running: Iterable[Turn], model: CopyOps) -> int:
    """Followers whose leader has computed their share copy it now; those whose leader is
    gone compute it themselves. Returns how many copied."""
    copied = 0
    for s in running:
        lead = s.leader
        if lead is None:
            continue
        if lead.state is State.FINISHED or lead.seq_id < 0:
            s.leader = None  # the leader is gone: compute the prefix ourselves
        elif lead.n_cached >= s.lead_n:
            model.seq_cp(lead.seq_id, s.seq_id, 0, s.lead_n)
            s.n_cached = s.n_reused = s.copied = s.lead_n
            s.leader = None
            copied += 1
    return copied
