"""Retrieval, the prompt builder's step for a chat that asks for the library (`"library":
true`, on every chat API): the passages that answer its last message, searched once among
the scopes the request may cite, as many as fit the room the conversation leaves (counted
with the model's own tokenizer), put before the question in that message; and the sources
the client is sent to show beside the answer. Sources that would not fit, or would push
earlier turns out of the context, are left out whole, rather than the request refused or
the conversation cut for what the server added."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from appliance.engine.engine import Engine
from appliance.engine.turn import Lane
from appliance.errors import ContextLengthExceeded
from appliance.http.grounded import Check
from appliance.http.guard import Caller
from appliance.http.state import App
from appliance.http.translate import crossed
from appliance.library.cite import FRAME, block, keep, question_of, sources, with_sources
from appliance.library.grounding import closeness
from appliance.library.library import Library
from appliance.library.scopes import readable, required
from appliance.model.prompt import Prompt

CANDIDATES = 3  # passages searched per one a chat is given: room for a shorter one when a long one does not fit
# Tokens kept free beyond the counted ones: the pieces are counted apart, and a tokenizer may
# join a piece's first or last characters with its neighbour's differently in the whole.
SLACK = 4


@dataclass(frozen=True, slots=True)
class Cite:
    """The library a request may cite and its scopes there."""

    library: Library
    scopes: list[str]
    caller: Caller | None = None  # whose question: its translation runs in their name and lane (translate.py)
    lane: Lane = Lane.PEOPLE


def citing(app: App, caller: Caller, asked: bool, request: Request | None = None) -> Cite | None:
    """What a chat may cite when it asks for the library (None: it did not ask): the
    scopes the caller reads (library/scopes.py), and who asks in which lane (intake.py
    decided it). A 404 when the library is off."""
    if not asked:
        return None
    lane = request.scope.get("state", {}).get("lane", Lane.PEOPLE) if request is not None else Lane.PEOPLE
    return Cite(required(app.library), readable(caller.account.id if caller.account is not None else None),
                caller, lane)


Cited = tuple[Prompt, Check]


async def cited(engine: Engine, cite: Cite, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                max_tokens: int, plain: Prompt) -> Cited:
    """The prompt with the sources that fit the room `plain` (the chat's prompt without
    them) leaves, and the answer's check with those sources; `plain` and none when no source
    fits. One search, one count, at most one more prompt built. Nothing found close enough
    to the question (library/grounding.py): the server answers itself (Check.answer)."""
    question = question_of(messages)
    if question is None:
        return plain, Check("", [])
    limits = cite.library.limits
    also = await crossed(engine, cite.library, cite.scopes, cite.caller, cite.lane, question) if cite.caller else ""
    found = await cite.library.search(cite.scopes, question, limits.top_k * CANDIDATES, sys.maxsize, also=also)
    if not found or not closeness([question, *([also] if also else [])], found).close():
        return plain, Check(question, [], close=False)
    counts = await asyncio.gather(*(engine.tokenize(text) for text in
                                    [FRAME, *(block(n, f, question) + "\n\n" for n, f in enumerate(found, 1))]))
    frame, costs = len(counts[0]) + SLACK, [len(c) for c in counts[1:]]
    room = engine.prompt_limit(max_tokens) + plain.allowance - len(plain.tokens) - frame
    kept = keep(found, costs, limits.top_k, limits.budget_tokens, room)
    if not kept:
        return plain, Check(question, [])
    try:
        prompt = await engine.prepare(with_sources(messages, kept), max_tokens, tools)
    except ContextLengthExceeded:  # counted apart, the pieces came out short: the chat as asked
        return plain, Check(question, [])
    if prompt.dropped_messages > plain.dropped_messages:
        return plain, Check(question, [])
    unknown = await cite.library.unmentioned(cite.scopes, question)
    return prompt, Check(question, sources(kept), also=also, unknown=unknown)
