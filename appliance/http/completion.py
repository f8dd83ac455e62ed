"""A completion of the client's own prompt, with no chat template: the request fields that
OpenAI's /v1/completions (api/openai/completions.py) and llama-server's /completion
(api/llama/completion.py) read alike. Each API's request adds its own fields to RawRequest;
the two folders share this module and never import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from appliance.http.telemetry import Telemetry, parse_telemetry
from appliance.http.validate import Biases, boolean, parse_logit_bias
from appliance.sampling import SamplingParams


@dataclass(frozen=True, slots=True, kw_only=True)
class RawRequest:
    prompt: str | list[int]  # text (its control-token text parsed) or token ids
    params: SamplingParams
    stream: bool
    bias: Biases = ()  # logit_bias, resolved to token ids after intake (prompting.biased)
    ignore_eos: bool = False  # llama-server's: answer up to max_tokens
    telemetry: Telemetry = Telemetry()  # llama-server's timings_per_token, return_progress


R = TypeVar("R", bound=RawRequest)


def parse_raw(kind: type[R], data: dict[str, Any], prompt: str | list[int], params: SamplingParams, stream: bool,
              **own: Any) -> R:
    """An API's request (kind, with its own fields `own`), the shared ones read from data."""
    return kind(prompt=prompt, params=params, stream=stream, bias=parse_logit_bias(data.get("logit_bias")),
                ignore_eos=boolean(data, "ignore_eos"), telemetry=parse_telemetry(data), **own)
