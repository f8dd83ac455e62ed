"""What a level measured: one RequestResult per request, a LevelResult per server and level,
its summary numbers (percentiles, ms) and the first server's ratios against the others."""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from appliance.bench import engine_time


@dataclass(slots=True)
class RequestResult:
    """One streamed request; times are time.perf_counter() seconds."""

    t_start: float
    t_end: float = 0.0
    status: int = 0  # HTTP status, 0 = no response (connection error, timeout)
    token_times: list[float] = field(default_factory=list)  # each non-empty content chunk
    usage_tokens: int | None = None
    prompt_tokens: int | None = None  # from the usage chunk, when the server sends it
    text: str = ""  # the streamed answer, sent back as history on the next turn
    turn: int = 1  # 1-based position in its conversation
    user: int = 0  # the simulated user (0-based; its source address is user_address(user))
    conversation: int = 0  # the user's 0-based conversation number (office)
    pad_tokens: int | None = None  # the conversation's --prompt-mix document, None = no mix
    done: bool = False  # saw `data: [DONE]`
    reason: str = ""  # why it failed; empty when it succeeded
    eta_s: float | None = None  # the first `: queued N eta S` note's estimate (the appliance)
    eta_heard: float = 0.0  # when that note came

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and not self.reason

    @property
    def rejected(self) -> bool:
        # 429/503 are the server shedding load on purpose: counted apart from real failures.
        return self.status in (429, 503)

    @property
    def completion_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.t_start if self.token_times else None

    @property
    def stream_s(self) -> float:
        """From the first visible text to the end of the stream: how long the words flowed."""
        return self.t_end - self.token_times[0] if self.token_times else 0.0

    def row(self, t0: float) -> dict[str, Any]:
        """This request as JSON (times in s since t0, the start of the load; TTFT in ms)."""
        return {"user": self.user, "conversation": self.conversation, "turn": self.turn,
                "doc_tokens": self.pad_tokens, "t_start": round(self.t_start - t0, 3),
                "t_end": round(self.t_end - t0, 3), "ttft_ms": ms(self.ttft), "status": self.status,
                "ok": self.ok, "completion_tokens": self.completion_tokens if self.ok else 0,
                "reason": self.reason, "eta_s": self.eta_s,
                "eta_heard": round(self.eta_heard - t0, 3) if self.eta_s is not None else None}

    @property
    def waited(self) -> float | None:
        """From its first queue note to its first token: what the note's estimate foretold."""
        return self.token_times[0] - self.eta_heard if self.eta_s is not None and self.token_times else None

    @property
    def gaps(self) -> list[float]:
        """Inter-token latency per chunk (a chunk may carry more than one token)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the load, taken every second of an office run."""

    t: float  # seconds since the load started
    in_flight: int  # requests sent and not yet ended, as the client counts them
    queue: int | None  # the server's /health "queue"; None when it says none (llama-server)


