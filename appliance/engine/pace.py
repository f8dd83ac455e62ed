"""How long the engine's steps take, forecast from the steps it just ran: the queue notes'
wait estimate (`: queued N eta S`) reads when the step in progress should end and how long
a typical step is. Pure arithmetic on the engine thread's own timings; no llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.engine.scheduler import Step

# Recent calls weigh most: a call's weight halves after ~14 more calls (a few seconds of
# steps), so the forecast follows a pasted page's slow steps and forgets them as quickly.
DECAY = 0.95


@dataclass(slots=True)
class CallCost:
    """Seconds one kind of llama_decode call takes for its rows: a line (a fixed cost, the
    pass over the weights, plus a cost per row) fitted to recent calls, older ones
    forgotten geometrically. A step's cost is not proportional to its rows: on 2 cores 9
    stream rows took ~145 ms and 17 ~207 ms."""

    w: float = 0.0  # the sums of weights, rows, seconds, rows², rows x seconds
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        d = DECAY
        self.w, self.x, self.y = d * self.w + 1, d * self.x + rows, d * self.y + seconds
        self.xx, self.xy = d * self.xx + rows * rows, d * self.xy + rows * seconds

    def predict(self, rows: int) -> float:
        if self.w <= 0:
            return 0.0
        mx, my = self.x / self.w, self.y / self.w
        var = self.xx / self.w - mx * mx
        # All recent calls of one size (or noise): the mean per row is all there is.
        slope = (self.xy / self.w - mx * my) / var if var > 1.0 else 0.0
        if slope <= 0.0:
            return my * rows / mx if mx > 0 else my
        return max(0.0, my + slope * (rows - mx))


@dataclass(slots=True)
class StepClock:
    """The forecast of the engine's steps: one line for calls that carry streams, one for
    calls of prompt chunks alone (a row of a long prompt costs less than a stream's), and the
    recent length of a whole step (all its calls, sampling and admission included)."""

    streams: CallCost = field(default_factory=CallCost)
    prompts: CallCost = field(default_factory=CallCost)
    step_s: float = 0.0  # recent busy loop iteration, s (an exponential average)

    def forecast(self, parts: list[Step]) -> float:
        """Seconds the calls of one step will take."""
        return sum((self.streams if p.decode else self.prompts).predict(p.n_tokens) for p in parts)

    def called(self, part: Step, rows: int, seconds: float) -> None:
        """One llama_decode call ran `rows` rows (drafts included) in `seconds`."""
        (self.streams if part.decode else self.prompts).observe(rows, seconds)

    def stepped(self, seconds: float) -> None:
        self.step_s = seconds if not self.step_s else DECAY * self.step_s + (1 - DECAY) * seconds
