"""Request fields that need the model before they become sampling parameters: logit_bias's
texts tokenized and its ids checked, ignore_eos's end-of-generation tokens, and a grammar
llama.cpp must accept, all before anything is queued."""

from __future__ import annotations

import dataclasses
import math

from appliance.errors import BadRequest
from appliance.http.state import App
from appliance.http.validate import Biases, check_tokens
from appliance.sampling import SamplingParams


async def check_grammar(app: App, grammar: str | None, param: str | None = None) -> None:
    """A grammar llama.cpp refuses is a 400; `param` names the client's own raw GBNF field."""
    try:
        await app.engine.check_grammar(grammar)
    except BadRequest as e:
        if param is None:
            raise
        raise BadRequest(f"'{param}' is not a GBNF grammar llama.cpp accepts (a syntax error, an undefined rule, "
                         "left recursion or a repetition above about 1,000)", param=param, code=e.code) from None


async def biased(app: App, params: SamplingParams, raw: Biases, ignore_eos: bool = False) -> SamplingParams:
    """logit_bias resolved: a text's every token gets its bias (llama-server's), every id is
    checked against the vocabulary (llama.cpp would read past its logits). At most
    MAX_LOGIT_BIAS texts of MAX_BIAS_TEXT characters each are tokenized. ignore_eos (llama-server's)
    bans the end-of-generation tokens: the answer runs to max_tokens or a stop string."""
    if not raw and not ignore_eos:
        return params
    pairs: list[tuple[int, float]] = []
    for key, bias in raw:
        ids = [key] if isinstance(key, int) else await app.engine.tokenize(key, False)
        check_tokens(ids, app.engine.n_vocab, "logit_bias")
        pairs += [(t, bias) for t in ids]
    if ignore_eos:
        pairs += [(t, -math.inf) for t in await app.engine.eog_tokens()]
    return dataclasses.replace(params, logit_bias=tuple(pairs))
