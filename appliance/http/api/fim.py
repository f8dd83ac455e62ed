"""Prompts as tokens for the routes without a chat template (/v1/completions, /infill,
Ollama's /api/generate): token ids checked, a prompt fit to its room, and fill-in-the-middle
prompts cut as llama-server cuts them.
"""

from __future__ import annotations

from collections.abc import Sequence

from appliance.engine.engine import Engine
from appliance.errors import BadRequest, ContextLengthExceeded
from appliance.http.validate import check_tokens


def fit(tokens: list[int], limit: int, param: str = "prompt") -> list[int]:
    if not tokens:
        raise BadRequest(f"'{param}' must not be empty", param=param)
    if len(tokens) > limit:
        raise ContextLengthExceeded(f"the prompt is {len(tokens)} tokens, and this server allows {limit} prompt "
                                    "tokens with this max_tokens", param=param)
    return tokens


def fim_prompt(fim: tuple[int, int, int], prefix: Sequence[int], suffix: Sequence[int], limit: int,
               extra: Sequence[int] = (), middle: Sequence[int] = ()) -> tuple[list[int], bool]:
    """[extra] PRE prefix SUF suffix MID [middle] within `limit` tokens, and whether anything
    was cut. Like llama-server: the end of the prefix and the start of the suffix are kept,
    the suffix gets at least a quarter of the room if it needs it, extra context the rest."""
    pre, suf, mid = fim
    room = limit - 3 - len(middle)
    if room < 0:
        raise ContextLengthExceeded(f"the infill prompt is {len(middle)} tokens, and this server allows {limit} "
                                    "prompt tokens with this max_tokens", param="prompt")
    n_suf = min(len(suffix), room // 4)
    n_pre = min(len(prefix), room - n_suf)
    n_suf = min(len(suffix), room - n_pre)
    n_extra = min(len(extra), room - n_pre - n_suf)
    tokens = [*extra[len(extra) - n_extra:], pre, *prefix[len(prefix) - n_pre:], suf, *suffix[:n_suf], mid, *middle]
    return tokens, (n_pre, n_suf, n_extra) != (len(prefix), len(suffix), len(extra))


async def tokens_of(engine: Engine, prompt: str | list[int], special: bool) -> list[int]:
    """A prompt given as text or as token ids, as checked token ids."""
    if isinstance(prompt, str):
        return await engine.tokenize(prompt, special) if prompt else []
    check_tokens(prompt, engine.n_vocab)
    return prompt


def fim_ids(engine: Engine, param: str = "suffix") -> tuple[int, int, int]:
    fim = engine.fim_tokens
    if fim is None:
        raise BadRequest(f"this model has no fill-in-the-middle tokens, so '{param}' is not supported", param=param)
    return fim
