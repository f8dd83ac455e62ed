"""Lanes (http/lanes.py): which requests are background work, the 400s for the ways of saying
it wrongly, and a background stream told that it waits behind people, over a real socket."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, USER, Served, error_of, is_idle, serving
from starlette.datastructures import Headers

from appliance.bench import sse
from appliance.engine.turn import Lane
from appliance.errors import BadRequest
from appliance.http.guard import Caller
from appliance.http.keys import parse_keys
from appliance.http.lanes import front_end_task, lane_of

NOBODY = Caller("192.168.1.20", None)
# Open WebUI's default title task, as it sends it (one user message).
TITLE = ("### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.\n"
         "### Guidelines:\n- The title should clearly represent the main theme.\n"
         "### Chat History:\n<chat_history>\nUSER: Which printer is on the second floor?\n</chat_history>")


def lane(data: dict[str, Any], caller: Caller = NOBODY, **headers: str) -> Lane:
    return lane_of(caller, Headers(headers), data)


@pytest.mark.parametrize("data, headers", [
    ({"service_tier": "flex"}, {}),
    ({"priority": 1}, {}),
    ({}, {"x-priority": "background"}),
    ({}, {"x-priority": " Low "}),
    ({"messages": [{"role": "user", "content": TITLE}]}, {}),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": TITLE}]}]}, {}),
    ({"prompt": TITLE}, {}),  # Ollama's /api/generate
])
def test_background_work_in_each_way_clients_say_it(data: dict[str, Any], headers: dict[str, str]) -> None:
    assert lane(data, **headers) is Lane.BACKGROUND


@pytest.mark.parametrize("data, headers", [
    ({"service_tier": "auto"}, {}),
    ({"service_tier": "priority", "priority": 0}, {}),
    ({"priority": -5}, {}),
    ({}, {"x-priority": "interactive"}),
    ({"messages": [{"role": "user", "content": TITLE}]}, {"x-priority": "people"}),  # its word over its shape
    ({"messages": [{"role": "user", "content": "### Task: write me a poem about printers"}]}, {}),
    # The task text quoted earlier in a chat is not the chat's last message.
    ({"messages": [{"role": "user", "content": TITLE}, {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": "thanks"}]}, {}),
])
def test_peoples_requests_stay_in_the_peoples_lane(data: dict[str, Any], headers: dict[str, str]) -> None:
    assert lane(data, **headers) is Lane.PEOPLE


@pytest.mark.parametrize("data, headers, param", [
    ({"service_tier": "slow"}, {}, "service_tier"),
    ({"service_tier": 3}, {}, "service_tier"),
    ({"priority": "1"}, {}, "priority"),
    ({"priority": True}, {}, "priority"),
    ({"priority": 1.5}, {}, "priority"),
    ({}, {"x-priority": "urgent!!"}, "X-Priority"),
])
def test_wrong_values_are_a_400_naming_the_field(data: dict[str, Any], headers: dict[str, str], param: str) -> None:
    with pytest.raises(BadRequest) as e:
        lane(data, **headers)
    assert e.value.param == param


def test_a_background_key_makes_every_request_background() -> None:
    nightly, bob = parse_keys("nightly-key-xxxxxxxxxxxx nightly 0 background\nbob-key-xxxxxxxxxxxxxxxx bob\n")
    assert lane({}, Caller("10.0.0.3", nightly)) is Lane.BACKGROUND
    assert lane({}, Caller("10.0.0.3", bob)) is Lane.PEOPLE


def test_front_end_task_reads_only_strings() -> None:
    assert not front_end_task({"messages": "hi"}) and not front_end_task({"messages": [None]})
    assert not front_end_task({"prompt": 5}) and not front_end_task({})


def test_the_400s_come_from_every_route() -> None:
    with serving() as client:
        err = error_of(client.post(CHAT, json={"messages": USER, "service_tier": "slow"}), 400)
        assert err["param"] == "service_tier"
        r = client.post("/api/chat", json={"model": "m", "messages": USER, "stream": False},
                        headers={"X-Priority": "urgent"})
        assert r.status_code == 400 and "X-Priority" in r.json()["error"]
        assert client.post(CHAT, json={"messages": USER, "service_tier": "flex"}).status_code == 200


def test_a_background_stream_hears_it_waits_behind_people() -> None:
    gate = threading.Event()
    gate.set()
    model = FakeModel(reply="x" * 300, delay=0.005, gate=gate)
    body = {"messages": USER, "stream": True, "max_tokens": 256}
    # Two slots, one kept for people: a person holds one, the background request may not
    # take the other.
    with Served(lambda: model, slots=2) as srv:
        try:
            with srv.user(0).stream("POST", CHAT, json=body) as a:
                a_events = sse.iter_events(sse.lines(a.iter_text()))
                while not sse.content(next(a_events)):
                    pass  # user 0 has a slot once its answer flows
                gate.clear()  # hold the engine: the person's answer cannot end meanwhile
                with srv.user(1).stream("POST", CHAT, json={**body, "max_tokens": 5},
                                        headers={"X-Priority": "background"}) as b:
                    b_events = sse.iter_events(sse.lines(b.iter_text()), comments=True)
                    assert sse.content(next(b_events)) == ""  # role chunk
                    assert next(b_events) == sse.Comment("queued 1 behind people")
                    gate.set()
                    a.close()  # the person leaves: the background request runs
                    rest = list(b_events)
                assert rest[-1] == sse.DONE
                assert "".join(sse.content(e) for e in rest if not isinstance(e, sse.Comment)) == "x" * 5
        finally:
            gate.set()
        assert srv.health(is_idle)["engine"]["finished"] == {"cancelled": 1, "length": 1}