@dataclass(slots=True)
class LevelResult:
    """All requests of one server at one concurrency level (possibly several rounds merged)."""

    label: str
    concurrency: int
    wall_s: float
    results: list[RequestResult]
    long_results: list[RequestResult] = field(default_factory=list)
    itl_during_long: list[float] = field(default_factory=list)  # short-stream gaps, s
    # --workload soak: the server's RSS as (seconds since the load started, MiB), the first
    # taken before it starts and the last after it ended; warm-up ends at warmup_s.
    rss_mib: list[tuple[float, float]] = field(default_factory=list)
    warmup_s: float = 0.0
    t0: float = 0.0  # perf_counter() when the load started (office: what Sample.t counts from)
    timeline: list[Sample] = field(default_factory=list)  # office: queue and in-flight, 1/s
    # office: what the appliance's engine counters added over the run (engine_time.delta);
    # empty for a server without them.
    engine: dict[str, float] = field(default_factory=dict)
    # office --front-end-tasks: the title and tags requests sent after the answers
    tasks: list[RequestResult] = field(default_factory=list)

    @classmethod
    def merge(cls, parts: list[LevelResult]) -> LevelResult:
        first = parts[0]
        return cls(
            first.label, first.concurrency, sum(p.wall_s for p in parts),
            [r for p in parts for r in p.results], [r for p in parts for r in p.long_results],
            [g for p in parts for g in p.itl_during_long],
            # RSS and the timeline are one run's story: the first round tells it.
            first.rss_mib, first.warmup_s, first.t0, first.timeline,
            functools.reduce(engine_time.add, (p.engine for p in parts), {}) if all(p.engine for p in parts) else {},
            [r for p in parts for r in p.tasks],
        )

    def detail(self) -> dict[str, Any]:
        """Office: the timeline as [t, in flight, queue] and every request, times from t0."""
        return {"timeline": [[x.t, x.in_flight, x.queue] for x in self.timeline],
                "requests": [r.row(self.t0) for r in self.results],
                "engine": engine_time.breakdown(self.engine, self.wall_s) if self.engine else None}

    def rss_points(self) -> dict[str, float | None]:
        """RSS (MiB) before the load, once warmed up, after it ended, and the highest seen."""
        s = self.rss_mib
        if not s:
            return {"start": None, "warm": None, "end": None, "max": None}
        warm = next((mib for t, mib in s if t >= self.warmup_s), s[-1][1])
        return {"start": s[0][1], "warm": warm, "end": s[-1][1], "max": max(mib for _, mib in s)}

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def num_rejected(self) -> int:
        return sum(1 for r in self.results if r.rejected)

    @property
    def num_failed(self) -> int:
        """Failures other than rejections."""
        return sum(1 for r in self.results if not r.ok and not r.rejected)

    @property
    def failure_reasons(self) -> Counter[str]:
        return Counter(r.reason for r in self.results if not r.ok)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.completed)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def requests_per_min(self) -> float:
        return len(self.completed) * 60.0 / self.wall_s if self.wall_s > 0 else 0.0

    def ttfts(self, later: bool | None = None) -> list[float]:
        """later: None = every turn, False = turn 1 only, True = turns 2..T only."""
        return [t for r in self.completed if (t := r.ttft) is not None
                and (later is None or (r.turn > 1) == later)]

    def by_user(self) -> dict[int, list[RequestResult]]:
        """Completed answers per simulated user."""
        users: defaultdict[int, list[RequestResult]] = defaultdict(list)
        for r in self.completed:
            users[r.user].append(r)
        return dict(users)

    def user_tokens_per_s(self, in_flight: bool = False) -> list[float]:
        """Per user: generated tokens over the time their answers streamed (first visible text
        to end), or with in_flight over the time their requests were in flight (send to end)."""
        out = []
        for rs in self.by_user().values():
            spent = sum(r.t_end - r.t_start if in_flight else r.stream_s for r in rs)
            if spent > 0:
                out.append(sum(r.completion_tokens for r in rs) / spent)
        return out

    def user_ttft_medians(self) -> list[float]:
        """Each user's median TTFT over their answers (s)."""
        return [statistics.median(t) for rs in self.by_user().values()
                if (t := [x for r in rs if (x := r.ttft) is not None])]

    def latencies(self) -> list[float]:
        return [r.t_end - r.t_start for r in self.completed]

    def itls(self) -> list[float]:
        return [g for r in self.completed for g in r.gaps]

    def prompt_tokens_by_turn(self) -> list[float | None]:
        """Mean usage.prompt_tokens of turn 1, 2, ...: shows how the history grows."""
        by_turn: defaultdict[int, list[int]] = defaultdict(list)
        for r in self.completed:
            if r.prompt_tokens is not None:
                by_turn[r.turn].append(r.prompt_tokens)
        last = max((r.turn for r in self.results), default=0)
        return [round(statistics.fmean(v), 1) if (v := by_turn[t]) else None
                for t in range(1, last + 1)]

    def by_pad(self) -> dict[str, dict[str, Any]]:
        """Turn-1 numbers per --prompt-mix document size (JSON keys: tokens as text).

        Shows whether the short prompts of users arriving together wait behind the long ones.
        """
        groups: defaultdict[int, list[RequestResult]] = defaultdict(list)
        for r in self.results:
            if r.turn == 1 and r.pad_tokens is not None:
                groups[r.pad_tokens].append(r)
        out: dict[str, dict[str, Any]] = {}
        for pad, rs in sorted(groups.items()):
            ok = [r for r in rs if r.ok]
            ttfts = [t for r in ok if (t := r.ttft) is not None]
            sizes = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
            out[str(pad)] = {"requests": len(rs), "completed": len(ok),
                             "prompt_tokens": round(statistics.fmean(sizes), 1) if sizes else None,
                             "ttft_ms_p50": ms(percentile(ttfts, 50)),
                             "ttft_ms_p95": ms(percentile(ttfts, 95))}
        return out

    def summary(self) -> dict[str, Any]:
        """Plain JSON-able numbers; latencies in ms, None where nothing was measured."""
        long_ttfts = [t for r in self.long_results if r.ok and (t := r.ttft) is not None]
        by_turn = {f"{name}_ttft_ms_p{q}": ms(percentile(self.ttfts(later), q))
                   for name, later in (("turn1", False), ("later", True)) for q in (50, 95, 99)}
        return {
            "label": self.label,
            "concurrency": self.concurrency,
            "requests": len(self.results),
            "completed": len(self.completed),
            "rejected": self.num_rejected,
            "failed": self.num_failed,
            "failure_reasons": dict(self.failure_reasons),
            "completion_tokens": self.completion_tokens,
            "wall_s": round(self.wall_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "requests_per_min": round(self.requests_per_min, 2),
            "ttft_ms_p50": ms(percentile(self.ttfts(), 50)),
            "ttft_ms_p95": ms(percentile(self.ttfts(), 95)),
            "ttft_ms_p99": ms(percentile(self.ttfts(), 99)),
            **self.user_summary(),
            "e2e_ms_p50": ms(percentile(self.latencies(), 50)),
            "e2e_ms_p95": ms(percentile(self.latencies(), 95)),
            "itl_ms_p50": ms(percentile(self.itls(), 50)),
            "itl_ms_p95": ms(percentile(self.itls(), 95)),
            "itl_ms_p95_during_long": ms(percentile(self.itl_during_long, 95)),
            # p95 hides a server that stalls every stream once for seconds: show the worst gap.
            "itl_ms_max_during_long": ms(max(self.itl_during_long, default=None)),
            "long_ttft_ms_p50": ms(percentile(long_ttfts, 50)),
            "long_failed": sum(1 for r in self.long_results if not r.ok),
            **self.task_summary(),
            **by_turn,
            "prompt_tokens_by_turn": self.prompt_tokens_by_turn(),
            "by_prompt_mix": self.by_pad(),  # {} without --prompt-mix
            "engine": engine_time.breakdown(self.engine, self.wall_s) if self.engine else None,
            **self.estimates(),
            # The last answer's end, from the moment all requests were let go (burst: how long
            # the person waits for the whole list).
            "last_answer_s": round(max((r.t_end for r in self.results), default=0.0)
                                   - min((r.t_start for r in self.results), default=0.0), 3),
            "rss_mib": self.rss_points(),  # all None unless --workload soak found the server
            "rss_samples": [[round(t, 1), mib] for t, mib in self.rss_mib],
            "warmup_s": self.warmup_s,
        }


    def task_summary(self) -> dict[str, Any]:
        """office --front-end-tasks: how many title and tags requests, and their latency."""
        done = [r for r in self.tasks if r.ok]
        return {"tasks": len(self.tasks), "tasks_failed": len(self.tasks) - len(done),
                "tasks_e2e_ms_p50": ms(percentile([r.t_end - r.t_start for r in done], 50)),
                "tasks_e2e_ms_p95": ms(percentile([r.t_end - r.t_start for r in done], 95))}

    def estimates(self) -> dict[str, Any]:
        """How the queue notes' estimates came true: the waits that followed a note, as actual
        / estimated (p10, p50, p90), and the share within 30 %. An estimate is whole seconds,
        rounded up, so waits under two seconds are not counted."""
        pairs = [(w, r.eta_s) for r in self.completed if (w := r.waited) is not None and r.eta_s and w >= 2]
        ratios = [w / eta for w, eta in pairs]
        return {"eta_checked": len(ratios),
                "eta_ratio_p10": _r2(percentile(ratios, 10)), "eta_ratio_p50": _r2(percentile(ratios, 50)),
                "eta_ratio_p90": _r2(percentile(ratios, 90)),
                "eta_within_30pct": _r2(sum(0.7 <= x <= 1.3 for x in ratios) / len(ratios)) if ratios else None}

    def user_summary(self) -> dict[str, Any]:
        """Per-user pace (tokens/s p50 and p10: the slow users) and fairness: the worst user's
        median TTFT over the best user's (1 = everyone waits alike)."""
        stream, flight, medians = self.user_tokens_per_s(), self.user_tokens_per_s(True), self.user_ttft_medians()
        return {"users_answered": len(self.by_user()),
                "user_tokens_per_s_p50": _r2(percentile(stream, 50)),
                "user_tokens_per_s_p10": _r2(percentile(stream, 10)),
                "user_inflight_tokens_per_s_p50": _r2(percentile(flight, 50)),
                "user_inflight_tokens_per_s_p10": _r2(percentile(flight, 10)),
                "user_ttft_ms_p50_best": ms(min(medians, default=None)),
                "user_ttft_ms_p50_worst": ms(max(medians, default=None)),
                "fairness_ttft_p50": _ratio(max(medians, default=None), min(medians, default=None))}


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _r2(x: float | None) -> float | None:
    return round(x, 2) if x is not None else None


def ms(seconds: float | None) -> float | None:
    """Seconds as ms to 0.1; None stays None (nothing measured)."""
    return None if seconds is None else round(seconds * 1000.0, 1)


def _ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 3) if num is not None and den else None


