"""The one place a job becomes a prompt: chat messages, a raw prompt (text or token ids) or
a fill-in-the-middle request in; the token prompt, its sampling with logit_bias resolved, and
its grammar checked out, in one order for every front-end: biases, grammar, prompt (with the
library's sources when a chat asks for them: retrieval.py), room. All of it happens before
anything is queued, so a refusal is a 400 (or 413) and no slot is spent on it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from appliance.engine.engine import Engine
from appliance.errors import BadRequest, ContextLengthExceeded
from appliance.http.grounded import Check
from appliance.http.retrieval import Cite, cited
from appliance.http.validate import Biases, check_tokens
from appliance.model.prompt import Prompt
from appliance.sampling import SamplingParams
from appliance.structured.tools import answered

# Between input_extra chunks when the model has no file-separator token (llama-server's).
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True, slots=True)
class Messages:
    """Messages through the model's chat template (the oldest turns dropped to fit)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class Raw:
    """A prompt the client wrote whole: text (its control-token text parsed) or token ids."""

    prompt: str | list[int]


@dataclass(frozen=True, slots=True)
class Infill:
    """Fill in the middle: [extra] PRE prefix SUF suffix MID [middle], cut as llama-server cuts it."""

    prefix: str | list[int]
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()  # (filename, text): context before the prefix
    middle: str = ""  # text after the middle token (llama-server's /infill `prompt`)
    param: str = "suffix"  # the field a model without FIM tokens refuses


Source = Messages | Raw | Infill


@dataclass(frozen=True, slots=True)
class Ask:
    """What a front-end parsed: the prompt's source and the fields that need the model."""

    source: Source
    params: SamplingParams
    bias: Biases = ()  # logit_bias as the client gave it: token ids or texts
    ignore_eos: bool = False  # llama-server's: ban the end-of-generation tokens
    grammar_param: str | None = None  # the client's own raw GBNF field, named in a refusal
    context: list[int] | None = None  # Ollama's memory: tokens put first; the prompt is then plain tokens
    length_param: str = "max_tokens"  # the answer-length field a too-long prompt's refusal names
    cite: Cite | None = None  # a chat's `"library": true`: the scopes its sources may come from (retrieval.py)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A job's prompt as the engine takes it, and the sampling it runs with."""

    prompt: list[int] | Prompt
    params: SamplingParams
    truncated: bool = False  # a fill-in-the-middle prompt was cut to fit
    check: Check | None = None  # a library chat's: its sources, the answer checked against them (grounded.py)

    @property
    def sources(self) -> list[dict[str, Any]] | None:
        """The library's passages in the prompt (None: not asked for)."""
        return self.check.sources if self.check is not None else None

    @property
    def tokens(self) -> list[int]:
        return self.prompt.tokens if isinstance(self.prompt, Prompt) else self.prompt

    @property
    def dropped(self) -> int:
        """Old turns the chat template left out so the conversation fits."""
        return self.prompt.dropped_messages if isinstance(self.prompt, Prompt) else 0


async def prepare(engine: Engine, ask: Ask) -> Prepared:
    """The job's prompt and sampling, every check made, in one order: logit_bias resolved, the
    grammar llama.cpp must accept, the prompt built, then its room (Ollama's context first)."""
    params = await biased(engine, ask.params, ask.bias, ask.ignore_eos)
    await check_grammar(engine, params.grammar, ask.grammar_param)
    context = ask.context or []
    check_tokens(context, engine.n_vocab, "context")
    limit = engine.prompt_limit(params.max_tokens)
    src = ask.source
    found: Check | None = None
    if isinstance(src, Messages):
        chat = await engine.prepare(src.messages, params.max_tokens, src.tools)
        if ask.cite is not None:
            chat, found = await cited(engine, ask.cite, src.messages, src.tools, params.max_tokens, chat)
        prompt: list[int] | Prompt = chat
        truncated = False
        if src.tools and params.grammar is None and (calls := answered(src.messages)):
            params = await guarded(engine, src, params, calls, engine.prompt_limit(params.max_tokens))
    elif isinstance(src, Raw):
        prompt, truncated = nonempty(await tokens_of(engine, src.prompt, special=True)), False
    else:
        prompt, truncated = await infill(engine, src, limit - len(context))
    fitted = fit(prompt, limit, context, ask.length_param)
    if ask.context is None:
        return Prepared(fitted, params, truncated, found)
    return Prepared(context + (fitted.tokens if isinstance(fitted, Prompt) else fitted), params, truncated, found)


# After a tool's result, the request the 0.5B model answers from: with it, 4 of 4 round
# trips that had repeated their call answered in words, without it 0 (issue 37).
ANSWER_FROM_RESULT = "Answer my question {q} from the tool's result, in one or two sentences."
QUESTION_CHARS = 300  # a longer question is not quoted again


