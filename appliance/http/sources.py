"""A chat's `"library": true` (OpenAI's and Ollama's chat routes): the passages that answer
its last message among the documents the caller may read, put before the question in that
message, and the sources the client is sent to show beside the answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from appliance.errors import ContextLengthExceeded, NotFound
from appliance.http.guard import Caller
from appliance.http.prompting import Ask, Prepared, prepare
from appliance.http.state import App
from appliance.library.cite import question_of, sources, with_sources
from appliance.library.library import Library
from appliance.library.store import OFFICE, person_scope


def library_of(app: App) -> Library:
    if app.library is None:
        raise NotFound("the library is off on this box (library = false, or no embedding model)", code="library_off")
    return app.library


def scopes_of(caller: Caller) -> list[str]:
    """The scopes a caller reads: the office's, and a signed-in person's own."""
    return [OFFICE, person_scope(caller.account.id)] if caller.account is not None else [OFFICE]


Msgs = list[dict[str, Any]]


async def prepare_cited(app: App, caller: Caller, messages: Msgs, library: bool,
                        ask: Callable[[Msgs], Ask]) -> tuple[Prepared, list[dict[str, Any]] | None]:
    """The chat's prompt, with the library's sources when asked for (None: not asked). Sources
    that would not fit the context, or would push earlier turns out of it, are left out whole,
    rather than the request refused or the conversation cut for what the server added."""
    if not library:
        return await prepare(app.engine, ask(messages)), None
    cited_messages, cited = await consult(app, caller, messages)
    if not cited:
        return await prepare(app.engine, ask(messages)), cited
    try:
        ready = await prepare(app.engine, ask(cited_messages))
    except ContextLengthExceeded:
        return await prepare(app.engine, ask(messages)), []
    if ready.dropped:
        plain = await prepare(app.engine, ask(messages))
        if plain.dropped < ready.dropped:
            return plain, []
    return ready, cited


async def consult(app: App, caller: Caller, messages: Msgs) -> tuple[Msgs, list[dict[str, Any]]]:
    """A chat's `"library": true`: the passages that answer its last message among what the
    caller may read, put before the question in that message, and the sources to show."""
    library = library_of(app)
    question = question_of(messages)
    if question is None:
        return messages, []
    found = await library.search(scopes_of(caller), question)
    return with_sources(messages, found), sources(found)
