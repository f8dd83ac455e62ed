"""Perplexity and top-token agreement of a model file, through the appliance's own llama.cpp
(`appliance requantize` reports both for the file it made; bench/memory/quant-quality.py tabulates them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from appliance.ops.tune import pick_cpus

PPL_TEXT = "/usr/share/common-licenses/GPL-3"  # in every Debian and Raspberry Pi OS (base-files)
PPL_CTX = 512  # as `llama-perplexity -c 512`


@dataclass(slots=True)
class Quality:
    ppl: float
    top: list[int]  # the model's top token at every scored position, for agreement()


def perplexity(model_path: Path, text_path: Path, chunks: int = 0, threads: int = 0, repack: bool = True) -> Quality:
    """Perplexity the way llama-perplexity computes it: the text in chunks of PPL_CTX tokens,
    each scored on its second half (the first half is context). Through the appliance's own
    llama.cpp, so it measures what would be served."""
    import numpy as np

    from appliance import cpu
    from appliance.model.llm import LLM, ContextSpec

    threads = threads or len(pick_cpus(cpu.allowed_cpus())[0])
    llm = LLM(model_path, ContextSpec(n_ctx=PPL_CTX, n_seq_max=1, n_batch=PPL_CTX, threads=threads,
                                      repack=repack, n_ubatch=128))
    try:
        tokens = llm.tokenizer.tokenize(text_path.read_text(encoding="utf-8"), add_special=True, parse_special=False)
        n_chunks = len(tokens) // PPL_CTX
        n_chunks = min(n_chunks, chunks) if chunks else n_chunks
        first = PPL_CTX // 2
        nll, count, top = 0.0, 0, []
        for c in range(n_chunks):
            chunk = tokens[c * PPL_CTX:(c + 1) * PPL_CTX]
            llm.seq_rm(0)
            llm.decode(chunk, list(range(PPL_CTX)), [0] * PPL_CTX, [i >= first - 1 for i in range(PPL_CTX)])
            rows = np.asarray(llm.logits_rows(first - 1, PPL_CTX - first), dtype=np.float64)
            mx = rows.max(axis=1)
            logz = mx + np.log(np.exp(rows - mx[:, None]).sum(axis=1))
            nxt = np.asarray(chunk[first:])
            nll += float((logz - rows[np.arange(len(nxt)), nxt]).sum())
            count += len(nxt)
            top += rows.argmax(axis=1).tolist()
    finally:
        llm.close()
    if not count:
        raise ValueError(f"{text_path} is shorter than {PPL_CTX} tokens")
    return Quality(math.exp(nll / count), top)


def agreement(a: Quality, b: Quality) -> float:
    """Share of positions where both models' top token is the same (teacher-forced greedy agreement)."""
    n = min(len(a.top), len(b.top))
    return sum(x == y for x, y in zip(a.top[:n], b.top[:n])) / max(1, n)
