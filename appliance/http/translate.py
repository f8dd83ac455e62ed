"""A chat's question put into the library's other language by the chat model, so that it can
be searched there too (library/language.py says when): a short greedy job on the engine's
normal path, in the caller's name and lane, so the fair share and the background lane hold
for it as for the chat itself, and in a session of its own that nobody continues. Bounded
before it starts (the question's characters, the answer's tokens, a deadline); whatever goes
wrong (the engine stopping or refusing, no answer by the deadline), the chat is searched in
its own language alone."""

from __future__ import annotations

import asyncio
import logging

from appliance.engine.engine import Engine
from appliance.engine.events import Delta, Failed
from appliance.engine.names import session_name
from appliance.engine.turn import Lane
from appliance.errors import ApplianceError
from appliance.http.guard import Caller
from appliance.http.validate import new_session_id
from appliance.library.language import Lang
from appliance.library.library import Library
from appliance.sampling import SamplingParams

log = logging.getLogger(__name__)
# A question is a line or two: 48 tokens hold a 30-word English question or ~60 characters
# of Chinese; a longer one is cut, which still searches by its first words.
MAX_TOKENS = 48
MOST_CHARS = 400  # of the question translated, so its prompt is bounded too
DEADLINE_S = 15.0  # behind a full queue, the chat is searched in its own language rather than wait
# One example before the question: asked plainly ("Translate ... into English"), the 0.5B
# coder model answered 4 of 10 questions instead (inventing the figure); shown one
# translation first, none (bench/library/crossing.py's questions). The example names a place
# and asks of an office, as questions of a library do: with a name-less one ("How many days of
# annual leave..."), the model dropped the places the evaluation set's cross-language questions
# name (a city; two regions) in 2 of 10, with it in none (it dropped a company's name once,
# which the question itself still holds); names are what find their documents
# (library/language.py's `leads`). No figure in it: one there was copied into the translations.
EXAMPLE = {Lang.EN: ("柏林办公室的新供应商由谁审批？", "Who approves a new supplier for the Berlin office?"),
           Lang.ZH: ("Who approves a new supplier for the Berlin office?", "柏林办公室的新供应商由谁审批？")}
NAME = {Lang.EN: "English", Lang.ZH: "Chinese"}
SAMPLING = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, stop=("\n",))


async def crossed(engine: Engine, library: Library, scopes: list[str], caller: Caller, lane: Lane,
                  question: str) -> str:
    """The question in the library's other language, when the scopes hold documents in it
    and translating is on ("" otherwise: the question's own language is searched alone)."""
    into = await library.crossing(scopes, question)
    return await translate(engine, caller, lane, question, into) if into is not None else ""


async def translate(engine: Engine, caller: Caller, lane: Lane, question: str, into: Lang,
                    deadline_s: float = DEADLINE_S) -> str:
    """The question in `into` ("" when the engine could not say it in time: one log line)."""
    try:
        return (await asyncio.wait_for(_run(engine, caller, lane, question[:MOST_CHARS], into), deadline_s)).strip()
    except (ApplianceError, TimeoutError) as e:
        log.warning("library: the question was not translated (%s); searched in its own language only",
                    e.message if isinstance(e, ApplianceError) else f"no answer in {deadline_s:g} s")
        return ""


def messages(question: str, into: Lang) -> list[dict[str, str]]:
    """The chat the model translates in: what it is for, one example, the question."""
    asked, answered = EXAMPLE[into]
    ask = f"Translate this question into {NAME[into]}: "
    return [{"role": "system", "content": "You translate questions between Chinese and English. You never answer them."},
            {"role": "user", "content": ask + asked}, {"role": "assistant", "content": answered},
            {"role": "user", "content": ask + question}]


async def _run(engine: Engine, caller: Caller, lane: Lane, question: str, into: Lang) -> str:
    prompt = await engine.prepare(messages(question, into), MAX_TOKENS)
    # A session of its own, in the caller's namespace: nothing cached is shared with anyone.
    handle = engine.submit(prompt, SAMPLING, caller.client, session_name(caller.namespace, new_session_id()),
                           named=False, lane=lane, front_end=caller.front_end)
    parts: list[str] = []
    try:
        async for ev in handle.events():
            if isinstance(ev, Delta):
                parts.append(ev.text)
            elif isinstance(ev, Failed):
                raise ev.error
    finally:
        handle.cancel()  # a no-op once it ended; on the deadline, its slot is free at the next step
    return "".join(parts)
