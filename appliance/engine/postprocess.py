"""The step's last phase, after llama_decode (nano-vllm's `postprocess`): advance each
turn's cached count, sample (or verify drafts), take the tokens, emit their text, and
finish the turns that ended: slot back, KV kept or freed, the stream told how it ended.
A base of EngineCore (core.py), which owns everything named below; engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from appliance.engine import repeat
from appliance.engine.batch import Batch
from appliance.engine.events import Delta, Done, Event, Failed, TokenLogprob
from appliance.engine.figures import Figures
from appliance.engine.inbox import Inbox
from appliance.engine.kv.budget import KVBudget
from appliance.engine.kv.store import KVStore
from appliance.engine.model_api import Model
from appliance.engine.names import log_finished
from appliance.engine.plan import Limits, Step
from appliance.engine.scheduler import Scheduler
from appliance.engine.snapshot import Stats
from appliance.engine.spec import accept_greedy, accept_sampled, sparse_row
from appliance.engine.turn import Sink, State, Turn
from appliance.errors import ApplianceError, EngineFailure

log = logging.getLogger("appliance.engine.core")  # one logger for the core's phases
Events = list[tuple[Sink, Event]]


class Postprocess:
    # Set by EngineCore.__init__.
    model: Model
    limits: Limits
    inbox: Inbox
    clock: Callable[[], float]
    figures: Figures
    request_timeout_s: float
    budget: KVBudget
    sched: Scheduler
    kv: KVStore
    stats: Stats
    events: Events

    @property
    def ctx_cap(self) -> int:
        """Most tokens a turn may hold (+ its Turn.allowance): the context limit, or the
        cells public prefixes leave."""
        return min(self.limits.ctx_limit, self.budget.total - self.budget.pinned)

    def _postprocess(self, step: Step, batch: Batch) -> None:
        self._advance(step, batch)
        self._sample(batch)

    def _advance(self, step: Step, batch: Batch) -> None:
        st = self.stats
        st.steps += 1
        st.peak_seqs_per_step = max(st.peak_seqs_per_step, step.n_seqs)
        n_prefill = len(batch.tokens) - len(step.decode) - batch.n_drafts
        st.prompt_tokens_computed += n_prefill
        st.step_log.append((len(step.decode), len(step.prefill), n_prefill, batch.n_drafts))
        st.decode_rows += len(step.decode)
        for t in step.decode:
            t.n_cached += 1
        for t, n in step.prefill:
            t.n_cached += n
            if t.front_end and self.kv.commons is not None and t.n_cached - n < t.system_len:
                self.kv.stats.promoted += self.kv.commons.computed(t)  # a front-end's block: public once read
            # One small object per step per prompt that asked (Turn.reports), before its
            # first Delta (sampled after this); nothing per token, nothing for the decode rows.
            if t.reports(self.limits.batch_tokens):
                self.events.append((t.sink, t.reading))

    def _sample(self, batch: Batch) -> None:
        now = self.clock()
        plain = [(t, row) for t, row, d in batch.picks if not d]
        sampled = self.model.sample_all([(t.sampler, row) for t, row in plain])
        for (t, row), token in zip(plain, sampled):
            if isinstance(token, Exception):  # what this turn's own parameters made fail
                self._sampling_failed(t, token)
                continue
            if t.drafts is not None and t.state is State.DECODE:
                t.drafts.state.observe(token)  # the lookup's guess, right or wrong
            self._accept(t, token, now, self._logprob(row, token, t.params.logprobs))
        for t, row, d in batch.picks:
            if d:
                try:
                    self._verify(t, row, d, now)
                except Exception as e:  # noqa: BLE001 - this turn's numerics, not the engine's
                    self._sampling_failed(t, e)

    def _sampling_failed(self, t: Turn, e: Exception) -> None:
        """What one turn's own parameters make fail (a grammar that allows no token here,
        the numerics of an odd temperature) ends that turn with an error, not the engine."""
        log.error("request %d: sampling failed: %s", t.rid, e)
        err = e if isinstance(e, ApplianceError) else EngineFailure(f"sampling failed: {e}")
        self._finish(t, "error", err)

    def _verify(self, t: Turn, row: int, draft: list[int], now: float) -> None:
        """Keep the drafts the model agrees with plus one token of its own; the rejected
        drafts' cells leave the KV cache."""
        k, p = len(draft), t.params
        assert t.drafts is not None
        if p.greedy:
            out = accept_greedy(draft, self.model.greedy_rows(row, k + 1))
        else:
            logits = self.model.logits_rows(row, k + 1)
            rows = [sparse_row(logits[i], p.temperature, p.top_k, p.top_p, p.min_p) for i in range(k + 1)]
            out = accept_sampled(draft, rows, t.drafts.rng)
        n_ok = len(out) - 1
        t.drafts.state.record(k, n_ok)
        self.stats.draft_tokens += k
        self.stats.draft_accepted += n_ok
        t.n_cached += n_ok
        if n_ok < k:
            self.model.seq_rm(t.seq_id, t.n_cached, -1)
        for token in out:
            if not self._accept(t, token, now):
                break

    def _logprob(self, row: int, token: int, k: int | None) -> TokenLogprob | None:
        """Only for the rows that asked: the logits are still those of the last decode."""
        if k is None:
            return None
        lp, top = self.model.logprobs(row, token, k)
        piece = self.model.tokenizer.piece
        return TokenLogprob(piece(token), lp, [(piece(x), v) for x, v in top], token,
                            tuple(x for x, _ in top))

    def _accept(self, t: Turn, token: int, now: float, lp: TokenLogprob | None = None) -> bool:
        """Take one sampled token; False once the turn has finished."""
        t.state = State.DECODE
        tokenizer = self.model.tokenizer
        if tokenizer.is_eog(token):
            self._finish(t, "stop")
            return False
        t.output.append(token)
        if lp is not None:
            t.logprobs.append(lp)
        if t.drafts is not None:
            t.drafts.index.extend((token,))
        self.stats.generated_tokens += 1
        if t.guard is None:  # every token but an answer's opening after a tool's result: no list, no join
            text = t.text.push(tokenizer.piece(token))
        elif (pieces := self._guarded(t, tokenizer.piece(token))) is None:
            return False  # rewound: it samples its first token again
        else:
            text = "".join(t.text.push(p) for p in pieces)
        if t.unban is not None:
            repeat.first_token_taken(t, self.model)
        if text:
            self._emit_text(t, text, now)
        if t.text.stopped:
            self._finish(t, "stop")
        elif (len(t.output) >= t.params.max_tokens
              # prompt + output, not n_cached: a verified run advances n_cached by all its
              # accepted drafts before their tokens are taken one by one here.
              or t.n_prompt + len(t.output) >= min(self.ctx_cap + t.allowance,
                                                   self.budget.total - self.budget.pinned + t.shared)
              or now - t.arrival > self.request_timeout_s):
            self._finish(t, "length")
        return t.state is not State.FINISHED

    def _guarded(self, t: Turn, piece: bytes) -> list[bytes] | None:
        """repeat.py: what of the answer's opening goes out now; None: it repeated a call just
        answered, and the turn was rewound."""
        pieces = t.guard.feed(piece)
        if pieces is None:
            repeat.rewind(t, self.model)
        elif pieces:
            t.guard = None
        return pieces

    def _emit_text(self, t: Turn, text: str, now: float) -> None:
        if t.first_token_at:
            self.figures.itl.observe(now - t.last_emit_at)
        else:
            self.figures.ttft.observe(now - t.arrival)
        if not t.first_token_at:
            t.first_token_at = now
        t.last_emit_at = now
        last = self.events[-1] if self.events else None
        if last is not None and last[0] is t.sink and isinstance(last[1], Delta):
            # Tokens of one step (accepted drafts) go out as one chunk: one SSE event for
            # the HTTP side to write, not one per token, on a core llama.cpp wants back.
            last[1].text += text
            last[1].logprobs.extend(t.logprobs)
            last[1].tokens.extend(t.unsent())
        else:
            self.events.append((t.sink, Delta(text, t.logprobs, t.unsent())))
        t.logprobs = []

    # -- finishing -----------------------------------------------------------------------
    def _finish(self, t: Turn, reason: str, error: ApplianceError | None = None, keep: bool = False) -> None:
        """Give the slot back, keep or free the KV, and tell the stream how it ended. A turn
        cut by a stop (`keep`) ends with its error but keeps its KV, and what it had
        generated goes out first, so its conversation is saved and continues after a restart."""
        self.sched.release(t)
        self.inbox.finished(t)
        t.leader = None
        self._release_kv(t, keep=(error is None or keep) and t.n_cached > 0)
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        log_finished(t, reason, error, self.clock())
        if error is None or keep:
            held = t.guard.release() if t.guard is not None else []  # an opening held (repeat.py): text
            tail = "".join(t.text.push(p) for p in held) + t.text.flush() if t.text is not None else ""
            # Held-back text, or tokens a stop string swallowed.
            if tail or t.logprobs or t.n_sent < len(t.output):
                self.events.append((t.sink, Delta(tail, t.logprobs, t.unsent())))
                t.logprobs = []
        if error is not None:
            self.events.append((t.sink, Failed(error)))
            return
        self.figures.answered(t.first_token_at, self.clock())
        self.events.append((t.sink, Done(reason, t.n_prompt, len(t.output), t.n_reused)))

    def _release_kv(self, t: Turn, keep: bool) -> None:
        if t.seq_id >= 0:
            # Cells past prompt + output (drafts verified after the last kept token) go.
            held = t.n_prompt + len(t.output)
            if t.n_cached > held:
                self.model.seq_rm(t.seq_id, held, -1)
                t.n_cached = held
            self.kv.keep_or_free(t, keep)
            t.seq_id = -1
        if t.sampler is not None:
            t.sampler.free()
            t.sampler = None

