"""How long the engine's steps take, forecast from the steps it just ran, and the queue
notes' wait estimate (`: queued N eta S`) from the published snapshot: when the step in
progress should end, how long a typical step is, the pace answers end at. Pure arithmetic
on the engine thread's own timings; no llama.cpp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from appliance.engine.plan import Step
from appliance.engine.snapshot import Snapshot

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


# The queue's pace: answers that ended in the last minute, from at least four of them. A
# minute holds ~30 answers at an office's busiest (35 a minute on 2 cores) and forgets a lull.
PACE_WINDOW_S = 60.0
PACE_MIN = 4


def wait_estimate(snap: Snapshot, position: int, now: float) -> int | None:
    """Seconds until queue place `position` gets its first token, from the published
    snapshot (`now` on the engine's clock): the step in progress ends, the places the next
    admission takes are admitted then, each place beyond them waits for an answer to end
    (each frees what one waiting request needs, at the pace answers have ended lately), and
    its own first step reads its prompt. Measured, not derived from the slot count: when the
    KV budget holds fewer streams than slots, the old `served time / slots` guess was 2-4x
    short; and with slots free (an office at capacity on 24 slots) the wait is the step in
    progress, which counting answers missed by 2x. Before PACE_MIN answers have ended in
    the last PACE_WINDOW_S, the old guess is all there is for the places beyond."""
    ahead = position - snap.admissible
    if ahead <= 0:
        if not snap.step_s:
            return None  # nothing has run yet: no step to go by
        per_place = 0.0
    elif (pace := _pace(snap.finished_at, now)) is not None:
        per_place = pace
    elif snap.served_s:
        per_place = (sum(snap.served_s) / len(snap.served_s)) / max(1, snap.slots)
    else:
        return None
    boundary = max(0.0, snap.step_ends - now)
    return max(1, math.ceil(boundary + max(0, ahead) * per_place + snap.step_s))


def _pace(finished_at: tuple[float, ...], now: float) -> float | None:
    """Seconds between answers ending, over the last PACE_WINDOW_S (None: too few)."""
    recent = [t for t in finished_at if now - t <= PACE_WINDOW_S]
    return (now - recent[0]) / len(recent) if len(recent) >= PACE_MIN else None
