"""Speculative decoding logic alone: n-gram drafts, draft lengths, budgets, acceptance."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from appliance.engine.spec import (
    DraftState,
    NgramIndex,
    Row,
    accept_greedy,
    accept_sampled,
    allocate,
    fit_tile,
    sparse_row,
    step_budget,
)

# -- n-gram lookup ---------------------------------------------------------------------------


def test_drafts_the_continuation_of_a_repeated_phrase() -> None:
    prompt = [100, 1, 2, 3, 4, 5, 6, 7, 8, 200, 300]
    idx = NgramIndex(prompt)
    idx.extend([9, 2, 3])  # the answer starts to repeat "2 3 ..."
    assert idx.draft(4) == [4, 5, 6, 7]
    assert idx.draft(2) == [4, 5]
    idx.extend([4, 5, 6, 7, 8])
    assert idx.draft(3) == [200, 300, 9]  # follows the latest occurrence to the end


def test_longest_match_and_latest_occurrence_win() -> None:
    # "2 3" is followed by 10 first, then by 20; "1 2 3" only by 10.
    idx = NgramIndex([1, 2, 3, 10, 7, 2, 3, 20, 8, 1, 2, 3])
    assert idx.draft(1) == [10]
    idx = NgramIndex([1, 2, 3, 10, 7, 2, 3, 20, 8, 5, 2, 3])
    assert idx.draft(1) == [20]


def test_nothing_for_novel_text() -> None:
    assert NgramIndex(list(range(50))).draft(8) == []
    assert NgramIndex([]).draft(8) == []
    assert NgramIndex([5]).draft(8) == []
    # a single repeated token is below ngram_min = 2
    assert NgramIndex([1, 7, 2, 3, 7]).draft(8) == []
    assert NgramIndex([1, 2, 1, 2]).draft(0) == []


def test_the_current_suffix_never_matches_itself() -> None:
    # the suffix "1 2 3" exists only at the end: nothing follows it, so no draft
    assert NgramIndex([9, 1, 2, 3]).draft(4) == []
    # a run of one token repeats with period 1 rather than proposing nothing
    assert NgramIndex([4, 5, 5, 5]).draft(3) == [5, 5, 5]
    # a periodic pattern continues with its period
    assert NgramIndex([0, 1, 2, 1, 2, 1, 2]).draft(5) == [1, 2, 1, 2, 1]


def test_incremental_extend_equals_building_from_scratch() -> None:
    rng = np.random.default_rng(7)
    toks = [int(t) for t in rng.integers(0, 6, size=400)]  # small vocabulary: many matches
    inc = NgramIndex(toks[:50])
    for i in range(50, len(toks), 3):
        inc.extend(toks[i:i + 3])
        scratch = NgramIndex(toks[:i + 3])
        assert inc.tokens == scratch.tokens
        assert inc._next == scratch._next
        for n in (1, 4, 9):
            assert inc.draft(n) == scratch.draft(n)


def test_long_prompt_and_answer_stay_linear() -> None:
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(0, 32000, size=4096)]
    idx = NgramIndex(prompt)
    hits = 0
    for t in prompt[1000:3000]:  # the answer copies a long stretch of the prompt
        hits += idx.draft(8)[:1] == [t]
        idx.extend([t])
    assert len(idx.tokens) == 6096
    assert hits > 1990  # after the first two tokens every draft is the copied continuation


# -- adaptive draft length, budget -----------------------------------------------------------


def arm(st: DraftState) -> None:
    for _ in range(st.arm_after):
        st.guess = 7
        st.observe(7)


def test_no_drafts_until_the_lookup_guesses_right_arm_after_times_in_a_row() -> None:
    st = DraftState()
    assert st.arm_after >= 2  # one lucky guess never arms
    assert st.want() == 0  # nothing seen yet: no verify rows spent on a guess
    for right in (True, False, True, False, True):  # right only every other time
        st.guess = 7
        st.observe(7 if right else 8)
        assert st.want() == 0
    st.guess = -1
    st.observe(7)  # no lookup match this step: nothing learnt
    assert st.want() == 0 and st.streak == 1
    for _ in range(st.arm_after - 2):
        st.guess = 7
        st.observe(7)
        assert st.want() == 0
    st.guess = 7
    st.observe(7)
    assert st.want() == st.start


def test_draft_length_grows_on_full_acceptance_and_shrinks_on_rejection() -> None:
    st = DraftState(start=4)  # the default starts at max_len; from 4 the doubling shows
    arm(st)
    assert st.want() == 4
    st.record(4, 4)
    assert st.want() == 8
    st.record(8, 8)
    st.record(16, 16)
    assert st.want() == 16  # capped at max_len
    st.record(16, 5)
    assert st.want() == 6  # one past what held
    st.record(6, 0)
    assert st.want() == 0  # a total miss: back to watching the guesses
    arm(st)
    assert st.want() == st.start


def test_an_edit_between_copied_runs_costs_two_tokens_of_drafting() -> None:
    st = DraftState()
    for _ in range(10):
        arm(st)
        for _ in range(3):  # a copied passage...
            n = st.want()
            assert n > 0
            st.record(n, n)
        st.record(st.want(), 0)  # ...then an edit the lookup could not know
        assert st.want() == 0


def test_a_free_row_verifies_a_disarmed_guess_and_counts_towards_arming() -> None:
    st = DraftState()
    st.record(1, 1)
    assert st.want() == 0 and st.streak == 1
    st.record(1, 0)
    assert st.streak == 0
    for _ in range(st.arm_after):
        st.record(1, 1)
    assert st.want() == st.start  # armed, length untouched by the guesses


def test_fit_tile_rounds_the_steps_rows_to_whole_tiles() -> None:
    # One stream with a 4-token draft: 5 rows, one past a tile, is cut to 3 drafts.
    assert fit_tile([4], [3], [True], 1) == [3]
    # 16 drafts (17 rows) become 15; 8 (9 rows) become 7.
    assert fit_tile([16], [3], [True], 1) == [15]
    assert fit_tile([8], [3], [True], 1) == [7]
    # Already whole: untouched.
    assert fit_tile([3], [3], [True], 1) == [3]
    assert fit_tile([0] * 8, [1] * 8, [False] * 8, 8) == [0] * 8
    # One row short: any stream's looked-up guess fills it, armed or not.
    assert fit_tile([0, 0, 0], [0, 1, 1], [False] * 3, 3) == [0, 1, 0]
    # Two rows short: only an armed stream's lookup, which mostly holds, fills them.
    assert fit_tile([0, 0], [1, 1], [False, False], 2) == [0, 0]
    assert fit_tile([0, 0], [1, 3], [False, True], 2) == [0, 2]
    assert fit_tile([2, 1], [3, 3], [True, True], 3) == [3, 2]  # 6 rows: two short, shared round-robin
    # Not enough to grow: drop what is past the last tile instead, from the longest draft.
    assert fit_tile([2, 1], [0, 0], [True, True], 3) == [0, 1]  # 6 rows: two past a tile
    assert fit_tile([5, 0], [0, 0], [True, False], 2) == [2, 0]  # 7 rows: three past a tile
    # A prefill step does not grow, and never drops rows that are not drafts.
    assert fit_tile([1], [3], [True], 1 + 64, grow=False) == [0]
    assert fit_tile([0, 0], [1, 1], [True, True], 5) == [0, 0]
    # Growing never takes the step past max_rows (llama.cpp's n_batch): drop instead.
    assert fit_tile([2, 1], [3, 3], [True, True], 3, max_rows=6) == [0, 1]
    assert fit_tile([2, 1], [3, 3], [True, True], 3, max_rows=8) == [3, 2]
    for n_rows in range(1, 20):
        for got in ([0], [3], [6, 1], [15, 0, 2]):
            out = fit_tile(got, [4] * len(got), [True] * len(got), n_rows)
            assert all(0 <= o <= g + 4 for o, g in zip(out, got))
            assert (n_rows + sum(out)) % 4 == 0 or sum(out) == 0


def test_step_budget_shrinks_to_zero_at_a_full_batch() -> None:
    assert step_budget(16) == 0
    assert step_budget(20) == 0
    assert step_budget(4) == 0  # four streams: the step is compute-bound already
    assert (step_budget(1), step_budget(2), step_budget(3)) == (16, 4, 1)
    budgets = [step_budget(n) for n in range(1, 20)]
    assert budgets == sorted(budgets, reverse=True)
    assert step_budget(4, budget_tokens=128) == 2


def test_allocate_never_exceeds_budget_or_wants_and_shares_round_robin() -> None:
    assert allocate([4, 4, 4], 6) == [2, 2, 2]
    assert allocate([1, 8, 0, 3], 7) == [1, 3, 0, 3]
    assert allocate([2, 2], 100) == [2, 2]
    assert allocate([], 5) == []
    rng = np.random.default_rng(11)
    for _ in range(500):
        wants = [int(w) for w in rng.integers(0, 17, size=int(rng.integers(1, 12)))]
        budget = int(rng.integers(0, 40))
        got = allocate(wants, budget)
        assert sum(got) == min(budget, sum(wants))
        assert all(0 <= g <= w for g, w in zip(got, wants))
        if budget >= sum(w > 0 for w in wants):
            assert all(g > 0 for g, w in zip(got, wants) if w > 0)


# -- greedy acceptance -----------------------------------------------------------------------

V = 12
_rng = np.random.default_rng(0)
_T, _U = _rng.normal(size=(V, V)), _rng.normal(size=(V, V))


def greedy_next(ctx: list[int]) -> int:
    """A fake model's greedy pick: a fixed function of the previous two tokens."""
    return int(np.argmax(_T[ctx[-1]] + 0.5 * _U[ctx[-2]]))


