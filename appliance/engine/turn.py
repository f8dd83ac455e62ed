"""One conversation turn inside the engine (a request: prompt in, tokens out). Engine.submit
makes it and hands it to the engine thread through the inbox, keeping only its id; from
then on only the engine thread touches it. What crosses back is in events.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

from appliance.engine.events import Event, Progress, Report, TokenLogprob
from appliance.sampling import SamplingParams

Sink = Callable[[Event], None]  # where a turn's events go (called on the event loop)


class Lane(Enum):
    """Whose work a turn is. People's turns are admitted and prefilled first; background
    work (a front-end's titles and tags, batch jobs) runs in the capacity they leave."""

    PEOPLE = auto()
    BACKGROUND = auto()


class State(Enum):
    WAITING = auto()  # queued for a slot
    PREFILL = auto()  # has a slot; prompt partly in the KV cache
    DECODE = auto()  # generating one token per step
    FINISHED = auto()


@dataclass(slots=True, eq=False)
class Turn:
    rid: int
    prompt: list[int]
    params: SamplingParams
    arrival: float  # engine clock, s
    sink: Sink = field(repr=False, default=lambda ev: None)
    client: str = ""  # the client identity (address, forwarded address or key): KV reuse is per client
    session: str = ""  # the conversation this turn belongs to (X-Session-Id, or one the server made)
    named: bool = True  # the client sent the session id (False: the server made one up)
    public_len: int = 0  # leading prompt tokens that any client may share (public system prompt)
    system_len: int = 0  # leading tokens through its one system message: public once common (kv/commons)
    allowance: int = 0  # tokens of tool definitions it may hold beyond ctx_limit (prompt.build_prompt)
    # A trusted front-end asks for one of its people (their address or key): its system block,
    # when `block_public` (the template's or a preset, plus tools), is the front-end's (kv/commons).
    front_end: str = ""
    block_public: bool = False
    continuing: bool = False  # its session already has cached KV (scheduling priority)
    no_cache: bool = False  # its session was deleted while it ran: free the KV at the end
    progress: Report = Report.NONE  # which prompts' reading its stream hears of (events.Progress)
    lane: Lane = Lane.PEOPLE
    state: State = State.WAITING
    seq_id: int = -1  # llama.cpp sequence id while it holds a slot
    n_cached: int = 0  # leading tokens of prompt+output whose KV is in the cache
    output: list[int] = field(default_factory=list)
    cancelled: bool = False
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    last_emit_at: float = 0.0  # for inter-token latency
    n_reused: int = 0  # prompt tokens found in the KV cache instead of computed
    copied: int = 0  # of those, tokens whose cells another sequence owns (shared prefix)
    shared: int = 0  # of those, cells a pinned public prefix holds: not reserved for it (kv/store.attach)
    shared_from: int = -1  # that prefix's public sequence, when attach copied it (kv/commons lends it on)
    reserved: int = 0  # KV cells the budget holds for it while it runs (KVBudget.hold)
    # Waits for `leader` to compute the shared prefix [0, lead_n), then copies it.
    leader: Turn | None = field(default=None, repr=False)
    lead_n: int = 0
    # Engine-side helpers (sampler chain, text stream, draft state) live here so a
    # finished turn takes them with it.
    sampler: Any = field(default=None, repr=False)
    text: Any = field(default=None, repr=False)
    drafts: Any = field(default=None, repr=False)
    guard: Any = field(default=None, repr=False)  # repeat.CallGuard while its opening may repeat a call
    unban: Any = None  # after a rewind (repeat.py): the sampling its answer goes on with after its first token
    logprobs: list[TokenLogprob] = field(default_factory=list, repr=False)  # not yet sent with a Delta
    n_sent: int = 0  # leading tokens of `output` whose ids went out with a Delta

    @property
    def background(self) -> bool:
        return self.lane is Lane.BACKGROUND

    @property
    def n_prompt(self) -> int:
        return len(self.prompt)

    @property
    def prefill_left(self) -> int:
        return max(0, len(self.prompt) - self.n_cached)

    def long_prompt(self, step_tokens: int) -> bool:
        """More of its prompt left to compute than one step takes (reused tokens aside):
        such a turn reports progress. A prompt one step computes gets its first token after
        that step (512 tokens: ~2 s on 2 cores), so a note would tell its reader nothing."""
        return len(self.prompt) - self.n_reused > step_tokens

    def reports(self, step_tokens: int) -> bool:
        """It asked to hear of its prompt's reading, and this prompt is one to report."""
        return self.progress is Report.EVERY or (self.progress is Report.LONG and self.long_prompt(step_tokens))

    @property
    def reading(self) -> Progress:
        return Progress(self.n_cached, len(self.prompt), self.n_reused)

    def unsent(self) -> list[int]:
        """The generated ids not yet sent with a Delta (now counted as sent)."""
        out, self.n_sent = self.output[self.n_sent:], len(self.output)
        return out

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    def kv_reserve(self, ctx_limit: int) -> int:
        """KV cells this turn may come to hold: admission keeps the sum within budget,
        so a decode never runs out of cache mid-answer."""
        # A prompt that may be swapped for its retry (repeat.py) reserves for the longer; the
        # cells of a pinned public prefix it copied are counted once, as pinned.
        longest = max(len(self.prompt), len(self.params.retry_prompt)) + self.params.max_tokens
        return min(longest, ctx_limit + self.allowance) - self.shared
