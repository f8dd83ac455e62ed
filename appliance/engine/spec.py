"""Speculative decoding from the conversation itself: n-gram drafts, how many to try, and how
to accept them (pure logic: standard library and numpy only, no model).

A sequence's drafts come from its own tokens (prompt + answer so far); the engine verifies
them in the step's one llama_decode as k+1 rows (last token + k drafts) and keeps the emitted
tokens returned by `accept_greedy` / `accept_sampled`, dropping the rest from the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from appliance.sampling import MIN_TEMPERATURE

Row = tuple[np.ndarray, np.ndarray]  # (token ids, probabilities summing to 1), most likely first

# n = 1 matches common tokens ("the", ",") everywhere and proposes noise that costs verify
# rows; 2 tokens already pin a copied passage in most code and prose, and 4 rarely picks a
# different source than 3 while every extra n costs one dict insert per token.
NGRAM_MIN = 2
NGRAM_MAX = 4


class NgramIndex:
    """A sequence's tokens and, per n-gram, where the token after its latest occurrence is."""

    __slots__ = ("tokens", "ngram_min", "ngram_max", "_next")

    def __init__(self, tokens: list[int] | tuple[int, ...] = (), ngram_min: int = NGRAM_MIN,
                 ngram_max: int = NGRAM_MAX) -> None:
        assert 1 <= ngram_min <= ngram_max
        self.tokens: list[int] = []
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        # n-gram -> index of the token that followed its most recent occurrence. An n-gram is
        # only indexed once a token follows it, so the current suffix never finds itself.
        self._next: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: list[int] | tuple[int, ...]) -> None:
        """Append accepted tokens: O(len(tokens) * (ngram_max - ngram_min + 1))."""
        toks, index = self.tokens, self._next
        for t in tokens:
            i = len(toks)  # t lands at i, so the n-grams ending just before i now have a follower
            for n in range(self.ngram_min, min(self.ngram_max, i) + 1):
                index[tuple(toks[i - n:i])] = i
            toks.append(t)

    def draft(self, n_max: int) -> list[int]:
        """Up to n_max tokens that followed the latest earlier occurrence of the longest
        matching suffix n-gram; [] if no suffix of ngram_min tokens or more occurred before."""
        toks, end = self.tokens, len(self.tokens)
        if n_max <= 0:
            return []
        for n in range(min(self.ngram_max, end), self.ngram_min - 1, -1):
            pos = self._next.get(tuple(toks[end - n:]))
            if pos is not None:
                # The source may run into the suffix itself (a repeating pattern of period
                # end - pos); the continuation of a periodic run repeats with that period.
                period = end - pos
                return [toks[pos + j % period] for j in range(n_max)]
        return []


@dataclass(slots=True)
class DraftState:
    """Adaptive draft length of one sequence. It drafts only once armed: the lookup must
    first guess the model's next token right `arm_after` steps in a row, which steps without
    drafts check for free (`guess`, `observe`). Then it drafts `start` tokens, aims one past
    what held after a partial miss and doubles back while drafts hold; a total miss disarms
    it. So an answer that starts copying drafts within three tokens, and plain chat, where
    the lookup's guesses rarely hold three times in a row, pays for few rows."""

    # Armed, draft the longest length at once: past the first tile of four rows a step's
    # cost hardly grows with its rows (1/4/8/16 rows 23/67/101/117 ms on a Zen 4 VM), and an
    # armed lookup mostly holds. Replayed against the bench's rewrite answers
    # (bench/speculation/spec-bound.py's costs from three VMs), 16 after three right guesses beat
    # 4 after two by 1-5% in the decode phase, chat unchanged (docs/benchmarks/speculation.md).
    start: int = 16
    max_len: int = 16  # the whole default step budget: beyond it a step is compute-bound
    min_len: int = 1
    arm_after: int = 3  # right guesses in a row before drafting
    length: int = field(init=False)
    streak: int = field(init=False, default=0)  # right guesses in a row
    armed: bool = field(init=False, default=False)
    guess: int = -1  # the lookup's next token this step, when not drafted (-1: none)

    def __post_init__(self) -> None:
        self.length = self.start

    def want(self) -> int:
        """Draft tokens this sequence would like in the next step (0 while disarmed)."""
        return self.length if self.armed else 0

    def record(self, n_drafted: int, n_accepted: int) -> None:
        """The outcome of a verified draft. A disarmed turn drafts only a free row that
        rounds a step up to a whole tile (fit_tile): its one guess counts towards arming."""
        self.guess = -1
        if not self.armed:
            self._guessed(n_accepted == n_drafted)
        elif n_accepted == n_drafted:  # all right: try longer
            self.length = min(self.max_len, self.length * 2)
        elif n_accepted > 0:  # diverged: aim one past what held
            self.length = max(self.min_len, n_accepted + 1)
        else:  # nothing held: back to watching the guesses
            self.armed, self.streak, self.length = False, 0, self.start

    def observe(self, token: int) -> None:
        """A step without drafts picked `token`: was it the lookup's guess?"""
        if self.guess >= 0:
            self._guessed(token == self.guess)
        self.guess = -1

    def _guessed(self, right: bool) -> None:
        self.streak = self.streak + 1 if right else 0
        self.armed = self.streak >= self.arm_after


