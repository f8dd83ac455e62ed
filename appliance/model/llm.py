"""A thin wrapper over llama.cpp's low-level C API (with schema_gbnf.py, the only llama_cpp users).

One model, one context with a unified KV cache shared by many sequences. Everything but
`Tokenizer` must be called from the engine thread, which owns the context.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as C
import numpy as np

from appliance.errors import GrammarDeadEnd, KVCacheFull
from appliance.sampling import SamplingParams

log = logging.getLogger(__name__)
_llama_log = logging.getLogger("llama.cpp")
# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the last line.
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


@C.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp is chatty at INFO (every tensor on load); keep it at DEBUG unless it warns.
    lvl = _LEVELS.get(level, logging.DEBUG)
    if lvl < logging.WARNING:
        lvl = logging.DEBUG
    if _llama_log.isEnabledFor(lvl):
        _llama_log.log(lvl, "%s", text.decode("utf-8", "replace").rstrip())


C.llama_log_set(_log_callback, ctypes.c_void_p(0))


class LLMError(Exception):
    """llama.cpp refused: a model it cannot load, a bad argument, a failed decode."""


@dataclass(frozen=True, slots=True)
class ContextSpec:
    n_ctx: int  # total KV cells shared by all sequences (kv_unified)
    n_seq_max: int  # distinct sequence ids
    n_batch: int  # most tokens in one llama_decode call
    threads: int
    repack: bool = True  # llama.cpp's extra weight layouts (AMX, repacked Q4 kernels)
    kv_type: str = "f16"  # "q8_0" halves the KV cache's memory
    # Tokens computed at once inside one llama_decode (0 = n_batch). llama.cpp's compute
    # buffer holds n_ubatch rows of logits (151,936 floats each for Qwen2.5: 580 KiB a row).
    n_ubatch: int = 0


KV_TYPES = {"f16": 1, "q8_0": 8}  # ggml_type values


class Tokenizer:
    """Read-only vocabulary access; safe to call from any thread (llama-server does too)."""

    def __init__(self, model: C.llama_model_p) -> None:
        self._vocab = C.llama_model_get_vocab(model)
        self.vocab = self._vocab  # for grammar samplers
        self.n_vocab = C.llama_vocab_n_tokens(self._vocab)
        # Texts of control tokens ("<|im_start|>"...): client strings the template writes
        # verbatim must not contain them (prompt.py keeps message content out of reach).
        self.control_texts = frozenset(
            t for t in (self.token_text(i) for i in range(self.n_vocab) if C.llama_vocab_is_control(self._vocab, i)) if t)
        self._pieces: dict[int, bytes] = {}
        tmpl = C.llama_model_chat_template(model, None)
        self.chat_template: str | None = tmpl.decode() if tmpl else None
        self.bos_text = self.token_text(C.llama_vocab_bos(self._vocab))
        self.eos_text = self.token_text(C.llama_vocab_eos(self._vocab))
        # Fill-in-the-middle tokens (prefix, suffix, middle), when the model has them.
        fim = (C.llama_vocab_fim_pre(self._vocab), C.llama_vocab_fim_suf(self._vocab), C.llama_vocab_fim_mid(self._vocab))
        self.fim: tuple[int, int, int] | None = fim if all(t >= 0 for t in fim) else None

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """add_special: add BOS/EOS as the model asks; parse_special: text such as
        "<|im_end|>" becomes that control token (only ever for text the template wrote)."""
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (C.llama_token * n_max)()
        n = C.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (C.llama_token * n_max)()
            n = C.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token as shown to users (special tokens render empty)."""
        p = self._pieces.get(token)
        if p is None:
            p = self._to_piece(token, special=False)
            self._pieces[token] = p
        return p

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._to_piece(token, special=True).decode("utf-8", "replace")

    def _to_piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self._vocab, token))

    def grammar_parses(self, gbnf: str) -> bool:
        """Does llama.cpp accept this grammar? (Any thread: it only reads the vocabulary.)"""
        g = C.llama_sampler_init_grammar(self._vocab, gbnf.encode(), b"root")
        if not g:
            return False
        C.llama_sampler_free(g)
        return True

    def detokenize(self, tokens: list[int]) -> str:
        """Token ids -> text as users see it (control tokens render empty)."""
        return b"".join(self.piece(t) for t in tokens if 0 <= t < self.n_vocab).decode("utf-8", "replace")


