"""Reading a server's SSE answer in the tests: the bench's client-side reader
(appliance.bench.sse) over an httpx response or a whole body, and the text the chunks carry."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import httpx

from appliance.bench.sse import Event, content, iter_events, lines


def events_of(r: httpx.Response, *, comments: bool = False) -> Iterator[Event]:
    """The payloads of a streamed response as they arrive: JSON objects and DONE, and the
    `: queued N` comments if asked."""
    return iter_events(lines(r.iter_text()), comments=comments)


def events_in(body: str, *, comments: bool = False) -> list[Event]:
    """The payloads of a whole SSE body (already read)."""
    return list(iter_events(lines([body]), comments=comments))


def content_of(evs: Iterable[Event]) -> str:
    """The answer's text: the content of every chat.completion.chunk, joined."""
    return "".join(content(e) for e in evs)
