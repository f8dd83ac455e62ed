"""Which documents a caller may reach: the office's, which everyone reads (the operator adds
them), and a signed-in person's own, which only that person reads and changes. Open mode has
no person, so the office's only. The library's routes and the chat's sources both ask here,
so one rule decides what anybody may list, open or cite."""

from __future__ import annotations

from appliance.errors import Forbidden, NotFound
from appliance.library.library import Library
from appliance.library.store import OFFICE, person_scope


def readable(person: str | None) -> list[str]:
    """The scopes a caller reads and a chat of theirs may cite (person: the signed-in
    person's id, None when nobody is signed in)."""
    return [OFFICE, person_scope(person)] if person is not None else [OFFICE]


def own(person: str | None) -> str:
    """The scope of a person's own documents: only a signed-in person has one."""
    if person is None:
        raise Forbidden("a document of one's own needs people mode and a signed-in person; the office's "
                        "documents are added in /admin", code="library_own_needs_people")
    return person_scope(person)


def required(library: Library | None) -> Library:
    """The box's library, or a 404 that says it is off (no scope of it can be reached)."""
    if library is None:
        raise NotFound("the library is off on this box (library = false, or no embedding model)", code="library_off")
    return library
