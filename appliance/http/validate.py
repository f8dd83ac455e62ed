"""The request fields every front-end shares, validated: JSON bodies and their bounds, text,
integers, booleans, sampling, stream, model, session ids, and the request bounds the server
was configured with. Pure functions, no I/O; a wrong field is a BadRequest naming it.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from appliance.errors import BadRequest, PayloadTooLarge
from appliance.sampling import SamplingParams
from appliance.structured.grammar import schema_grammar

MAX_N = 8  # choices per request: each is a sequence in the batch
MAX_TOP_LOGPROBS = 20
MAX_STOP = 4
MAX_STOP_CHARS = 256  # a stop string is a marker, not a document; keeps the holdback scan cheap
MAX_BODY_BYTES = 4 * 2**20  # far beyond any context this model holds (~16 KiB of text per 4k tokens)
# llama.cpp takes top_k as a C int (ctypes would wrap a larger one, 2**32 + 1 becoming 1),
# while the speculative path reads it whole: the C int range keeps the two the same. Any
# value past the vocabulary (~152k) already means every token, so nothing is lost.
MAX_TOP_K = 2**31 - 1
MAX_LOGIT_BIAS = 1024  # entries in one logit_bias; each is a row of the sampler's bias table
MAX_BIAS_TEXT = 256  # characters of a text key (llama-server's: every token of the text is biased)
# A raw GBNF grammar (llama-server's `grammar`): json.gbnf is ~1 KiB, a grammar of 32 KiB is
# already a generated one. llama.cpp's parser recurses once per nested group, so the nesting
# is bounded too, before the parser ever sees it.
MAX_GBNF_CHARS = 32 * 1024
MAX_GBNF_DEPTH = 64
# Long enough that ids cannot be guessed, and only characters safe in a header and a log.
_SESSION_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
SESSION_RULE = "the session id must be 16-128 characters of A-Z, a-z, 0-9, '_' and '-'"


@dataclass(frozen=True, slots=True)
class RequestBounds:
    """What one request may ask for and carry, from the server's configuration."""

    default_max_tokens: int
    max_tokens_limit: int  # larger requests are capped to this
    ctx_limit: int  # a max_tokens beyond the context itself is an error, not a cap
    max_messages: int = 2048  # messages in one request
    max_chars: int = 1_000_000  # characters of message text in one request
    default_temperature: float = SamplingParams().temperature  # a request's when it gives none
    default_seed: int | None = None  # a request's when it gives none (None: a fresh one each request)


def precheck(raw: bytes, max_messages: int) -> None:
    """Refuse a body with far too many messages before parsing it. Parsing holds the GIL (a
    4 MiB body of empty messages takes ~70 ms), which would stall the engine thread's steps.
    Every message has a "role" key, and that exact byte string can only be a JSON string
    equal to "role" (a quote inside a string is escaped), so its count is at least the number
    of messages; twice the cap leaves room for "role" elsewhere in a body. A body that spells
    the key with escapes is still refused, after one parse."""
    if raw.count(b'"role"') > 2 * max_messages:
        raise BadRequest(f"a request may carry at most {max_messages} messages", param="messages",
                         code="too_many_messages")


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def number(data: dict[str, Any], key: str, lo: float, hi: float, default: float,
            lo_open: bool = False) -> float:
    v = data.get(key)
    if v is None:
        return default
    # An int is compared as it is: JSON integers are unbounded, and a float of 1e400 overflows.
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise BadRequest(f"'{key}' must be a number", param=key)
    if v < lo or v > hi or (lo_open and v == lo):
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        shown = str(v) if isinstance(v, float) or abs(v) < 10**32 else "an integer of more than 32 digits"
        raise BadRequest(f"'{key}' must be {bound} and <= {hi:g}, got {shown}", param=key)
    return float(v)


def integer(data: dict[str, Any], key: str) -> int | None:
    v = data.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"'{key}' must be an integer", param=key)
    return v


def boolean(data: dict[str, Any], key: str, default: bool = False) -> bool:
    v = data.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"'{key}' must be true or false", param=key)
    return v


def text(value: str, param: str) -> str:
    """JSON may carry lone surrogates ("\\ud800") that no tokenizer can encode: a 400 here."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"'{param}' is not valid Unicode text (it holds a lone surrogate)", param=param) from None
    return value


def json_text(value: Any, param: str) -> Any:
    """A schema, tool definition or call's arguments reach a grammar or the prompt as JSON
    text: a lone surrogate anywhere in it is a 400, as in message text (found by hypothesis)."""
    json_chars(value, param)
    return value


def json_chars(value: Any, param: str) -> int:
    """json_text's check, and how many characters of prompt the value becomes."""
    return len(text(json.dumps(value, ensure_ascii=False), param))


def logprob_count(data: dict[str, Any], key: str) -> int | None:
    """How many alternatives per token a field asks for (OpenAI's top_logprobs and completions'
    logprobs, llama-server's n_probs): an integer from 0 to MAX_TOP_LOGPROBS, or None."""
    count = integer(data, key)
    if count is not None and not 0 <= count <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"'{key}' must be between 0 and {MAX_TOP_LOGPROBS}", param=key)
    return count


