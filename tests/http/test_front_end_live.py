"""A chat front-end's tools on the real appliance (issue 37): Open WebUI attaches its built-in
tools to every chat turn, more than a conversation's context allows. The tools take their own
allowance (`tools_tokens`), and the block a trusted front-end sends for all its people is
read once: the next person's first chat copies it. A client not behind the front-end copies
nothing of it (no oracle on what the front-end's people sent)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers.live import Live

from appliance.bench.tasks import TITLE

pytestmark = [pytest.mark.integration]

# Six tools of a front-end, ~770 tokens rendered: three times what --ctx-per-slot 256 allows.
TOOLS = [{"type": "function", "function": {
    "name": f"office_tool_{i}",
    "description": f"Office tool number {i}: looks up records of the {topic} register for a colleague, "
                   "returns the matching rows with their dates, owners and notes, newest first.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "what to look for, in the colleague's words"},
        "limit": {"type": "integer", "description": "how many rows at most"}}, "required": ["query"]}}}
    for i, topic in enumerate(["invoice", "contract", "visitor", "parcel", "room", "laptop"])]


def ask(live: Live, question: str, person: str | None, tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    headers = {"X-OpenWebUI-User-Id": person, "X-OpenWebUI-User-Name": person} if person else {}
    r = live.client.post("/v1/chat/completions", headers=headers, json={
        "messages": [{"role": "user", "content": question}], "tools": tools, "max_tokens": 8, "temperature": 0},
        timeout=900)  # a busy machine reads the block slowly; no test waits on a quiet one
    assert r.status_code == 200, r.text
    return dict(r.json()["usage"])


def test_a_front_ends_tools_fit_beside_the_context_and_are_read_once_for_all_its_people(
        start_server: Callable[..., Live]) -> None:
    live = start_server(ctx_per_slot=256, kv_tokens=4096, slots=2, trusted_proxies="127.0.0.1")
    first = ask(live, "Which invoices are due this week?", "ann")
    assert first["prompt_tokens"] > 256  # beyond the conversation's own context: the tools' allowance
    assert first["prompt_tokens_details"]["cached_tokens"] < 100  # the first chat ever reads the block
    second = ask(live, "Is room 4 free at noon?", "ben")  # another person's first chat
    assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - 30
    # Not behind the front-end: the same tools are this client's own, computed again.
    direct = ask(live, "Is room 4 free at noon?", None)
    assert direct["prompt_tokens_details"]["cached_tokens"] < 100


def test_a_front_ends_second_tools_set_copies_what_it_shares_with_the_first_and_is_read_once(
        start_server: Callable[..., Live]) -> None:
    """Open WebUI 0.12.4 sends its admins 36 built-in tools and its users 30: the first 24 the
    same, then the admins' extra ones (skills, automations) in between. Each set is read
    once, the users' copying the part both begin with, and every later new chat copies its
    whole set."""
    users_tools = TOOLS[:4] + TOOLS[5:]  # the admin's fifth tool is not the users'
    live = start_server(ctx_per_slot=256, kv_tokens=4096, slots=2, trusted_proxies="127.0.0.1")
    admin = ask(live, "Which invoices are due this week?", "ann")
    assert admin["prompt_tokens_details"]["cached_tokens"] < 100
    # A second admin: a set sent for two people is the front-end's, and lends a part of itself
    # (sent for one, a person's own tools might be in it).
    assert ask(live, "Which contracts end in May?", "zoe")["prompt_tokens_details"]["cached_tokens"] > 600
    user = ask(live, "Is room 4 free at noon?", "ben", users_tools)  # the first user's first chat
    cached = user["prompt_tokens_details"]["cached_tokens"]
    assert user["prompt_tokens"] - 100 > cached > user["prompt_tokens"] // 2  # four tools of five copied
    for person, tools in (("cat", users_tools), ("dan", TOOLS)):
        later = ask(live, "Where is the spare laptop?", person, tools)
        assert later["prompt_tokens_details"]["cached_tokens"] >= later["prompt_tokens"] - 30


def test_a_front_ends_title_template_is_read_once_three_people_have_sent_it(start_server: Callable[..., Live]) -> None:
    """Open WebUI's title request is its ~250-token template, then the chat: after three
    people's titles, every later one copies the template and reads only the chat."""
    live = start_server(slots=2, trusted_proxies="127.0.0.1")
    cached = []
    for i, person in enumerate(["ann", "ben", "cat", "dan"]):
        history = f"USER: Which room is free at {i + 9} o'clock?\nASSISTANT: Room {i + 2} is free then."
        r = live.client.post("/v1/chat/completions", headers={"X-OpenWebUI-User-Id": person}, json={
            "messages": [{"role": "user", "content": TITLE.replace("{history}", history)}],
            "max_tokens": 4, "temperature": 0}, timeout=900)
        assert r.status_code == 200, r.text
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached[0] < 40 and cached[1] < 40  # the template's start only: one or two identities
    assert cached[2] > 200 and cached[3] > 200  # the third identity's own request copies it, and every later one
