"""What crosses from the engine to a request's HTTP stream: a long prompt's progress (when
asked), text deltas, then how it ended. Delivered on the asyncio loop, in order, to the
request's handle."""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.errors import ApplianceError


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and its likeliest alternatives (logprobs)."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]]
    id: int = -1  # the token's id, and each alternative's (llama-server's completion_probabilities)
    top_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Progress:
    """A long prompt being read: `done` of its `total` tokens are in the KV cache (reused
    ones included). Only before the first Delta, at most once per step, for a turn that
    asked for it (Engine.submit(progress=True))."""

    done: int
    total: int


@dataclass(slots=True)
class Delta:
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the tokens behind `text`, when asked


@dataclass(slots=True)
class Done:
    finish_reason: str  # "stop" | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(slots=True)
class Failed:
    error: ApplianceError


End = Done | Failed  # the last event of every request
Event = Progress | Delta | Done | Failed