def step_budget(n_decode: int, budget_tokens: int = 16) -> int:
    """Draft tokens allowed in a step with n_decode generating sequences.

    On 2 cores a step is compute-bound from its second row: measured with the bundled model
    (bench/speculation/rows.py), 1/2/4/8/16 rows take 28/49/76/141/264 ms, about 15 ms per
    extra row whatever the batch. A draft row pays only when it is accepted often enough to
    beat that: with one stream, drafts of 4 that keep 3 give +50% tokens/s; with four
    streams even 3 of 4 kept per stream loses. So the budget falls fourfold per extra
    stream: 16 rows for one stream, 4 for two, 1 for three, none from four on.
    """
    return budget_tokens >> 2 * (n_decode - 1) if 0 < n_decode < 16 else 0


# llama.cpp's CPU matmuls take the batch's rows four at a time (ggml-cpu repack.cpp's gemm;
# the rows left over run one by one through gemv, each nearly a one-row step's cost).
# Measured with the bundled model on 2 cores (bench/speculation/rows.py, every row with
# logits): 1/2/3/4 rows take 25/47/73/76 ms, 5 take 101, 7/8 take 133/128, 11/12 take
# 172/178, 15/16 take 220/242, 17 take 307. So a row that rounds a step up to a multiple of
# four is nearly free, and one past a multiple costs about a whole one-row step.
ROW_TILE = 4


def fit_tile(got: list[int], spare: list[int], armed: list[bool], n_rows: int, grow: bool = True,
             tile: int = ROW_TILE, max_rows: int | None = None) -> list[int]:
    """Draft tokens per sequence after rounding the step's rows to a whole tile.

    got: drafts allocated; spare: further looked-up tokens each could verify; n_rows: the
    step's other rows (one per generating sequence, plus prefill). With grow, a step one row
    short of a tile takes any sequence's lookup token (nearly free), and one two rows short
    an armed sequence's two (about one step's cost, and an armed lookup mostly holds).
    Otherwise the draft rows past the last whole tile are dropped, from the longest drafts
    (each costs about a whole step). Rows that are not drafts are never dropped. Growing
    never takes the step past max_rows (llama.cpp's n_batch)."""
    got, spare = list(got), list(spare)
    short = -(n_rows + sum(got)) % tile
    if short == 0:
        return got
    if max_rows is not None and n_rows + sum(got) + short > max_rows:
        grow = False
    if grow and short <= 2:
        able = [i for i, s in enumerate(spare) if s > 0 and (armed[i] or short == 1)]
        if sum(spare[i] for i in able) >= short:
            while short:
                for i in able:
                    if short and spare[i] > 0:
                        got[i] += 1
                        spare[i] -= 1
                        short -= 1
            return got
    over = (tile - short) % tile  # rows past the last whole tile
    while over and any(got):
        got[max(range(len(got)), key=got.__getitem__)] -= 1  # from the longest draft
        over -= 1
    return got


def allocate(wants: list[int], budget: int) -> list[int]:
    """Split budget round-robin, one token at a time, never above a sequence's want.

    Pass the lengths of drafts already looked up (draft(want()) first), so budget does not
    go to sequences whose lookup found nothing; then truncate each draft to its share.
    """
    got = [0] * len(wants)
    left = min(budget, sum(max(0, w) for w in wants))
    while left > 0:
        for i, w in enumerate(wants):
            if left > 0 and got[i] < w:
                got[i] += 1
                left -= 1
    return got


