"""KV reuse per client identity, on the real model over a real socket: a client's next
turn without a session id continues its own cache; another client gets nothing from a
private system prompt; an operator preset is shared by everyone and reported as cached."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.live import Live, live_server

pytestmark = pytest.mark.integration
PRESET = "You are the office helpdesk assistant. Answer in one short sentence."
SECRET = "You are Alice's private assistant. Her project codename is BLUEHERON and her budget is 42k."


@pytest.fixture(scope="module")
def server(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    d = tmp_path_factory.mktemp("clients")
    cfg = d / "appliance.toml"
    cfg.write_text(f'[system_prompts]\nhelpdesk = "{PRESET}"\n')
    with live_server(d, model=bundled_model, config=cfg, slots=4, ctx_per_slot=1024, kv_tokens=8192) as live:
        yield live


def ask(live: Live, user: int, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    r = live.chat(messages, as_user=user, max_tokens=24, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]


def cached(usage: dict[str, Any]) -> int:
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def test_presets_are_listed(server: Live) -> None:
    r = server.client.get("/v1/system_prompts")
    assert r.status_code == 200
    assert r.json()["data"] == [{"name": "helpdesk", "text": PRESET}]


def test_second_turn_without_session_id_reuses_the_first(server: Live) -> None:
    first = [{"role": "system", "content": SECRET}, {"role": "user", "content": "What is my codename?"}]
    answer, use1 = ask(server, 1, first)
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And my budget?"}]
    _, use2 = ask(server, 1, second)
    # Everything up to the first answer came from client 1's own cache.
    assert cached(use2) >= use1["prompt_tokens"], (use1, use2)
    assert use2["prompt_tokens"] - cached(use2) < 40


def test_a_private_system_prompt_is_shared_only_whole_once_three_clients_sent_it(server: Live) -> None:
    """common_system_prompts (engine/kv/commons.py): the first client's system prompt stays its
    own, and a second client sending exactly it learns nothing of that (no cached tokens); a
    third client sending it makes it public, and from then on a client that sends it whole
    copies the whole block and nothing of anyone's conversation, while one whose system
    prompt differs only at its end copies nothing at all."""
    # A prompt only this test sends (the test before sent SECRET itself, from client 1).
    private = SECRET + " Her desk is 4B."
    msgs = [{"role": "system", "content": private}, {"role": "user", "content": "What is my codename?"}]
    ask(server, 2, msgs)  # client 2 (Alice) has it cached now
    near = [{"role": "system", "content": private[:-1] + "Z"}, {"role": "user", "content": "What is my codename?"}]
    before = server.health()["engine"]["prompt_tokens_computed"]
    _, use = ask(server, 7, near)  # one client alone: nothing of Alice's, and no oracle by prefix
    assert cached(use) == 0
    assert server.health()["engine"]["prompt_tokens_computed"] - before == use["prompt_tokens"]
    _, second = ask(server, 10, msgs)  # the second client: nothing to tell it Alice sent it
    assert cached(second) == 0
    _, bob = ask(server, 3, msgs)  # the third client to send it whole: public now, copied whole
    _, carol = ask(server, 8, [msgs[0], {"role": "user", "content": "Say hi."}])
    assert 0 < cached(bob) == cached(carol) < carol["prompt_tokens"]  # the system block, no more
    # A near miss nobody else sent still gets nothing of the public block. (Sent again from a
    # third client, Dave's own near miss would become public in turn: three clients sent it.)
    other = [{"role": "system", "content": private[:-1] + "Q"}, msgs[1]]
    _, dave = ask(server, 9, other)
    assert cached(dave) == 0


TOOLS = [{"type": "function", "function": {
    "name": f"office_{name}", "description": f"Look up the office's {name} by a short query.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    for name in ("printers", "rooms", "holidays", "suppliers", "phone_numbers")]


def test_the_same_tools_from_three_clients_are_read_once_for_everyone_after(server: Live) -> None:
    """An office tool (or a chat front-end) sends the same tool definitions from every PC: the
    template writes them into the system block, which becomes shared once three clients sent
    it; before that, nobody gets a token of another's tools."""
    def turn(user: int, question: str) -> dict[str, Any]:
        r = server.chat([{"role": "user", "content": question}], as_user=user, tools=TOOLS, max_tokens=8, temperature=0)
        assert r.status_code == 200, r.text
        return dict(r.json()["usage"])

    _, default = ask(server, 11, [{"role": "user", "content": "Say hello."}])
    first, second = turn(12, "Which printer is on floor two?"), turn(13, "Is room 4B free today?")
    assert cached(first) == cached(second) <= cached(default)  # at most the model's default prompt
    third, fourth = turn(14, "When is the next holiday?"), turn(15, "Who supplies our paper?")
    block = cached(fourth)
    assert block == cached(third) > cached(default) + 5 * 30  # the five tools, read once
    assert fourth["prompt_tokens"] - block < 30  # the question and the template's glue


def test_an_operator_preset_is_shared_and_reported_by_both(server: Live) -> None:
    uses = [ask(server, user, [{"role": "system", "content": PRESET}, {"role": "user", "content": q}])[1]
            for user, q in ((4, "How do I reset my password?"), (5, "Where is the printer?"))]
    # Both copied the preset computed at start-up: the template opening + the preset.
    assert cached(uses[0]) == cached(uses[1]) > 20
    assert all(cached(u) < u["prompt_tokens"] for u in uses)


def test_no_system_message_shares_the_models_default_prompt(server: Live) -> None:
    _, use = ask(server, 6, [{"role": "user", "content": "Say hello."}])
    assert cached(use) > 10  # Qwen's default system prompt, computed at start-up
