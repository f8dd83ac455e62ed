"""One decode step as llama_decode gets it: each generating turn's last token and its draft
tokens, each prefilling turn's next prompt chunk, and which rows are sampled afterwards."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.engine.plan import Step
from appliance.engine.spec import ROW_TILE, allocate, fit_tile, step_budget
from appliance.engine.turn import Turn


@dataclass(slots=True)
class Batch:
    """One llama_decode call: row i of the batch is token i."""

    tokens: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    want: list[bool] = field(default_factory=list)  # logits for this row
    # (turn, first logits row, draft tokens verified in the rows after it) to sample
    picks: list[tuple[Turn, int, list[int]]] = field(default_factory=list)
    n_drafts: int = 0

    def add(self, turn: Turn, tokens: list[int], start: int, logits: bool, draft: list[int] | None = None) -> None:
        """tokens at positions start...; with logits, the last 1 + len(draft) rows get them."""
        draft = draft or []
        n = len(tokens)
        self.tokens.extend(tokens)
        self.pos.extend(range(start, start + n))
        self.seq_ids.extend([turn.seq_id] * n)
        n_out = 1 + len(draft) if logits else 0
        self.want.extend([False] * (n - n_out) + [True] * n_out)
        if logits:
            self.picks.append((turn, len(self.tokens) - n_out, draft))
        self.n_drafts += len(draft)


# llama.cpp's CPU flash attention reads a batch of 64 rows or more in tiles of 64 rows
# (GGML_FA_TILE_Q) and skips a tile of cells only when every row of the tile masks it all:
# decode rows of many conversations in one tile attend over the union of their cells, where
# a batch under 64 rows skips masked cells row by row. So a step that carries streams and a
# prompt chunk costs more in one call than in two once the streams hold enough cells, and
# less below that by the second pass over the weights (2 cores, streams + a 60/120-token
# prompt, one call against two: 8 streams of 140 cells 0.97x/1.01x, 8 of 340 1.27x/1.26x,
# 16 of 340 1.40x/1.24x, 12 of 540 1.84x/1.32x; an office's pasted page's 118-token chunk
# beside 9 streams ~1,120 ms in one call, ~790 + ~145 in two).
FA_TILE_ROWS = 64
SPLIT_MIN_CELLS = 1536  # the streams' cells (together) from which two calls pay


def split(step: Step) -> list[Step]:
    """The step as llama_decode calls: one, or, when streams and prompt chunks together
    reach a tile and the streams hold SPLIT_MIN_CELLS, the chunks that do not fit beside
    the streams under FA_TILE_ROWS first, then the streams with the rest (short prompts
    finish beside them, as planned)."""
    if not step.decode or step.n_tokens < FA_TILE_ROWS or sum(t.n_cached for t in step.decode) < SPLIT_MIN_CELLS:
        return [step]
    rows = len(step.decode)
    beside: list[tuple[Turn, int]] = []
    alone: list[tuple[Turn, int]] = []
    for t, n in step.prefill:  # shortest first: as many prompts as fit finish beside the streams
        if rows + n < FA_TILE_ROWS:
            beside.append((t, n))
            rows += n
        else:
            alone.append((t, n))
    return [Step(prefill=alone), Step(decode=step.decode, prefill=beside)]


def build(step: Step, spec_budget: int, max_rows: int, ctx_cap: int, pool: int = 1 << 30) -> Batch:
    """The step's batch: max_rows is llama.cpp's n_batch, ctx_cap the most tokens one turn
    may hold (drafts never run past it)."""
    batch = Batch()
    drafts = plan_drafts(step.decode, sum(n for _, n in step.prefill), spec_budget, max_rows, ctx_cap, pool)
    for t, d in zip(step.decode, drafts):
        batch.add(t, [t.last_token, *d], t.n_cached, True, d)
    for t, n in step.prefill:
        start = t.n_cached
        batch.add(t, t.prompt[start:start + n], start, start + n == t.n_prompt)
    return batch


def plan_drafts(decode: list[Turn], n_prefill: int, spec_budget: int, max_rows: int, ctx_cap: int,
                pool: int = 1 << 30) -> list[list[int]]:
    """Each generating turn's draft tokens for this step: within the step's budget, then
    rounded so the step's rows fill whole tiles of the CPU matmuls (spec.fit_tile)."""
    if not spec_budget:
        return [[] for _ in decode]
    n_rows = len(decode) + n_prefill
    # Never past batch_tokens (llama.cpp's n_batch): the prefill was planned without drafts.
    budget = min(step_budget(len(decode), spec_budget), max_rows - n_rows)
    found: list[list[int]] = []
    wants: list[int] = []
    for t in decode:
        d = t.drafts
        # Never draft past max_tokens or the context: the KV reservation covers neither.
        room = min(t.params.max_tokens - len(t.output), min(ctx_cap + t.allowance, pool + t.shared) - t.n_cached) - 2
        if d is None or room <= 0:
            found.append([])
            wants.append(0)
            continue
        want = d.state.want()  # 0 while disarmed: look up one token, as a free guess
        # A few more than wanted, for rounding up to a whole tile.
        draft = d.index.draft(min(want + ROW_TILE - 1 if want else 1, room))
        d.state.guess = draft[0] if draft else -1  # checked in core._sample if not drafted
        found.append(draft)
        wants.append(min(want, len(draft)))
    got = allocate(wants, budget)
    armed = [t.drafts is not None and t.drafts.state.armed for t in decode]
    # Growing uses free rows only in steps without prefill: a prefill step's rows are
    # the prompt's, and its length is not the drafts' to round.
    got = fit_tile(got, [len(f) - g for f, g in zip(found, got)], armed, n_rows,
                   grow=not n_prefill, max_rows=max_rows)
    return [f[:g] for f, g in zip(found, got)]