def accept_greedy(draft: list[int], targets: list[int]) -> list[int]:
    """Emitted tokens: the draft's prefix that equals the target's picks, then the target's
    own pick at the first mismatch (or the bonus targets[k]); len = n_accepted + 1."""
    assert len(targets) == len(draft) + 1
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return [*draft[:n], targets[n]]


def accept_sampled(draft: list[int], rows: list[Row], rng: np.random.Generator) -> list[int]:
    """Speculative sampling for a deterministic draft: accept draft[i] with probability
    p_i(draft[i]); on rejection emit a sample of p_i without draft[i], renormalised, and stop;
    if all pass, emit a sample of rows[k]. Each emitted token is then distributed exactly as
    the target model's own sample given the tokens before it (p(d) + (1 - p(d)) * 0 for the
    draft token, (1 - p(d)) * p(x) / (1 - p(d)) = p(x) for any other x), so the output
    distribution is exactly that of the target model. len(result) = n_accepted + 1."""
    assert len(rows) == len(draft) + 1
    out: list[int] = []
    for d, (ids, probs) in zip(draft, rows):
        keep = ids != d
        if rng.random() < probs[~keep].sum():
            out.append(d)
            continue
        out.append(_sample(ids[keep], probs[keep], rng))
        return out
    ids, probs = rows[len(draft)]
    out.append(_sample(ids, probs, rng))
    return out


def _sample(ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    if not len(ids):
        raise ValueError("no candidate token left to sample")
    cum = np.cumsum(probs)  # need not sum to 1: scaled by its total
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(ids[min(i, len(ids) - 1)])


def sparse_row(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
               min_p: float = 0.0) -> Row:
    """The distribution our llama.cpp chain samples from (appliance/model/llm.py `Sampler`, without
    penalties): top_k, top_p, min_p on temperature-1 probabilities, then logits / temperature,
    softmax. temperature <= 0 is greedy: the first argmax with probability 1.

    Every verified draft row goes through here, so it must cost far less than a decode row:
    sorting the whole vocabulary (152k for Qwen) took 15-20 ms a row, about a one-row step.
    top_k and min_p each keep the tokens at or above a threshold, found in O(vocab), so only
    those few are sorted; top_p's running sum divides by the whole top_k set's mass, which is
    also O(vocab). Only a chain with neither top_k nor min_p sorts the whole vocabulary.
    (On a 152k row: 0.1-0.3 ms with top_k, 1.8 ms with top_k 0 and top_p.)"""
    x = np.asarray(logits, dtype=np.float64)
    if temperature < MIN_TEMPERATURE:
        return np.array([int(np.argmax(x))]), np.ones(1)
    n, top = len(x), float(x.max())
    k = top_k if 0 < top_k < n else n
    kth = _kth_largest(x, k, top) if k < n else -np.inf  # top_k keeps x >= kth (k of them)
    floor = top + np.log(min_p) if min_p > 0.0 else -np.inf  # min_p keeps p >= min_p * p_max
    ids = np.flatnonzero(x >= max(kth, floor))
    ids = ids[np.lexsort((ids, -x[ids]))][:k]  # most likely first, ties by token id
    if top_p < 1.0:
        # top_p sums probabilities over the top_k set: its mass, ties at the k-th logit counted
        # up to k, whether or not min_p already dropped some of it.
        above = x > kth
        mass = float(np.exp(x[above] - top).sum()) + (k - int(above.sum())) * float(np.exp(kth - top))
        cum = np.cumsum(np.exp(x[ids] - top)) / mass
        # the smallest prefix whose mass reaches top_p (llama.cpp keeps the crossing token)
        ids = ids[:int(np.searchsorted(cum, top_p, side="left")) + 1]
    lg = x[ids]
    return ids, _softmax((lg - lg[0]) / temperature)  # shifted first: never inf - inf


def _kth_largest(x: np.ndarray, k: int, top: float) -> float:
    """The k-th largest of x. The logits near the top are few, and if k of them lie within
    `width` of the top, the k-th largest is theirs: partition those, not the vocabulary."""
    for width in (8.0, 16.0):
        near = x[x >= top - width]
        if len(near) >= k:
            return float(np.partition(near, len(near) - k)[len(near) - k])
    return float(np.partition(x, len(x) - k)[len(x) - k])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@dataclass(slots=True)
class TurnDrafts:
    """What one generating turn carries for speculation."""

    index: NgramIndex
    state: DraftState = field(default_factory=DraftState)
    rng: np.random.Generator = field(default_factory=np.random.default_rng)  # sampled acceptance
