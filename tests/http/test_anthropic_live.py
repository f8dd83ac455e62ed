"""Anthropic's SDK from PyPI, unchanged, against the appliance on the bundled model: a message
whole and streamed (both of the SDK's ways), a tool-use round trip, count_tokens, its key in
x-api-key, and an error the SDK raises as Anthropic's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from helpers.live import Live, live_server

pytestmark = [pytest.mark.integration]
KEY = "anthropic-sdk-key-" + "k" * 16
WEATHER = {"name": "get_weather", "description": "The current weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def server(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    d = tmp_path_factory.mktemp("anthropic")
    (d / "keys").write_text(f"{KEY} sdk\n")
    with live_server(d, model=bundled_model, api_keys_file=d / "keys") as live:
        yield live


@pytest.fixture(scope="module")
def client(server: Live) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0,
                               http_client=anthropic.DefaultHttpxClient(trust_env=False, timeout=300))


def test_a_message_whole_and_streamed_both_ways(client: anthropic.Anthropic) -> None:
    # This SDK has no temperature argument any more (Anthropic's newer models take none); the
    # appliance still reads the field, sent as the SDK sends any extra one.
    ask = {"model": "appliance", "max_tokens": 24, "extra_body": {"temperature": 0}, "system": "Answer with a number only.",
           "messages": [{"role": "user", "content": "What is 2+2?"}]}
    whole = client.messages.create(**ask)  # type: ignore[call-overload]
    assert whole.role == "assistant" and whole.stop_reason in ("end_turn", "max_tokens")
    text = whole.content[0].text  # type: ignore[union-attr]
    assert "4" in text and whole.usage.output_tokens > 0
    with client.messages.stream(**ask) as stream:  # the SDK's helper: it checks the event order
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text and final.stop_reason == whole.stop_reason
    # Again from the cache: the conversation's prefix was read before.
    assert final.usage.cache_read_input_tokens and final.usage.cache_read_input_tokens > 0
    kinds = [e.type for e in client.messages.create(**ask, stream=True)]  # type: ignore[call-overload]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]


def test_a_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    messages: list[dict[str, object]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(model="appliance", max_tokens=96, extra_body={"temperature": 0}, tools=[WEATHER],  # type: ignore[list-item]
                                   tool_choice={"type": "any"}, messages=messages)  # type: ignore[arg-type]
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict) and "city" in use.input
    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "18 degrees Celsius and sunny"}]}]
    # After the result, an answer in words: the same call again is never let out (engine/repeat.py).
    second = client.messages.create(model="appliance", max_tokens=64, extra_body={"temperature": 0}, tools=[WEATHER],  # type: ignore[list-item]
                                    messages=messages)  # type: ignore[arg-type]
    assert second.stop_reason in ("end_turn", "max_tokens"), second.content
    assert [b.type for b in second.content] == ["text"] and second.content[0].text.strip()  # type: ignore[union-attr]


def test_count_tokens_and_an_error_the_sdk_knows(client: anthropic.Anthropic, server: Live) -> None:
    n = client.messages.count_tokens(model="appliance", messages=[{"role": "user", "content": "Hello there."}])
    m = client.messages.create(model="appliance", max_tokens=4, messages=[{"role": "user", "content": "Hello there."}])
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="appliance", max_tokens=8, messages=[])
    assert e.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    wrong = anthropic.Anthropic(base_url=server.url, api_key="not-a-key-of-this-box", max_retries=0,
                                http_client=anthropic.DefaultHttpxClient(trust_env=False))
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="appliance", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
