"""appliance.model.llm on the real model: what only llama.cpp itself can show."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.errors import GrammarDeadEnd
from appliance.sampling import SamplingParams


@pytest.mark.integration
def test_a_grammar_with_no_way_on_is_refused_not_accepted(bundled_model: Path) -> None:
    # llama.cpp parses an empty character class; at it no token is allowed, and accepting
    # one anyway throws inside llama.cpp, which aborts the whole process (SIGABRT).
    from appliance.model.llm import LLM, ContextSpec

    llm = LLM(bundled_model, ContextSpec(n_ctx=256, n_seq_max=2, n_batch=64, threads=1, repack=False))
    try:
        assert llm.tokenizer.grammar_parses('root ::= "{" [z-a]')
        prompt = llm.tokenizer.tokenize("Write a JSON object:", False, False)
        for greedy in (True, False):
            params = SamplingParams(max_tokens=4, temperature=0.0 if greedy else 0.8, grammar='root ::= "{" [z-a]')
            smp = llm.new_sampler(params)
            llm.seq_rm(0)
            llm.decode(prompt, list(range(len(prompt))), [0] * len(prompt), [False] * (len(prompt) - 1) + [True])
            (first,) = llm.sample_all([(smp, len(prompt) - 1)])
            assert llm.tokenizer.piece(first) == b"{"  # the one token the grammar allows
            llm.decode([first], [len(prompt)], [0], [True])
            (stuck,) = llm.sample_all([(smp, 0)])
            assert isinstance(stuck, GrammarDeadEnd)
            smp.free()
    finally:
        llm.close()


@pytest.mark.integration
def test_more_sequence_ids_than_batch_tokens_load_and_decode(bundled_model: Path) -> None:
    # llama.cpp reserves an output row per sequence id in n_batch's buffer and aborted the
    # whole process (GGML_ASSERT) when batch_tokens 32 met 55 sequence ids (llama-server's
    # --batch-size 32 through compat/llama-server-shim.py).
    from appliance.model.llm import LLM, ContextSpec, LLMError

    llm = LLM(bundled_model, ContextSpec(n_ctx=256, n_seq_max=40, n_batch=8, threads=1, repack=False))
    try:
        prompt = llm.tokenizer.tokenize("Hello there, how are you?", False, False)[:8]
        llm.decode(prompt, list(range(len(prompt))), [39] * len(prompt), [False] * (len(prompt) - 1) + [True])
        assert llm.seq_pos_max(39) == len(prompt) - 1
        with pytest.raises(LLMError, match="exceeds n_batch"):  # the engine's own cap on a step still holds
            llm.decode(list(range(9)), list(range(9)), [0] * 9, [False] * 9)
    finally:
        llm.close()
