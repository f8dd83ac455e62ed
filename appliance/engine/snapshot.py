"""What the engine thread publishes for everyone else to read: an immutable picture of the
slots, queue, sessions and counters, replaced whole after every loop iteration (its
sessions view is the same mapping from one picture to the next while no session changes:
EngineCore._sessions_view).

/health, /metrics, GET /v1/sessions/{id} and the `: queued N` notes only render it, so no
reader ever touches state the engine thread is changing. Stats are the running counts
the engine thread keeps behind it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from appliance.engine.figures import HistogramView


@dataclass(frozen=True, slots=True)
class SessionView:
    state: str  # active | cached | parked | saved
    cached_tokens: int
    parked_bytes: int
    last_used: float  # engine clock, s


@dataclass(frozen=True, slots=True)
class Counters:
    steps: int = 0
    peak_seqs_per_step: int = 0
    prompt_tokens_received: int = 0
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0
    draft_tokens: int = 0  # speculative tokens verified
    draft_accepted: int = 0  # of those, accepted
    finished: Mapping[str, int] = field(default_factory=dict)
    decode_rows: int = 0  # generating sequences' rows (one per stream per step; drafts apart)
    # Where the engine thread's wall time goes (s): in llama_decode, in sampling (logits to
    # tokens, text), admitting (attach: restores and prefix copies), the rest of a busy
    # iteration (scheduling, batch building, events), and waiting for work.
    seconds: Mapping[str, float] = field(default_factory=dict)


PHASES = ("decode", "sample", "admit", "other", "idle")
Row = tuple[int, int, int, int]  # one step: (decode seqs, prefill seqs, prefill tokens, draft tokens)


class StepLog:
    """The last `size` steps, kept as frozen blocks of `block` rows plus the open block, so
    a snapshot shares the frozen blocks and copies only the open one. Copying the whole
    4,096-row log into every iteration's snapshot cost 40 us a step (issue 34); a view
    halfway through a block costs 9 us (timeit, this 2-core VM)."""

    __slots__ = ("block", "_frozen", "_open")

    def __init__(self, size: int = 4096, block: int = 128) -> None:
        self.block = block
        self._frozen: deque[tuple[Row, ...]] = deque(maxlen=max(1, size // block))
        self._open: list[Row] = []

    def append(self, row: Row) -> None:
        self._open.append(row)
        if len(self._open) == self.block:
            self._frozen.append(tuple(self._open))
            self._open = []

    def view(self) -> StepLogView:
        return StepLogView(tuple(self._frozen), tuple(self._open))


class StepLogView(Sequence[Row]):
    """An immutable reading of a StepLog: the rows oldest first, as a sequence."""

    __slots__ = ("_blocks", "_n")

    def __init__(self, frozen: tuple[tuple[Row, ...], ...] = (), tail: tuple[Row, ...] = ()) -> None:
        self._blocks = (*frozen, tail) if tail else frozen
        self._n = sum(len(b) for b in self._blocks)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Row]:
        for b in self._blocks:
            yield from b

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self)[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        for b in self._blocks:
            if i < len(b):
                return b[i]
            i -= len(b)
        raise IndexError(i)


@dataclass(slots=True)
class Stats:
    """The engine thread's running counts; `counters()` is the frozen copy it publishes."""

    steps: int = 0
    peak_seqs_per_step: int = 0
    prompt_tokens_received: int = 0
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    decode_rows: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    # Recent steps: shows that a long prefill never stalls the streams already generating.
    step_log: StepLog = field(default_factory=StepLog)

    def spent(self, t0: float, admitted: float, built: float, decoded: float, end: float) -> None:
        """Where one loop iteration's wall time went (perf_counter readings): the breakdown
        of a workload's engine time, without a profiler."""
        sec = self.seconds
        sec["admit"] += admitted - t0
        sec["other"] += built - admitted
        sec["decode"] += decoded - built
        sec["sample"] += end - decoded

    def counters(self) -> Counters:
        return Counters(self.steps, self.peak_seqs_per_step, self.prompt_tokens_received, self.prompt_tokens_computed,
                        self.generated_tokens, self.draft_tokens, self.draft_accepted,
                        MappingProxyType(dict(self.finished)), self.decode_rows,
                        MappingProxyType(dict(self.seconds)))


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: float = 0.0  # engine clock, s
    slots: int = 0
    running: int = 0
    waiting: tuple[int, ...] = ()  # request ids in admission order
    # The highest request id the engine thread has taken from the inbox. Ids are handed
    # out in submit order on the event loop, so a higher one is still in the inbox.
    taken: int = 0
    sessions: Mapping[str, SessionView] = field(default_factory=lambda: MappingProxyType({}))
    parked_bytes: int = 0
    threads: int = 0  # llama.cpp threads the last step ran with (0: not chosen here)
    cores_others: float = 0.0  # of the engine's cores, what other processes used lately
    counters: Counters = field(default_factory=Counters)
    cache_events: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # hits, evictions...
    step_log: Sequence[Row] = StepLogView()  # (decode, prefill seqs, prefill tokens, drafts)
    admissible: int = 0  # queue places the next admission takes as things stand (Scheduler.admissible)
    step_s: float = 0.0  # a recent step's length, s (pace.StepClock)
    step_ends: float = 0.0  # engine clock: when the step in progress should end (0: none running)
    park_budget: int = 0  # bytes parked sessions may use now (shrinks when memory runs short)
    finished_at: tuple[float, ...] = ()  # engine clock: when recent answers ended (the wait estimate)
    served_s: tuple[float, ...] = ()  # how long recent answers took from their first token
    histograms: tuple[HistogramView, ...] = ()  # rendered by http/metrics.py

    @property
    def queue(self) -> int:
        return len(self.waiting)

    @property
    def sessions_cached(self) -> int:
        """Idle sessions whose KV is in the cache (running ones count as slots, not here)."""
        return sum(1 for v in self.sessions.values() if v.state == "cached")

    @property
    def sessions_parked(self) -> int:
        return sum(1 for v in self.sessions.values() if v.state == "parked")

    def position(self, rid: int) -> int:
        """Request `rid`'s 1-based place in the queue: behind everyone waiting while it is
        still in the inbox; 0 once it runs or has ended."""
        if rid > self.taken:
            return len(self.waiting) + 1
        try:
            return self.waiting.index(rid) + 1
        except ValueError:
            return 0