def plain_greedy(prompt: list[int], n: int) -> list[int]:
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(greedy_next(ctx))
    return ctx[len(prompt):]


Policy = Callable[[list[int], list[int], int], list[int]]  # (context, true future, k) -> draft


@pytest.mark.parametrize("policy", [
    lambda ctx, fut, k: fut[:k],  # right
    lambda ctx, fut, k: fut[:k // 2] + [(t + 1) % V for t in fut[k // 2:k]],  # partly right
    lambda ctx, fut, k: [(t + 1) % V for t in fut[:k]],  # wrong
    lambda ctx, fut, k: [],  # none
], ids=["right", "partly", "wrong", "none"])
def test_greedy_acceptance_emits_exactly_plain_greedy(policy: Policy) -> None:
    prompt, n = [3, 1, 4, 1, 5], 80
    ref = plain_greedy(prompt, n + 20)
    out: list[int] = []
    for step in range(n):
        if len(out) >= n:
            break
        k = 1 + step % 6
        draft = policy(prompt + out, ref[len(out):], k)
        ctx = prompt + out
        targets = [greedy_next(ctx + draft[:i]) for i in range(len(draft) + 1)]
        emitted = accept_greedy(draft, targets)
        assert emitted[:-1] == draft[:len(emitted) - 1]
        out += emitted
    assert out[:n] == ref[:n]


def test_greedy_with_ngram_drafts_matches_plain_greedy_and_accepts_some() -> None:
    prompt, n = [3, 1, 4, 1, 5, 9, 2, 6], 120
    ref = plain_greedy(prompt, n + 20)
    idx, st = NgramIndex(prompt), DraftState()
    out: list[int] = []
    accepted = 0
    while len(out) < n:
        draft = idx.draft(allocate([st.want()], step_budget(1))[0])
        guess = idx.draft(1)
        targets = [greedy_next(idx.tokens + draft[:i]) for i in range(len(draft) + 1)]
        emitted = accept_greedy(draft, targets)
        if draft:
            st.record(len(draft), len(emitted) - 1)
        else:
            st.guess = guess[0] if guess else -1
            st.observe(emitted[0])
        accepted += len(emitted) - 1
        idx.extend(emitted)
        out += emitted
    assert out[:n] == ref[:n]
    assert accepted > n // 2  # the fake model cycles, so lookup drafts mostly hold


def test_accept_greedy_bonus_and_first_mismatch() -> None:
    assert accept_greedy([1, 2, 3], [1, 2, 3, 4]) == [1, 2, 3, 4]
    assert accept_greedy([1, 2, 3], [1, 7, 3, 4]) == [1, 7]
    assert accept_greedy([1, 2, 3], [9, 2, 3, 4]) == [9]
    assert accept_greedy([], [5]) == [5]


# -- sampled acceptance preserves the target distribution ------------------------------------

P0 = np.array([0.5, 0.25, 0.15, 0.1, 0.0])
COND = np.array([  # the fake target's p(next | previous token)
    [0.1, 0.6, 0.1, 0.2, 0.0],
    [0.3, 0.0, 0.3, 0.3, 0.1],
    [0.7, 0.1, 0.1, 0.05, 0.05],
    [0.2, 0.2, 0.2, 0.2, 0.2],
    [0.0, 0.0, 0.5, 0.5, 0.0],
])
TRIALS = 12_000


def target_row(ctx: list[int]) -> Row:
    p = P0 if not ctx else COND[ctx[-1]]
    ids = np.flatnonzero(p)
    return ids, p[ids]


def assert_matches(counts: np.ndarray, probs: np.ndarray) -> None:
    """Chi-squared goodness of fit at p-value 1e-4; impossible cells must stay empty."""
    counts, probs = counts.ravel(), probs.ravel()
    assert counts[probs == 0].sum() == 0
    n, live = counts.sum(), probs > 0
    expected = n * probs[live]
    stat = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    # Wilson-Hilferty: the chi-squared quantile at upper tail 1e-4 (z = 3.719)
    crit = df * (1 - 2 / (9 * df) + 3.719 * math.sqrt(2 / (9 * df))) ** 3
    assert stat < crit, (stat, crit, counts, expected)


@pytest.mark.parametrize("draft", [[0, 1], [3, 3], [4, 2], [1]], ids=["high", "low", "zero", "one"])
def test_first_emitted_token_follows_the_target(draft: list[int]) -> None:
    rng = np.random.default_rng(1234)
    rows = [target_row(draft[:i]) for i in range(len(draft) + 1)]
    counts = np.zeros(5, dtype=np.int64)
    for _ in range(TRIALS):
        counts[accept_sampled(draft, rows, rng)[0]] += 1
    assert_matches(counts, P0)


@pytest.mark.parametrize("draft", [[0, 1], [2, 0], [3, 4], [0]],
                         ids=["likely", "mixed", "unlikely", "bonus"])
def test_first_two_tokens_follow_the_target_joint(draft: list[int]) -> None:
    """Generate two tokens as the engine would: a second step (with its own draft) when the
    first draft was rejected. Also the second token alone, given the first draft held."""
    rng = np.random.default_rng(1234)
    rows = [target_row(draft[:i]) for i in range(len(draft) + 1)]
    joint = np.zeros((5, 5), dtype=np.int64)
    after_accept = np.zeros(5, dtype=np.int64)
    for _ in range(TRIALS):
        out = accept_sampled(draft, rows, rng)
        if len(out) > 1:
            after_accept[out[1]] += 1
        else:
            nxt = [(out[0] + 1) % 5]
            out += accept_sampled(nxt, [target_row(out), target_row(out + nxt)], rng)
        joint[out[0], out[1]] += 1
    assert_matches(joint, P0[:, None] * COND)
    assert after_accept.sum() > TRIALS * P0[draft[0]] * 0.9
    assert_matches(after_accept, COND[draft[0]])


def test_a_certain_draft_is_always_accepted() -> None:
    rng = np.random.default_rng(5)
    rows: list[Row] = [(np.array([7]), np.array([1.0])), (np.array([2, 3]), np.array([0.5, 0.5]))]
    assert all(accept_sampled([7], rows, rng)[0] == 7 for _ in range(100))


# -- logits -> sparse row --------------------------------------------------------------------


def reference_row(logits: list[float], temperature: float, top_k: int, top_p: float,
                  min_p: float) -> tuple[list[int], list[float]]:
    """The chain written out plainly, one token at a time."""
    if temperature <= 0:
        return [max(range(len(logits)), key=lambda i: (logits[i], -i))], [1.0]
    cand = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    if top_k > 0:
        cand = cand[:top_k]

    def probs(ids: list[int], t: float = 1.0) -> list[float]:
        m = max(logits[i] for i in ids)
        e = [math.exp((logits[i] - m) / t) for i in ids]
        return [x / sum(e) for x in e]

    if top_p < 1.0:
        cum = 0.0
        for i, p in enumerate(probs(cand)):
            cum += p
            if cum >= top_p:
                cand = cand[:i + 1]
                break
    if min_p > 0.0:
        ps = probs(cand)
        cand = [c for c, p in zip(cand, ps) if p >= min_p * max(ps)]
    return cand, probs(cand, temperature)


def test_sparse_row_matches_the_reference_chain() -> None:
    rng = np.random.default_rng(42)
    for trial in range(120):
        # narrow and wide spreads: top_k's threshold found near the top, or over the whole row
        logits = rng.normal(scale=(1.0, 3.0, 10.0)[trial % 3], size=50)
        logits[rng.integers(0, 50)] = logits.max()  # a tie at the top now and then
        if trial % 2:  # whole numbers: ties everywhere, at top_k's boundary and min_p's floor too
            logits = np.round(logits)
        for temperature, top_k, top_p, min_p in [(0.0, 40, 1.0, 0.05), (0.7, 40, 1.0, 0.05),
                                                  (1.0, 0, 1.0, 0.0), (0.3, 10, 0.9, 0.0),
                                                  (1.5, 0, 0.8, 0.1), (0.8, 5, 0.5, 0.2),
                                                  (0.7, 10, 0.9, 0.05), (1.0, 3, 0.99, 0.0),
                                                  (0.9, 0, 0.95, 0.05), (1.2, 50, 0.7, 0.01),
                                                  (1.0, 80, 0.6, 0.0), (0.5, 1, 0.5, 0.5)]:
            ids, probs = sparse_row(logits, temperature, top_k, top_p, min_p)
            ref_ids, ref_probs = reference_row(list(logits), temperature, top_k, top_p, min_p)
            assert ids.tolist() == ref_ids
            np.testing.assert_allclose(probs, ref_probs, rtol=1e-9)
            assert probs.sum() == pytest.approx(1.0)


def test_sparse_row_keeps_the_token_that_crosses_top_p() -> None:
    logits = np.log(np.array([0.2, 0.5, 0.3]))
    assert sparse_row(logits, 1.0, top_p=0.75)[0].tolist() == [1, 2]
    assert sparse_row(logits, 1.0, top_p=0.85)[0].tolist() == [1, 2, 0]
    assert sparse_row(logits, 1.0, min_p=0.5)[0].tolist() == [1, 2]
    assert sparse_row(logits, 1.0, top_k=1)[0].tolist() == [1]
    assert sparse_row(logits, 0.0)[0].tolist() == [1]