async def guarded(engine: Engine, src: Messages, params: SamplingParams, calls: tuple[tuple[str, str], ...],
                  limit: int) -> SamplingParams:
    """Sampling that does not repeat a call just answered (engine/repeat.py): the calls, and
    the prompt to answer from instead, the user's last question put again after the result
    (when that prompt fits; else the same prompt)."""
    asked = next((m["content"] for m in reversed(src.messages) if m["role"] == "user"), "")
    q = f'"{asked.strip()}"' if 0 < len(asked.strip()) <= QUESTION_CHARS else "above"
    try:
        retry = await engine.prepare([*src.messages, {"role": "user", "content": ANSWER_FROM_RESULT.format(q=q)}],
                                     params.max_tokens, src.tools)
    except ContextLengthExceeded:
        return dataclasses.replace(params, answered=calls)
    tokens, room = (retry.tokens, limit + retry.allowance) if isinstance(retry, Prompt) else (retry, limit)
    return dataclasses.replace(params, answered=calls, retry_prompt=tuple(tokens) if len(tokens) <= room else ())


def fit(prompt: list[int] | Prompt, limit: int, context: list[int], length_param: str) -> list[int] | Prompt:
    """The prompt, if it and the context fit in `limit` tokens (a chat prompt fits: the
    template dropped old turns); plain tokens when there is a context to put first."""
    tokens = prompt.tokens if isinstance(prompt, Prompt) else prompt
    if isinstance(prompt, Prompt):
        limit += prompt.allowance  # its tool definitions' room beyond the limit (build_prompt)
    if len(context) + len(tokens) > limit:
        raise ContextLengthExceeded(f"the prompt is {len(context) + len(tokens)} tokens, and this server allows "
                                    f"{limit} prompt tokens with this {length_param}", param="prompt")
    return tokens if context or isinstance(prompt, list) else prompt


def nonempty(tokens: list[int], param: str = "prompt") -> list[int]:
    if not tokens:
        raise BadRequest(f"'{param}' must not be empty", param=param)
    return tokens


# -- the pieces --------------------------------------------------------------------------------
async def check_grammar(engine: Engine, grammar: str | None, param: str | None = None) -> None:
    """A grammar llama.cpp refuses is a 400; `param` names the client's own raw GBNF field."""
    try:
        await engine.check_grammar(grammar)
    except BadRequest as e:
        if param is None:
            raise
        raise BadRequest(f"'{param}' is not a GBNF grammar llama.cpp accepts (a syntax error, an undefined rule, "
                         "left recursion or a repetition above about 1,000)", param=param, code=e.code) from None


async def biased(engine: Engine, params: SamplingParams, raw: Biases, ignore_eos: bool = False) -> SamplingParams:
    """logit_bias resolved: a text's every token gets its bias (llama-server's), every id is
    checked against the vocabulary (llama.cpp would read past its logits). At most
    MAX_LOGIT_BIAS texts of MAX_BIAS_TEXT characters each are tokenized. ignore_eos (llama-server's)
    bans the end-of-generation tokens: the answer runs to max_tokens or a stop string."""
    if not raw and not ignore_eos:
        return params
    pairs: list[tuple[int, float]] = []
    for key, bias in raw:
        ids = [key] if isinstance(key, int) else await engine.tokenize(key, False)
        check_tokens(ids, engine.n_vocab, "logit_bias")
        pairs += [(t, bias) for t in ids]
    if ignore_eos:
        pairs += [(t, -math.inf) for t in await engine.eog_tokens()]
    return dataclasses.replace(params, logit_bias=tuple(pairs))


async def tokens_of(engine: Engine, prompt: str | list[int], special: bool) -> list[int]:
    """A prompt given as text or as token ids, as checked token ids."""
    if isinstance(prompt, str):
        return await engine.tokenize(prompt, special) if prompt else []
    check_tokens(prompt, engine.n_vocab)
    return prompt


async def infill(engine: Engine, src: Infill, limit: int) -> tuple[list[int], bool]:
    """A fill-in-the-middle prompt in `limit` tokens and whether it was cut. Its text is never
    parsed for control tokens: the FIM tokens come from us only."""
    fim = engine.fim_tokens
    if fim is None:
        raise BadRequest(f"this model has no fill-in-the-middle tokens, so '{src.param}' is not supported",
                         param=src.param)
    extra: list[int] = []
    for filename, chunk in src.extra:
        # No file-separator token is known here: llama-server's plain-text separator.
        extra += await engine.tokenize(f"{CHUNK_SEPARATOR}{filename}\n{chunk}", False)
    prefix = await tokens_of(engine, src.prefix, special=False)
    suffix = await tokens_of(engine, src.suffix, special=False)
    middle = await tokens_of(engine, src.middle, special=False)
    return fim_prompt(fim, prefix, suffix, limit, extra, middle)


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
