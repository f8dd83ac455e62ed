"""Sources in a chat: the found passages put before the person's question, numbered, in the
last user message only (never the system prompt: nothing from the library may reach a
prefix that is shared between people), as many as the room allows, and the same list sent
to the client to show."""

from __future__ import annotations

import sys
from typing import Any

from appliance.library.rows import render
from appliance.library.store import Found

INSTRUCTION = ("Answer the question using the numbered sources from the office library below, in the language of "
               "the question. Cite the sources you use as [1], [2]. If the sources do not hold the answer, say that "
               "the library does not say.")


def question_of(messages: list[dict[str, Any]]) -> str | None:
    """The question searched for: the last message, if a person's (None: nothing to search)."""
    last = messages[-1] if messages else None
    if last is None or last.get("role") != "user" or not str(last.get("content", "")).strip():
        return None
    return str(last["content"])


def label(f: Found) -> str:
    return f"{f.title}, page {f.page}" if f.page is not None else f.title


def block(n: int, f: Found, question: str = "") -> str:
    """Source n as the prompt shows it for the question, its tables a cell or a row a line,
    each cell named, those the question names first (library/rows.py). What it costs is
    counted from this (http/retrieval.py)."""
    return f"[{n}] {label(f)}:\n{render(f.text, question)}"


# What the sources add to the question besides their blocks, each block followed by "\n\n".
FRAME = f"{INSTRUCTION}\n\nQuestion: "


def with_sources(messages: list[dict[str, Any]], found: list[Found]) -> list[dict[str, Any]]:
    """The messages with the sources and the instruction before the last user message's text."""
    if not found:
        return messages
    question = str(messages[-1]["content"])
    blocks = "\n\n".join(block(n, f, question) for n, f in enumerate(found, 1))
    content = f"{INSTRUCTION}\n\n{blocks}\n\nQuestion: {question}"
    return [*messages[:-1], {**messages[-1], "content": content}]


def keep(found: list[Found], costs: list[int], top_k: int, budget: int, room: int = sys.maxsize) -> list[Found]:
    """The passages a chat is given, best first: at most top_k and `budget` tokens of them
    (the best one even beyond it), never beyond `room` (the context the conversation leaves).
    One that would go over is passed for a shorter one after it."""
    kept: list[Found] = []
    spent = 0
    for f, cost in zip(found, costs):
        if spent + cost > room or (kept and spent + cost > budget):
            continue
        kept.append(f)
        spent += cost
        if len(kept) == top_k:
            break
    return kept


def sources(found: list[Found]) -> list[dict[str, Any]]:
    """What the client is sent to show beside the answer, numbered as the prompt numbers them."""
    return [{"n": n, "document": f.doc, "title": f.title, "page": f.page, "text": f.text}
            for n, f in enumerate(found, 1)]
