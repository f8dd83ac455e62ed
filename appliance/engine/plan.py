"""What the scheduler plans with: the limits it keeps to, and the Step it plans (which
turns read one token each, which read a piece of their prompt). Below the scheduler and
its policies (policy/), so each of them and the batch builder read these without the
scheduler itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.engine.turn import Turn


@dataclass(frozen=True, slots=True)
class Limits:
    slots: int  # sequences in the running batch
    batch_tokens: int  # tokens per llama_decode call
    kv_tokens: int  # KV cells shared by all running sequences
    ctx_limit: int  # tokens (prompt + output) one sequence may hold
    prefill_chunk: int = 0  # prompt tokens per step while others stream (0 = batch_tokens)
    # Beside streams, a long prompt is read in about this many steps (0 = chunks).
    prefill_steps: int = 0
    # Finish the shortest prompts that fit in this many tokens first (0 = off).
    prefill_group: int = 0
    max_wait_s: float = 0.03  # admission window when idle
    min_batch: int = 0  # close the window once this many wait (0 = slots)
    max_queue: int = 64
    queue_timeout_s: float = 120.0
    ageing_s: float = 2.0  # a new conversation waiting this long ranks with continuing ones
    # Free slots background work leaves to people (-1: a quarter, at least 1).
    people_slots: int = -1
    tools_tokens: int = 0  # tool definitions a turn may hold beyond ctx_limit (Turn.allowance)
    # An idle engine holds background requests this long before starting them alone: Open
    # WebUI sends one ~0.25 s before the chat turn it goes with, which then waited for its
    # first step (0.78 s for a slot with one llama.cpp thread; the 5 s new-chat check missed).
    background_hold_s: float = 0.5

    @property
    def background_cap(self) -> int:
        """Background turns running at once: an eighth of the slots, at least one. Background
        work beside people moves a tenth of a step's rows, so it holds its slots long: left to
        take every slot but `kept_for_people`, it held 18 of 24 and people's next turns waited
        15 s for a slot (121 s TTFT p50, office of 20 with Open WebUI's titles and tags)."""
        return max(1, self.slots // 8)

    @property
    def kept_for_people(self) -> int:
        if self.people_slots >= 0:
            return min(self.people_slots, self.slots - 1)
        # One slot: background runs, in its turn.
        return min(max(1, self.slots // 4), self.slots - 1)


@dataclass(slots=True)
class Step:
    decode: list[Turn] = field(default_factory=list)  # one token each
    prefill: list[tuple[Turn, int]] = field(default_factory=list)  # (turn, n prompt tokens)

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.prefill)

    @property
    def n_seqs(self) -> int:
        return len(self.decode) + len(self.prefill)
