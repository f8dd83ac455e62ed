"""Request pieces the API folders share from appliance/http/ (they never import each other):
the alternatives-per-token count, the fields both raw-prompt completions read, and the text
parts of a message's content. Each API's own tests cover them through its routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from appliance.errors import BadRequest
from appliance.http.completion import RawRequest, parse_raw
from appliance.http.messages import text_parts
from appliance.http.telemetry import Telemetry
from appliance.http.validate import MAX_TOP_LOGPROBS, logprob_count
from appliance.sampling import SamplingParams


def test_logprob_count_is_an_integer_up_to_the_cap() -> None:
    assert logprob_count({}, "n_probs") is None
    assert logprob_count({"n_probs": 0}, "n_probs") == 0
    assert logprob_count({"logprobs": MAX_TOP_LOGPROBS}, "logprobs") == MAX_TOP_LOGPROBS
    for value, words in ((MAX_TOP_LOGPROBS + 1, "between 0 and 20"), (-1, "between 0 and 20"),
                         ("3", "must be an integer"), (True, "must be an integer")):
        with pytest.raises(BadRequest, match=words) as e:
            logprob_count({"top_logprobs": value}, "top_logprobs")
        assert e.value.param == "top_logprobs" and "'top_logprobs'" in e.value.message


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnRequest(RawRequest):
    echo: bool


def test_parse_raw_reads_the_shared_fields_and_keeps_the_apis_own() -> None:
    params = SamplingParams(max_tokens=4)
    data: dict[str, Any] = {"logit_bias": {"7": -100}, "ignore_eos": True, "timings_per_token": True}
    req = parse_raw(OwnRequest, data, [1, 2], params, True, echo=True)
    assert isinstance(req, OwnRequest)
    assert (req.prompt, req.params, req.stream, req.echo, req.ignore_eos) == ([1, 2], params, True, True, True)
    assert req.bias == ((7, -100.0),) and req.telemetry.per_token
    plain = parse_raw(OwnRequest, {}, "hi", params, False, echo=False)
    assert (plain.bias, plain.ignore_eos, plain.telemetry) == ((), False, Telemetry())
    with pytest.raises(BadRequest) as e:
        parse_raw(OwnRequest, {"ignore_eos": "yes"}, "hi", params, False, echo=False)
    assert e.value.param == "ignore_eos"


def test_text_parts_takes_only_text_of_the_kinds_named() -> None:
    parts = [{"type": "input_text", "text": "a"}, {"type": "output_text", "text": "b", "annotations": []}]
    assert text_parts(parts, "input[0].content", ("input_text", "output_text"), "a text part") == ["a", "b"]
    assert text_parts([], "system", ("text",), "a text block") == []
    for bad in ({"type": "image", "source": {}}, {"type": "text"}, {"type": "text", "text": 1}, "plain", None):
        with pytest.raises(BadRequest) as e:
            text_parts([{"type": "text", "text": "ok"}, bad], "messages[2].content", ("text",), "a text block")
        assert e.value.message == "'messages[2].content[1]' must be a text block"
        assert e.value.param == "messages[2].content"
