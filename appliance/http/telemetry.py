"""llama-server's stream telemetry, asked for per request and written by every OpenAI-style
front-end (chat, completions, Responses, /completion, /infill): `timings_per_token` (each
streamed chunk carries `timings`, the counts so far) and `return_progress` (`prompt_progress`
objects while the prompt is read, from the engine's Progress events).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from appliance.engine.events import Delta, Done, Progress, Report
from appliance.http.pipeline import Timing
from appliance.http.validate import boolean


@dataclass(frozen=True, slots=True)
class Telemetry:
    """What a request asked to hear besides its answer."""

    per_token: bool = False  # timings_per_token
    progress: bool = False  # return_progress

    @property
    def report(self) -> Report:
        """What to ask the engine for: every prompt's reading (its progress, and the cached
        count every chunk's timings need), or nothing."""
        return Report.EVERY if self.per_token or self.progress else Report.NONE


def timings(done: Done, timing: Timing) -> dict[str, Any]:
    """llama-server's timings, from wall-clock marks (the prompt's includes any queueing)."""
    prompt_n, predicted_n = done.prompt_tokens - done.cached_tokens, done.completion_tokens
    prompt_ms, predicted_ms = timing.prompt_s * 1000, timing.predict_s * 1000
    return {
        "cache_n": done.cached_tokens,
        "prompt_n": prompt_n, "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(prompt_n * 1000 / prompt_ms, 3) if prompt_ms else 0.0,
        "predicted_n": predicted_n, "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": round(predicted_n * 1000 / predicted_ms, 3) if predicted_ms else 0.0,
    }


def parse_telemetry(data: dict[str, Any]) -> Telemetry:
    return Telemetry(boolean(data, "timings_per_token"), boolean(data, "return_progress"))


class Meter:
    """One stream's running counts for those fields: each choice's prompt as the engine
    last reported it, and its generated tokens so far. Its clock starts with the shape,
    made as the request is submitted (the pipeline's Timing, within a millisecond)."""

    def __init__(self, telemetry: Telemetry, n: int = 1) -> None:
        self.telemetry = telemetry
        self.timing = Timing()
        self.reading = [Progress(0, 0)] * n
        self.tokens = [0] * n

    def progress(self, i: int, ev: Progress) -> dict[str, Any] | None:
        """llama-server's {"prompt_progress": ...} for choice i's Progress, or None when not
        asked. time_ms counts from the request's arrival (llama-server's from its slot's start)."""
        self.reading[i] = ev
        if not self.telemetry.progress:
            return None
        ms = round((time.monotonic() - self.timing.submitted) * 1000)
        return {"prompt_progress": {"total": ev.total, "cache": ev.cached, "processed": ev.done, "time_ms": ms}}

    def delta(self, i: int, ev: Delta) -> dict[str, Any]:
        """{"timings": choice i's counts so far} when asked (timings_per_token), else {}."""
        self.timing.saw_text()
        self.tokens[i] += len(ev.tokens)
        if not self.telemetry.per_token:
            return {}
        r = self.reading[i]
        return {"timings": timings(Done("", r.total, self.tokens[i], r.cached), self.timing)}