SHORTLIST = 256  # likeliest tokens a grammar checks first when the chain's pick fails it

# llama_token_data as numpy sees it: a whole vocabulary's candidates built in one copy.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def _candidates(data: np.ndarray) -> C.llama_token_data_array:
    return C.llama_token_data_array(data=data.ctypes.data_as(C.llama_token_data_p), size=len(data),
                                    selected=-1, sorted=False)


class Sampler:
    """A llama.cpp sampler chain for one sequence, and its grammar if the answer must
    follow one; frees itself with the sequence."""

    def __init__(self, params: SamplingParams, n_vocab: int, vocab: Any = None) -> None:
        self._chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        self._grammar = None
        if params.grammar is not None:
            self._grammar = C.llama_sampler_init_grammar(vocab, params.grammar.encode(), b"root")
            if not self._grammar:
                C.llama_sampler_free(self._chain)
                self._chain = None
                raise LLMError("the grammar does not parse")
        # Plain greedy needs no sampler state: LLM.sample_all takes an argmax of all such
        # rows at once instead of one chain call per sequence.
        self.plain_greedy = params.greedy and not params.has_penalties and self._grammar is None
        # How many grammar-approved tokens among the likeliest make the shortlist exact: the
        # chain only looks at top_k of them (greedy: one). Without top_k (or with
        # penalties, which reorder tokens) the whole vocabulary is needed: 0.
        need = 1 if params.greedy else params.top_k
        self.shortlist_need = 0 if params.has_penalties or need > SHORTLIST else need
        add = lambda s: C.llama_sampler_chain_add(self._chain, s)  # noqa: E731
        if params.logit_bias:  # first, as llama.cpp's common sampler has it: the penalties see the biased logits
            biases = (C.llama_logit_bias * len(params.logit_bias))(*(C.llama_logit_bias(t, b) for t, b in params.logit_bias))
            add(C.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), biases))
        if params.repeat_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
            add(C.llama_sampler_init_penalties(
                n_vocab, params.penalty_last_n, params.repeat_penalty,
                params.frequency_penalty, params.presence_penalty))
        if params.greedy:
            add(C.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(C.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                add(C.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(C.llama_sampler_init_min_p(params.min_p, 1))
            add(C.llama_sampler_init_temp(params.temperature))
            seed = C.LLAMA_DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF
            add(C.llama_sampler_init_dist(seed))

    def free(self) -> None:
        if self._chain:
            C.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar:
            C.llama_sampler_free(self._grammar)
            self._grammar = None

    def sample_constrained(self, logits: np.ndarray) -> int:
        """Sample a grammar-bound row as llama.cpp's common sampler does: take the chain's
        pick from the full distribution, and only when the grammar rejects it, constrain
        and pick again. Checking all 152k tokens against a grammar takes 10-20 ms on 2
        cores, so the grammar first sees only the likeliest SHORTLIST tokens: when at least
        `need` of those pass (top_k's worth, or one for greedy), they are exactly the
        candidates the chain would keep from the whole constrained vocabulary."""
        n = len(logits)
        data = np.empty(n, dtype=_TOKEN_DATA)
        data["id"], data["logit"], data["p"] = np.arange(n, dtype=np.int32), logits, 0.0
        cur = _candidates(data)
        C.llama_sampler_apply(self._chain, ctypes.byref(cur))
        token = int(data["id"][cur.selected])
        one = np.array([(token, 0.0, 0.0)], dtype=_TOKEN_DATA)
        C.llama_sampler_apply(self._grammar, ctypes.byref(_candidates(one)))
        if not np.isfinite(one["logit"][0]):
            token = self._constrained_pick(logits)
        # Only the final pick advances the grammar and the penalties' history.
        C.llama_sampler_accept(self._grammar, token)
        C.llama_sampler_accept(self._chain, token)
        return token

    def _constrained_pick(self, logits: np.ndarray) -> int:
        n = len(logits)
        if self.shortlist_need and n > SHORTLIST:
            top = np.argpartition(-logits, SHORTLIST)[:SHORTLIST]
            data = np.empty(SHORTLIST, dtype=_TOKEN_DATA)
            data["id"], data["logit"], data["p"] = top.astype(np.int32), logits[top], 0.0
            cur = _candidates(data)
            C.llama_sampler_apply(self._grammar, ctypes.byref(cur))
            if int(np.isfinite(data["logit"]).sum()) >= self.shortlist_need:
                C.llama_sampler_apply(self._chain, ctypes.byref(cur))
                return int(data["id"][cur.selected])
        data = np.empty(n, dtype=_TOKEN_DATA)
        data["id"], data["logit"], data["p"] = np.arange(n, dtype=np.int32), logits, 0.0
        cur = _candidates(data)
        C.llama_sampler_apply(self._grammar, ctypes.byref(cur))
        if not np.isfinite(data["logit"]).any():
            raise GrammarDeadEnd()
        C.llama_sampler_apply(self._chain, ctypes.byref(cur))
        return int(data["id"][cur.selected])

    def __del__(self) -> None:
        self.free()


class LLM:
    """The model and its one context. Engine thread only."""

    def __init__(self, path: Path, spec: ContextSpec) -> None:
        C.llama_backend_init()
        mparams = C.llama_model_default_params()
        mparams.use_extra_bufts = spec.repack
        self.model = C.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise LLMError(f"llama.cpp could not load {path}: truncated, corrupt or not a supported model; "
                           "delete it and start again (the bundled model is re-assembled) or run `appliance pull`")
        cparams = C.llama_context_default_params()
        cparams.n_ctx = spec.n_ctx
        # llama.cpp reserves one output row per sequence id as the context is made and aborts
        # the process unless they fit in n_batch (batch_tokens 32 with 55 sequence ids): its
        # buffer gets that floor, the steps we send stay within spec.n_batch (self._cap).
        cparams.n_batch = max(spec.n_batch, spec.n_seq_max)
        cparams.n_ubatch = min(spec.n_ubatch or spec.n_batch, spec.n_batch)
        cparams.n_seq_max = spec.n_seq_max
        cparams.n_threads = spec.threads
        cparams.n_threads_batch = spec.threads
        cparams.kv_unified = True  # one cell pool: sequences share budget and prefixes
        cparams.type_k = cparams.type_v = KV_TYPES[spec.kv_type]
        cparams.no_perf = True
        self.ctx = C.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            C.llama_model_free(self.model)
            raise LLMError(f"llama.cpp could not create a context of {spec.n_ctx} tokens")
        self.spec = spec
        self.mem = C.llama_get_memory(self.ctx)
        self.tokenizer = Tokenizer(self.model)
        self._batch = C.llama_batch_init(spec.n_batch, 0, 1)
        desc = ctypes.create_string_buffer(256)
        C.llama_model_desc(self.model, desc, len(desc))
        # Saved sequence state is only valid for the same weights, llama.cpp and KV type.
        self.fingerprint = (f"{desc.value.decode(errors='replace')}|{C.llama_model_n_params(self.model)}|"
                            f"{C.llama_model_size(self.model)}|llama-cpp-python {C.__version__}|kv {spec.kv_type}")
        # llama.cpp's own build number and commit are not in the wheel (built from an sdist
        # without git: llama_build_info would say b0-unknown); the binding's version pins both.
        self.build = C.__version__
        self._cap = spec.n_batch

    # -- decoding ------------------------------------------------------------------------
    def decode(self, tokens: Seq[int], pos: Seq[int], seq_ids: Seq[int], logits: Seq[bool]) -> None:
        """One llama_decode over a mixed batch; row i of the batch is token i."""
        n = len(tokens)
        if n > self._cap:
            raise LLMError(f"batch of {n} tokens exceeds n_batch {self._cap}")
        b = self._batch
        tok, ps, nseq, sid, out = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i in range(n):
            tok[i] = tokens[i]
            ps[i] = pos[i]
            nseq[i] = 1
            sid[i][0] = seq_ids[i]
            out[i] = logits[i]
        b.n_tokens = n
        # llama.cpp returns output rows in batch order: row i -> its index among outputs.
        self._out_index = {i: k for k, i in enumerate(i for i in range(n) if logits[i])}
        rc = C.llama_decode(self.ctx, b)
        if rc == 1:
            # No room for the batch; nothing was written, so the engine can evict and retry.
            raise KVCacheFull(f"no KV cache room for {n} tokens")
        if rc != 0:
            raise LLMError(f"llama_decode returned {rc}")

    def sample_all(self, picks: Seq[tuple[Sampler, int]]) -> list[int | Exception]:
        """Sample (sampler, batch row) pairs of the last decode. Plain greedy rows share one
        numpy argmax over the logits matrix; the rest run their own sampler chains. A pick
        whose own sampler refuses (its grammar allows no token) gets the exception instead of
        a token: the others are sampled once each all the same."""
        greedy = [k for k, (smp, _) in enumerate(picks) if smp.plain_greedy]
        out: list[int | Exception] = [0] * len(picks)
        if greedy:
            n_out = len(self._out_index)
            allrows = np.ctypeslib.as_array(C.llama_get_logits(self.ctx), shape=(n_out, self.tokenizer.n_vocab))
            idx = [self._out_index[picks[k][1]] for k in greedy]
            for k, tok in zip(greedy, np.argmax(allrows[idx], axis=1).tolist()):
                out[k] = tok
        for k, (smp, row) in enumerate(picks):
            if not smp.plain_greedy:
                try:
                    out[k] = self.sample(smp, row)
                except GrammarDeadEnd as e:
                    out[k] = e
        return out

    def _rows(self, first: int, n: int) -> np.ndarray:
        # A turn's draft rows are consecutive in the batch, hence among the outputs: a view,
        # valid until the next decode.
        k = self._out_index[first]
        allrows = np.ctypeslib.as_array(C.llama_get_logits(self.ctx), shape=(len(self._out_index), self.tokenizer.n_vocab))
        return allrows[k:k + n]

    def greedy_rows(self, first: int, n: int) -> list[int]:
        """The argmax of batch rows first..first+n-1 of the last decode."""
        return [int(x) for x in np.argmax(self._rows(first, n), axis=1)]

    def logits_rows(self, first: int, n: int) -> np.ndarray:
        return self._rows(first, n)

    def sample(self, sampler: Sampler, row: int) -> int:
        """Sample from the logits of batch row `row` (must have had logits=True)."""
        if sampler._grammar is not None:
            return sampler.sample_constrained(self._rows(row, 1)[0])
        return int(C.llama_sampler_sample(sampler._chain, self.ctx, row))

    def logprobs(self, row: int, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
        """log p(token) under the model's own distribution at batch row `row`, and the k
        likeliest tokens with theirs (OpenAI's logprobs: before temperature and filters)."""
        x = self._rows(row, 1)[0].astype(np.float64)
        m = float(x.max())
        lse = m + float(np.log(np.exp(x - m).sum()))
        top: list[int] = []
        if k > 0:
            part = np.argpartition(-x, k - 1)[:k]
            top = part[np.argsort(-x[part], kind="stable")].tolist()
        return float(x[token]) - lse, [(t, float(x[t]) - lse) for t in top]

    def new_sampler(self, params: SamplingParams) -> Sampler:
        return Sampler(params, self.tokenizer.n_vocab, self.tokenizer.vocab)

    # -- KV cache ------------------------------------------------------------------------
    def set_threads(self, n: int) -> None:
        """Threads for the next decodes (cores.CoreShare); cheap: read per graph compute."""
        C.llama_set_n_threads(self.ctx, n, n)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """Drop positions [p0, p1) of a sequence (-1 = open end)."""
        if not 0 <= seq_id < self.spec.n_seq_max:
            raise LLMError(f"seq_rm({seq_id}): sequence id out of range")
        C.llama_memory_seq_rm(self.mem, seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Let dst share src's cells [p0, p1): no copy of data in a unified cache."""
        # llama.cpp aborts the process on a bad id; a Python error is recoverable.
        if not (0 <= src < self.spec.n_seq_max and 0 <= dst < self.spec.n_seq_max):
            raise LLMError(f"seq_cp({src}, {dst}): sequence id out of range")
        C.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_pos_max(self, seq_id: int) -> int:
        return int(C.llama_memory_seq_pos_max(self.mem, seq_id))

    def seq_state(self, seq_id: int) -> bytes:
        size = C.llama_state_seq_get_size(self.ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        n = C.llama_state_seq_get_data(self.ctx, buf, size, seq_id)
        return bytes(memoryview(buf)[:n])  # buffer copy, not a list of ints

    def set_seq_state(self, seq_id: int, data: bytes) -> bool:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return C.llama_state_seq_set_data(self.ctx, buf, len(data), seq_id) > 0

    def close(self) -> None:
        if self.ctx:
            C.llama_batch_free(self._batch)
            C.llama_free(self.ctx)
            C.llama_model_free(self.model)
            self.ctx = None
            self.model = None
