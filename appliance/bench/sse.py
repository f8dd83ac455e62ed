"""Client side of OpenAI-style Server-Sent Events: text lines in, payloads out.

One `data:` line is one event (OpenAI servers never split a payload over several lines), so
each line is decoded on its own and a payload is seen as soon as its line arrives. Feed it
`lines(response.iter_text())` rather than httpx's `iter_lines()`: see `lines`.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"
_EOL = re.compile(r"\r\n|\r|\n")  # SSE's only line ends


@dataclass(frozen=True, slots=True)
class Comment:
    """An SSE comment line (`: queued 3` -> text "queued 3"): ignored by OpenAI clients,
    but the appliance uses them to say a stream is waiting for a slot."""

    text: str


Event = dict[str, Any] | str | Comment  # a JSON object, DONE, or a Comment


def parse_line(line: str) -> Event | None:
    """The payload of one line; None for blank lines and fields other than `data`.

    Raises ValueError when a data line holds something other than a JSON object or [DONE].
    """
    line = line.rstrip("\r\n")
    if line.startswith(":"):
        return Comment(line[1:].strip())
    if not line.startswith("data:"):
        return None  # blank separator, or event:/id:/retry:, which these servers do not use
    data = line[5:].strip()
    if data == DONE:
        return DONE
    obj = json.loads(data)  # json.JSONDecodeError is a ValueError
    if not isinstance(obj, dict):
        raise ValueError(f"SSE data is not a JSON object: {data[:80]!r}")
    return obj


def content(ev: Event) -> str:
    """The text a chat.completion.chunk adds; "" for role-only, finish and usage chunks."""
    choices = ev.get("choices") if isinstance(ev, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    delta = first.get("delta") if isinstance(first, dict) else None
    text = delta.get("content") if isinstance(delta, dict) else None
    return text if isinstance(text, str) else ""


def lines(chunks: Iterable[str]) -> Iterator[str]:
    """Split streamed text into lines at CR, LF or CRLF only.

    httpx's iter_lines() splits like str.splitlines(), also at U+0085, U+2028 and U+2029,
    which json.dumps(ensure_ascii=False) leaves unescaped inside strings (the appliance sends
    UTF-8, not \\u escapes): an answer holding one would cut its `data:` line in two.
    """
    buf = ""
    for chunk in chunks:
        *done, buf = _EOL.split(buf + chunk)
        yield from done  # a CRLF split across chunks adds one blank line: harmless
    if buf:
        yield buf


async def alines(chunks: AsyncIterable[str]) -> AsyncIterator[str]:
    """lines() for `response.aiter_text()`."""
    buf = ""
    async for chunk in chunks:
        *done, buf = _EOL.split(buf + chunk)
        for line in done:
            yield line
    if buf:
        yield buf


def iter_events(source: Iterable[str], *, comments: bool = False) -> Iterator[Event]:
    """Payloads of the lines in `source`, e.g. `lines(response.iter_text())`; comments only
    if asked."""
    for line in source:
        ev = parse_line(line)
        if ev is not None and (comments or not isinstance(ev, Comment)):
            yield ev


async def aiter_events(source: AsyncIterable[str], *, comments: bool = False) -> AsyncIterator[Event]:
    """iter_events for `alines(response.aiter_text())`."""
    async for line in source:
        ev = parse_line(line)
        if ev is not None and (comments or not isinstance(ev, Comment)):
            yield ev
