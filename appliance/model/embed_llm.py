"""llama.cpp's side of the embedding model (embedding.py makes the GGUF): the model, loaded
once and shared read-only, and contexts on it that encode whole batches of sequences into
mean-pooled vectors. Each context belongs to one thread (appliance/library/embedder.py).

The only other llama_cpp user beside llm.py and schema_gbnf.py; importing llm.py installs
the llama.cpp log callback, and its Tokenizer reads the vocabulary from any thread.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp as C
import numpy as np

from appliance.model.llm import LLMError, Tokenizer


class EmbeddingModel:
    """The weights and vocabulary; contexts on it may run in different threads at once
    (llama.cpp only reads a model after loading it)."""

    def __init__(self, path: Path) -> None:
        C.llama_backend_init()
        mparams = C.llama_model_default_params()
        self.model = C.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise LLMError(f"llama.cpp could not load the embedding model {path}: truncated or corrupt; "
                           "run `python -m appliance.model.files fetch-embedding --force`")
        self.tokenizer = Tokenizer(self.model)
        self.dim = int(C.llama_model_n_embd_out(self.model))
        self.n_ctx_train = int(C.llama_model_n_ctx_train(self.model))
        vocab = C.llama_model_get_vocab(self.model)
        self.sep = int(C.llama_vocab_sep(vocab))
        # [UNK], which the bindings give no getter for: what a word outside the vocabulary becomes.
        self.unk = self.tokenizer.tokenize("[UNK]", add_special=False, parse_special=True)[0]

    def tokenize(self, text: str) -> list[int]:
        """Word pieces between [CLS] and [SEP]; text such as "[SEP]" stays text."""
        return self.tokenizer.tokenize(text, add_special=True, parse_special=False)

    def close(self) -> None:
        if self.model:
            C.llama_model_free(self.model)
            self.model = None


class EmbeddingContext:
    """One llama.cpp context computing mean-pooled embeddings: each call encodes its
    sequences in one llama_decode. BERT attends both ways, so llama.cpp cannot split a
    sequence across micro-batches: a call holds at most n_tokens tokens (n_ubatch) and
    n_seq_max sequences."""

    def __init__(self, model: EmbeddingModel, n_tokens: int, n_seq_max: int, threads: int) -> None:
        cparams = C.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_tokens
        cparams.n_seq_max = n_seq_max
        cparams.kv_unified = True  # no KV cache to split; else llama.cpp warns n_ctx is not divisible by n_seq_max
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.embeddings = True
        cparams.pooling_type = C.LLAMA_POOLING_TYPE_MEAN
        cparams.attention_type = C.LLAMA_ATTENTION_TYPE_NON_CAUSAL
        cparams.no_perf = True
        self.ctx = C.llama_init_from_model(model.model, cparams)
        if not self.ctx:
            raise LLMError(f"llama.cpp could not create an embedding context of {n_tokens} tokens")
        self.n_tokens, self.n_seq_max, self.dim = n_tokens, n_seq_max, model.dim
        # A BERT context has no KV cache (None here); cleared all the same between calls in
        # case a later llama.cpp gives it one.
        self.mem = C.llama_get_memory(self.ctx)
        self._batch = C.llama_batch_init(n_tokens, 0, 1)

    def encode(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """The mean of each sequence's last hidden states, (len(seqs), dim) float32, not normalized."""
        n = sum(len(s) for s in seqs)
        if not seqs or n > self.n_tokens or len(seqs) > self.n_seq_max or any(not s for s in seqs):
            raise LLMError(f"cannot encode {len(seqs)} sequences of {n} tokens in one call "
                           f"(at most {self.n_seq_max} non-empty ones of {self.n_tokens} tokens)")
        b = self._batch
        tok, ps, nseq, sid, out = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        i = 0
        for s, seq in enumerate(seqs):
            for p, t in enumerate(seq):
                tok[i], ps[i], nseq[i], out[i] = t, p, 1, 1
                sid[i][0] = s
                i += 1
        b.n_tokens = n
        C.llama_memory_clear(self.mem, True)
        rc = C.llama_decode(self.ctx, b)
        if rc != 0:
            raise LLMError(f"llama_decode of {len(seqs)} sequences ({n} tokens) returned {rc}")
        rows = np.empty((len(seqs), self.dim), dtype=np.float32)
        for s in range(len(seqs)):
            ptr = C.llama_get_embeddings_seq(self.ctx, s)
            if not ptr:
                raise LLMError(f"llama.cpp returned no embedding for sequence {s}")
            rows[s] = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.dim,))
        return rows

    def close(self) -> None:
        if self.ctx:
            C.llama_batch_free(self._batch)
            C.llama_free(self.ctx)
            self.ctx = None