def parse_choices(data: dict[str, Any]) -> tuple[int, int | None]:
    """n, and logprobs -> how many alternatives to report per token (None: no logprobs)."""
    n = integer(data, "n")
    if n is not None and not 1 <= n <= MAX_N:
        raise BadRequest(f"'n' must be between 1 and {MAX_N}", param="n")
    top = logprob_count(data, "top_logprobs")
    if boolean(data, "logprobs"):
        return n or 1, top or 0
    if top is not None:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return n or 1, None


def parse_model(data: dict[str, Any]) -> str | None:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    return model


def parse_max_tokens(data: dict[str, Any], bounds: RequestBounds) -> int:
    max_tokens = integer(data, "max_completion_tokens")
    key = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, key = integer(data, "max_tokens"), "max_tokens"
    if max_tokens is None:
        max_tokens = bounds.default_max_tokens
    elif max_tokens <= 0:
        raise BadRequest(f"'{key}' must be >= 1, got {max_tokens}", param=key)
    elif max_tokens > bounds.ctx_limit:
        raise BadRequest(f"'{key}' is {max_tokens}, but a conversation here holds at most "
                         f"{bounds.ctx_limit} tokens", param=key)
    return min(max_tokens, bounds.max_tokens_limit)


def parse_stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP:
        stops = tuple(stop)
    else:
        raise BadRequest(f"'stop' must be a string or a list of at most {MAX_STOP} strings", param="stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"each stop string may have at most {MAX_STOP_CHARS} characters", param="stop")
    for s in stops:
        text(s, "stop")
    return stops


def parse_sampling(data: dict[str, Any], bounds: RequestBounds) -> SamplingParams:
    """The sampling fields chat and text completions share, by their OpenAI names (plus
    llama.cpp's top_k, min_p, repeat_penalty and repeat_last_n, -1 = the whole context)."""
    seed = integer(data, "seed")
    top_k = integer(data, "top_k")
    if top_k is not None and not 0 <= top_k <= MAX_TOP_K:
        raise BadRequest(f"'top_k' must be between 0 and {MAX_TOP_K}", param="top_k")
    last_n = integer(data, "repeat_last_n")
    if last_n == -1:
        last_n = bounds.ctx_limit
    elif last_n is not None and not 0 <= last_n <= bounds.ctx_limit:
        raise BadRequest(f"'repeat_last_n' must be -1 or between 0 and {bounds.ctx_limit}", param="repeat_last_n")
    defaults = SamplingParams()
    return SamplingParams(
        max_tokens=parse_max_tokens(data, bounds),
        temperature=number(data, "temperature", 0.0, 2.0, bounds.default_temperature),
        top_p=number(data, "top_p", 0.0, 1.0, defaults.top_p, lo_open=True),
        top_k=defaults.top_k if top_k is None else top_k,
        min_p=number(data, "min_p", 0.0, 1.0, defaults.min_p),
        repeat_penalty=number(data, "repeat_penalty", 0.0, 10.0, defaults.repeat_penalty, lo_open=True),
        presence_penalty=number(data, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=number(data, "frequency_penalty", -2.0, 2.0, 0.0),
        penalty_last_n=defaults.penalty_last_n if last_n is None else last_n,
        seed=bounds.default_seed if seed is None else seed,
        stop=parse_stop(data.get("stop")),
    )


Biases = tuple[tuple[int | str, float], ...]  # (token id or a text to tokenize, bias); -inf bans


def _bias_value(v: Any, param: str) -> float:
    if v is False:  # llama-server's way to ban a token
        return -math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
        raise BadRequest(f"'{param}' values must be numbers between -100 and 100 (or false, which bans the token)",
                         param=param)
    return float(v)


def _bias_key(k: Any, param: str) -> int | str:
    """A token id, or (llama-server's) a text whose every token gets the bias."""
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    if not isinstance(k, str) or not k or len(k) > MAX_BIAS_TEXT:
        raise BadRequest(f"'{param}' keys must be token ids or texts of 1-{MAX_BIAS_TEXT} characters", param=param)
    return int(k) if re.fullmatch(r"-?[0-9]{1,10}", k) else text(k, param)


def parse_logit_bias(raw: Any, param: str = "logit_bias") -> Biases:
    """OpenAI's {"token id": bias} or llama-server's [[id or text, bias], ...] (or a text key),
    bias in [-100, 100] or false; the ids are checked against the vocabulary once known."""
    if raw is None:
        return ()
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 for p in raw):
        pairs = [(p[0], p[1]) for p in raw]
    else:
        raise BadRequest(f"'{param}' must be an object of token id -> bias, or an array of [token, bias] pairs",
                         param=param)
    if len(pairs) > MAX_LOGIT_BIAS:
        raise BadRequest(f"'{param}' may hold at most {MAX_LOGIT_BIAS} entries", param=param)
    return tuple((_bias_key(k, param), _bias_value(v, param)) for k, v in pairs)


def gbnf_depth(gbnf: str) -> int:
    """How deeply a GBNF grammar nests its groups, outside string literals, character classes
    and comments (a bracket there is text)."""
    depth = deepest = 0
    for m in re.finditer(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[()]', gbnf):
        tok = m.group()
        if tok == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif tok == ")":
            depth -= 1
    return deepest


def parse_gbnf(raw: Any, param: str = "grammar") -> str | None:
    """A raw GBNF grammar, bounded before llama.cpp parses it (that parse is checked later)."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise BadRequest(f"'{param}' must be a string of GBNF", param=param)
    if len(raw) > MAX_GBNF_CHARS:
        raise BadRequest(f"'{param}' may have at most {MAX_GBNF_CHARS} characters", param=param,
                         code="grammar_too_large")
    if gbnf_depth(raw) > MAX_GBNF_DEPTH:
        raise BadRequest(f"'{param}' nests its groups more than {MAX_GBNF_DEPTH} deep", param=param,
                         code="grammar_too_large")
    return text(raw, param)


def parse_stream(data: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = boolean(data, "stream")
    opts = data.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        include_usage = boolean(opts, "include_usage")
    return stream, include_usage


def valid_session_id(session: Any) -> bool:
    return isinstance(session, str) and _SESSION_RE.fullmatch(session) is not None


def new_session_id() -> str:
    return secrets.token_hex(16)  # 128 random bits




def is_tokens(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def check_chars(bounds: RequestBounds, *texts: str | list[int]) -> None:
    if sum(len(t) for t in texts if isinstance(t, str)) > bounds.max_chars:
        raise PayloadTooLarge(f"the prompt holds more than {bounds.max_chars} characters of text",
                              param="prompt", code="too_many_characters")


def check_tokens(tokens: Sequence[int], n_vocab: int, param: str = "prompt") -> None:
    """Ids the model has: llama.cpp would fail the whole decode step on one it has not."""
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise BadRequest(f"'{param}' holds token id {bad}, but this model's ids are 0-{n_vocab - 1}", param=param)


def sampling_as(data: dict[str, Any], bounds: RequestBounds, names: dict[str, str], where: str = "") -> SamplingParams:
    """parse_sampling over fields another API spells its own way (`names`: theirs -> ours);
    a refusal names the field as the client spelled it (`where` + theirs)."""
    ours = {names.get(k, k): v for k, v in data.items()}
    try:
        return parse_sampling(ours, bounds)
    except BadRequest as e:
        theirs = next((t for t, o in names.items() if o == e.param and t in data), e.param)
        if e.param is None or theirs is None:
            raise
        name = f"'{where}{theirs}'"
        said = f"'{e.param}'"
        message = e.message.replace(said, name) if said in e.message else f"{name}: {e.message}"
        raise BadRequest(message, param=f"{where}{theirs}") from None


def refuse_changed(data: dict[str, Any], defaults: dict[str, Any], where: str = "") -> None:
    """Sampling fields we do not implement are fine at their neutral value, else a 400."""
    for key, neutral in defaults.items():
        v = data.get(key)
        if v is None or v == neutral or (neutral in ("", []) and not v):  # [] and {}: no biases, no adapters
            continue
        raise BadRequest(f"'{where}{key}' is not supported here (leave it out or at {neutral!r})", param=f"{where}{key}")


# -- fields more than one API reads ------------------------------------------------------
def parse_prompt(raw: Any, param: str = "prompt") -> str | list[int]:
    """A string or a list of token ids; a list holding one of them is that one. Several
    prompts in one request are refused: send them as separate requests, which are batched
    together anyway."""
    if isinstance(raw, list) and len(raw) == 1 and (isinstance(raw[0], str) or is_tokens(raw[0])):
        raw = raw[0]
    if isinstance(raw, str):
        return text(raw, param)
    if is_tokens(raw):
        if not raw:
            raise BadRequest(f"'{param}' must not be empty", param=param)
        return list(raw)
    if isinstance(raw, list) and all(isinstance(p, str) or is_tokens(p) for p in raw):
        raise BadRequest(f"'{param}' holds {len(raw)} prompts; this server takes one per request "
                         "(send them as separate requests: they are decoded together)", param=param)
    if raw is None:
        raise BadRequest(f"'{param}' is required", param=param)
    raise BadRequest(f"'{param}' must be a string or an array of token ids", param=param)


def parse_constraint(data: dict[str, Any]) -> tuple[str | None, str | None]:
    """llama-server's own ways to constrain an answer, also on /completion: a raw GBNF
    `grammar` or a top-level `json_schema` -> (grammar, "grammar" when it is the client's GBNF)."""
    raw, schema = parse_gbnf(data.get("grammar")), data.get("json_schema")
    if raw is not None and schema is not None:
        raise BadRequest("give 'grammar' or 'json_schema', not both", param="grammar")
    if schema is not None:
        if not isinstance(schema, (dict, bool)):
            raise BadRequest("'json_schema' must be a JSON schema object", param="json_schema")
        return schema_grammar(json_text(schema, "json_schema"), "json_schema"), None
    return raw, None if raw is None else "grammar"