def _ratios(level: dict[str, LevelResult], a: str, b: str) -> dict[str, float | None]:
    """tokens/s a/b, TTFT b/a (p50, p95, p99, turns 2..T p50), per-user tokens/s p10 a/b and
    fairness b/a: all > 1 when `a` is better."""
    def ttft(label: str, later: bool | None = None, q: float = 50) -> float | None:
        return percentile(level[label].ttfts(later), q)

    ua, ub = level[a].user_summary(), level[b].user_summary()
    return {"tokens_per_s": _ratio(level[a].tokens_per_s, level[b].tokens_per_s),
            "ttft_p50": _ratio(ttft(b), ttft(a)),
            "later_ttft_p50": _ratio(ttft(b, True), ttft(a, True)),
            "ttft_p95": _ratio(ttft(b, q=95), ttft(a, q=95)),
            "ttft_p99": _ratio(ttft(b, q=99), ttft(a, q=99)),
            "user_tokens_per_s_p10": _ratio(ua["user_tokens_per_s_p10"], ub["user_tokens_per_s_p10"]),
            "fairness_ttft_p50": _ratio(ub["fairness_ttft_p50"], ua["fairness_ttft_p50"])}


def level_ratios(level: dict[str, LevelResult], labels: list[str]) -> dict[str, dict[str, float | None]]:
    """The first server against each other one measured at this level."""
    a = labels[0]
    return {b: _ratios(level, a, b) for b in labels[1:] if a in level and b in level}
