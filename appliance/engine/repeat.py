"""An answer after a tool's result that only calls the same tool again is not let out.

The bundled 0.5B model, given a tool's result, wrote the identical call once more instead of
answering in 6 of 6 office round trips (issue 37, bench/structured/tool-round-trips.py). A
call the conversation has just had answered can only bring the same result back, so it is
never a useful answer, whatever the model. The turn's opening is held while it could be
such a call (Qwen's `<tool_call>` block, or the bare or fenced JSON the small model often
writes); when it is one, the turn is rewound to its retry prompt (the chat with the user's
question put again after the result, http/prompting.guarded) and answers, its first token a
letter or digit: 10 of 10 round trips then ended in an answer in words. Any other opening is
let out at once, a turn is rewound at most once, and a different call (another tool, other
arguments) goes through as before.
"""

from __future__ import annotations

import dataclasses
import json
import math
from functools import lru_cache
from typing import Any

from appliance.engine.turn import State, Turn
from appliance.model.prompt import common_prefix
from appliance.structured.tools import CLOSE, OPEN, after_fence, call_key, may_be_bare

MAX_HELD_CHARS = 4096  # an opening longer than this is let out as it is (bounds what is held)


class CallGuard:
    """Holds the start of one turn's answer while it may repeat a call in `answered`."""

    __slots__ = ("answered", "held", "text")

    def __init__(self, answered: frozenset[tuple[str, str]]) -> None:
        self.answered = answered
        self.held: list[bytes] = []
        self.text = ""

    def feed(self, piece: bytes) -> list[bytes] | None:
        """Take a token's bytes. None: the answer so far repeats an answered call. Else the
        pieces that may go out now: [] while the opening is still undecided."""
        self.held.append(piece)
        self.text += piece.decode("utf-8", "replace")
        s = self.text.lstrip()
        if len(self.text) > MAX_HELD_CHARS:
            return self.release()
        if s.startswith(OPEN):
            end = s.find(CLOSE)
            if end < 0:
                return []
            return None if _key(s[len(OPEN):end]) in self.answered else self.release()
        if not s or OPEN.startswith(s):
            return []  # blank so far, or the start of the tag
        if may_be_bare(s):
            body = after_fence(s)
            if not body.startswith("{"):
                return []  # the fence is still being written
            try:
                obj, _ = json.JSONDecoder().raw_decode(body)
            except ValueError:
                return []  # a bare call still being written (or text: let out at the end)
            return None if _key_of(obj) in self.answered else self.release()
        return self.release()

    def release(self) -> list[bytes]:
        out, self.held = self.held, []
        return out


def _key(block: str) -> tuple[str, str] | None:
    try:
        return _key_of(json.loads(block))
    except (ValueError, RecursionError):
        return None


def _key_of(obj: Any) -> tuple[str, str] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    return call_key(obj["name"], args) if isinstance(args, dict) else None


# A rewound answer's first token: a letter or digit (any script), so not the start of a call
# in any form (tag, "{", a fence) nor the "(" or ">" the 0.5B model then puts before the same
# call. llama.cpp checks the chain's own pick against it first, so it costs one check unless
# the pick is such a token; it is dropped after that first token.
ANSWER_START = "root ::= [A-Za-z0-9\\u0080-\\uFFFF] [^\\x00]*"


@lru_cache(maxsize=4)
def call_tag(tokenizer: Any) -> tuple[int, ...]:
    """The tag's own token, when it is one (Qwen's `<tool_call>` is a special token)."""
    ids = tokenizer.tokenize(OPEN, False, True)
    return tuple(ids) if len(ids) == 1 else ()


def rewind(t: Turn, model: Any) -> None:
    """Back to the prompt, to sample an answer: from its retry prompt when it has one (read
    from where the two part), else from the end of the prompt (its last token computed again:
    its logits are gone); the first token by ANSWER_START, the tag's token banned for the
    whole answer. What was generated was held, so nothing of it went out; a turn is rewound
    once (its guard goes)."""
    retry = list(t.params.retry_prompt)
    cut = min(common_prefix(t.prompt, retry), len(retry) - 1) if retry else t.n_prompt - 1
    model.seq_rm(t.seq_id, cut, -1)
    t.prompt = retry or t.prompt
    t.n_cached = cut
    t.output.clear()
    t.logprobs = []
    t.n_sent = 0
    t.guard = t.drafts = None
    ban = tuple((x, -math.inf) for x in call_tag(model.tokenizer))
    t.unban = dataclasses.replace(t.params, answered=(), logit_bias=t.params.logit_bias + ban)
    _resample(t, model, dataclasses.replace(t.unban, grammar=ANSWER_START))
    t.state = State.PREFILL


def first_token_taken(t: Turn, model: Any) -> None:
    """A rewound answer has its first token: the grammar goes."""
    _resample(t, model, t.unban)
    t.unban = None


def _resample(t: Turn, model: Any, params: Any) -> None:
    t.params = params
    if t.sampler is not None:
        t.sampler.free()
    t.sampler = model.new_sampler(params)
