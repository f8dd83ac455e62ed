"""What crosses from the engine to a request's HTTP stream: a prompt's progress (when
asked), text deltas, then how it ended. Delivered on the asyncio loop, in order, to the
request's handle."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from appliance.errors import ApplianceError


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and its likeliest alternatives (logprobs)."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]]
    id: int = -1  # the token's id, and each alternative's (llama-server's completion_probabilities)
    top_ids: tuple[int, ...] = ()


class Report(IntEnum):
    """Which prompts a turn reports the reading of (Progress events)."""

    NONE = 0
    LONG = 1  # prompts longer than one step, after each step (the streams' `: prompt N/M` notes)
    EVERY = 2  # every prompt: once when its turn starts, then after each step (llama-server's return_progress)


@dataclass(frozen=True, slots=True)
class Progress:
    """A prompt being read: `done` of its `total` tokens are in the KV cache, `cached` of
    them found there (reused, not computed). Only before the first Delta, at most once per
    step, for a turn that asked for it (Engine.submit(progress=...), Report)."""

    done: int
    total: int
    cached: int = 0


@dataclass(slots=True)
class Delta:
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the tokens behind `text`, when asked
    tokens: list[int] = field(default_factory=list)  # the ids generated since the last Delta (behind `text`)


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
