"""Chunked prefill: how many prompt tokens a step reads. The shortest waiting prompts that
fit in `prefill_group` tokens together are finished at once; longer prompts go at full
speed when nobody streams, and in chunks when someone does, so a long paste never freezes
the streams."""

from __future__ import annotations

from appliance.engine.plan import Limits
from appliance.engine.turn import Turn


class Chunking:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def budget(self, n_decode: int, prefilling: list[Turn]) -> int:
        """Prompt tokens for this step. First tokens sooner: the shortest waiting prompts
        that fit in `prefill_group` tokens together are finished in this step, so they get
        their first token now instead of after one big step over every prompt (with nobody
        streaming yet) or several small chunks (while others stream). Longer prompts go at
        full speed when nobody streams, and in `prefill_chunk` pieces when someone does, so
        a long paste never freezes the streams."""
        limits = self.limits
        room = limits.batch_tokens - n_decode
        group, grouped = 0, 0
        for s in prefilling:
            if group + s.prefill_left > limits.prefill_group:
                break
            group, grouped = group + s.prefill_left, grouped + 1
        if n_decode and limits.prefill_chunk:
            # The prompts beyond the group get their chunk on top: short first turns arrive
            # all the time in an office, and a paste that only got what they left waited for
            # a lull (5 s for 700 tokens, twice its compute).
            if grouped < len(prefilling):
                return min(room, group + self.chunk(prefilling[grouped:]))
            return min(room, max(group, limits.prefill_chunk))
        return min(room, group or room)

    def chunk(self, prefilling: list[Turn]) -> int:
        """Prompt tokens per step while others stream: `prefill_chunk`, or for a long prompt
        1/`prefill_steps` of what it had to compute, at most half a step. A pasted page read
        64 tokens a step waits one short step per chunk beside a dozen streams (~0.1 s each
        on 2 cores): 700 tokens in 11 chunks came 5 s after sending, where the same work in
        four pieces takes ~3.5 s; the streams' gap grows for those four steps only. Half of
        `batch_tokens` (~1 s a step on 2 cores) bounds that gap for a paste of any length."""
        chunk = self.limits.prefill_chunk
        if self.limits.prefill_steps and prefilling:
            longest = max(len(s.prompt) - s.n_reused for s in prefilling)
            chunk = max(chunk, min(self.limits.batch_tokens // 2, -(-longest // self.limits.prefill_steps)))
        return chunk

    def first(self, s: Turn) -> int:
        """A long prompt whose stream hears its progress computes one `prefill_chunk` in
        its first step, so the first note comes within a short step's time (64 tokens:
        ~0.3 s on 2 cores, where a full 512-token step takes ~2 s); prompt tokens/s hardly
        depends on the step's size (64-512 tokens), so the extra step costs a few ms."""
        if (s.progress and self.limits.prefill_chunk and s.n_cached == s.n_reused
                and s.long_prompt(self.limits.batch_tokens)):
            return self.limits.prefill_chunk
        return s.prefill_left
