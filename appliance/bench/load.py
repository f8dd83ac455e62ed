"""The closed-loop load: streamed requests timed chunk by chunk, measure() for one server at
one concurrency level (chat, rewrite, burst, a long paste alongside), and soak() for a fixed
time with the server's RSS sampled."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

import httpx

from appliance.bench import sse
from appliance.bench.people import signed_in
from appliance.bench.progress import Progress
from appliance.bench.results import LevelResult, RequestResult
from appliance.bench.rss import rss_mib, server_pid
from appliance.bench.target import base_url, is_loopback, user_address
from appliance.bench.workload import Workload, first_prompt, follow_up, long_document, opening

Arrival = Literal["together", "staggered"]

# Staggered arrival: worker i starts i * STAGGER_S after the level opens (people reaching
# their keyboards one by one rather than a thundering herd).
STAGGER_S = 0.25


async def request(
    client: httpx.AsyncClient, endpoint: str, workload: Workload,
    messages: list[dict[str, str]], timeout: float, session: str | None = None,
    first_token: asyncio.Event | None = None, extra_headers: dict[str, str] | None = None,
) -> RequestResult:
    """One streamed chat completion, timed chunk by chunk; never raises for HTTP trouble."""
    body = {
        "model": workload.model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": workload.max_tokens, "temperature": workload.temperature,
        "messages": messages,
    }
    headers = {"X-Session-Id": session or f"bench-{uuid.uuid4()}"} if workload.session_ids else {}
    headers.update(extra_headers or {})
    res = RequestResult(t_start=time.perf_counter())
    try:
        # httpx timeouts are per read; asyncio.timeout bounds the whole request.
        async with asyncio.timeout(timeout):
            async with client.stream("POST", endpoint, json=body, headers=headers) as resp:
                res.status = resp.status_code
                if resp.status_code != 200:
                    await resp.aread()
                    res.reason = f"http {resp.status_code}"
                    return res
                await _read_stream(resp, res, first_token)
    except TimeoutError:
        res.reason = "timeout"
    except httpx.HTTPError as e:
        res.reason = type(e).__name__
    finally:
        res.t_end = time.perf_counter()
    if not res.reason and not res.done:
        res.reason = "stream ended without [DONE]"
    return res


async def _read_stream(
    resp: httpx.Response, res: RequestResult, first_token: asyncio.Event | None
) -> None:
    try:
        async for event in sse.aiter_events(sse.alines(resp.aiter_text()), comments=True):
            if isinstance(event, sse.Comment):
                _heard(event.text, res)
                continue
            if event == sse.DONE:
                res.done = True
                return
            if not isinstance(event, dict):
                continue
            if "error" in event:
                err = event["error"]
                kind = (err.get("type") or err.get("code")) if isinstance(err, dict) else None
                res.reason = f"stream error: {kind or 'error'}"
                return
            if isinstance(usage := event.get("usage"), dict):
                if isinstance(n := usage.get("completion_tokens"), int):
                    res.usage_tokens = n
                if isinstance(n := usage.get("prompt_tokens"), int):
                    res.prompt_tokens = n
            # A role-only or empty delta is not a token: TTFT starts at the first visible text.
            if content := sse.content(event):
                res.token_times.append(time.perf_counter())
                res.text += content
                if first_token is not None:
                    first_token.set()
    except ValueError:
        res.reason = "bad json in stream"


def _heard(note: str, res: RequestResult) -> None:
    """Keep the first `queued N eta S` note's estimate (the appliance's; others send none)."""
    words = note.split()
    if res.eta_s is None and len(words) == 4 and words[0] == "queued" and words[2] == "eta" and words[3].isdigit():
        res.eta_s, res.eta_heard = float(words[3]), time.perf_counter()  # whole seconds (App.wait_estimate)


async def measure(
    url: str, concurrency: int, requests: int, workload: Workload, *,
    label: str = "appliance", timeout: float = 300.0, arrival: Arrival = "together",
    stagger_s: float = STAGGER_S, duration_s: float | None = None, progress: Progress | None = None,
) -> LevelResult:
    """Run `requests` streamed requests through `concurrency` closed-loop workers.

    With workload.turns > 1 `requests` is ignored: each worker is one user holding one
    conversation of `turns` requests, and wall time includes the users' think time.
    With `duration_s` (soak) `requests` is ignored too: each worker starts conversation after
    conversation until the time is up, then finishes the request it has in flight.
    """
    multi_turn = workload.turns > 1
    if multi_turn:
        requests = concurrency
    expected = concurrency * workload.turns if multi_turn else requests
    level = _Level(base_url(url) + "/v1/chat/completions", workload, timeout, requests, multi_turn,
                   arrival, stagger_s, progress)
    local = is_loopback(url)
    # One TLS context for all users: building one loads the CA bundle (~10 ms of CPU each).
    tls = httpx.create_ssl_context()
    async with contextlib.AsyncExitStack() as stack:
        # Made before the clock starts: users 0..concurrency-1 are the workers, the last
        # one pastes the long document.
        n_users = concurrency + (1 if workload.long_prompt_tokens else 0)
        people = await signed_in(url, n_users, tls, local)  # people mode: each user signed in
        level.clients = [await stack.enter_async_context(
            user_client(workload, timeout, tls, local, i, headers=people[i] if people else None))
            for i in range(n_users)]
        wall = await level.run(concurrency, label, expected, duration_s)
    return LevelResult(label, concurrency, wall, level.results, level.long_results,
                       _gaps_during(level.long_results, level.results))


def user_client(workload: Workload, timeout: float, tls: ssl.SSLContext, local: bool, i: int,
                n: int = 2, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    """Simulated user i's own HTTP client (n connections at most)."""
    # One client per simulated user: its own connection and, on loopback, its own source
    # address, so the server sees an office of users rather than one very busy one.
    address = user_address(0 if workload.one_address else i) if local else None
    transport = httpx.AsyncHTTPTransport(
        verify=tls, local_address=address,
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
    return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False, headers=headers)


def _gaps_during(long_results: list[RequestResult], results: list[RequestResult]) -> list[float]:
    """The short streams' gaps between tokens while a long paste was in flight."""
    during: list[float] = []
    for lr in long_results:
        # A gap belongs to the long request's flight if the stalled token arrived within it.
        for r in results:
            if r.ok:
                t = r.token_times
                during += [b - a for a, b in zip(t, t[1:], strict=False) if lr.t_start < b <= lr.t_end]
    return during


@dataclass(slots=True)
class _Level:
    """One level in flight: the workers, the long paste, and what they share."""
    endpoint: str
    workload: Workload
    timeout: float
    requests: int
    multi_turn: bool
    arrival: Arrival
    stagger_s: float
    progress: Progress | None
    clients: list[httpx.AsyncClient] = field(default_factory=list)
    results: list[RequestResult] = field(default_factory=list)
    long_results: list[RequestResult] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    first_token: asyncio.Event = field(default_factory=asyncio.Event)
    next_index: int = 0  # shared counter; safe without a lock: only awaits switch tasks
    deadline: float | None = None  # perf_counter() time a soak ends; set when the clock starts

    async def run(self, concurrency: int, label: str, expected: int, duration_s: float | None) -> float:
        """Let the workers go, wait for them and the paste; the wall time in seconds."""
        workers = [asyncio.create_task(self.worker(i)) for i in range(concurrency)]
        paster = asyncio.create_task(self.long_client()) if self.workload.long_prompt_tokens else None
        progress = self.progress
        if progress is not None:
            progress.begin(f"{label} c={concurrency}", duration_s or expected, timed=duration_s is not None)
        tick = asyncio.create_task(self.ticker()) if progress is not None and duration_s else None
        t0 = time.perf_counter()
        self.deadline = t0 + duration_s if duration_s else None
        self.gate.set()
        try:
            await asyncio.gather(*workers)
        finally:
            if tick is not None:
                tick.cancel()
            if progress is not None:
                progress.end()
        wall = time.perf_counter() - t0
        self.first_token.set()  # all short requests failed: let the paste run anyway, then finish
        if paster is not None:
            await paster
        return wall

    async def conversation(self, client: httpx.AsyncClient, k: int) -> None:
        workload = self.workload
        # One session id for the whole conversation, so per-session caches can reuse it.
        session = f"bench-{uuid.uuid4()}"
        # Texts go by k, not by worker, so a run sends the same requests every time.
        prompt, pad = first_prompt(workload, k)
        messages = opening(workload.system, prompt)
        for turn in range(1, workload.turns + 1):
            res = await request(client, self.endpoint, workload, messages, self.timeout, session,
                                 self.first_token)
            res.turn, res.pad_tokens = turn, pad
            self.results.append(res)
            if self.progress is not None:
                self.progress.update(self.results)
            if not res.ok or turn == workload.turns:
                return  # done, or no answer to follow up on: this user gives up
            await asyncio.sleep(workload.think_s)
            if self.deadline is not None and time.perf_counter() >= self.deadline:
                return  # the soak is over: no new turn
            messages += [{"role": "assistant", "content": res.text},
                         {"role": "user", "content": follow_up(workload, k, turn)}]

    async def worker(self, i: int) -> None:
        await self.gate.wait()
        if self.arrival == "staggered":
            await asyncio.sleep(i * self.stagger_s)
        while (self.next_index < self.requests if self.deadline is None else time.perf_counter() < self.deadline):
            k, self.next_index = self.next_index, self.next_index + 1
            await self.conversation(self.clients[i], k)
            if self.multi_turn and self.deadline is None:
                return  # one user, one conversation: no worker takes a second one

    async def long_client(self) -> None:
        # Paste once the short streams are decoding, so the prefill lands mid-output.
        await self.first_token.wait()
        doc = long_document(self.workload.long_prompt_tokens)
        prompt = "Summarise the following document in three sentences.\n\n" + doc
        self.long_results.append(await request(self.clients[-1], self.endpoint, self.workload,
                                                opening(self.workload.system, prompt), self.timeout))

    async def ticker(self) -> None:
        # A soak's bar moves with the clock, not only when a request ends.
        while True:
            await asyncio.sleep(0.5)
            if self.progress is not None:
                self.progress.update(self.results)


async def soak(url: str, concurrency: int, workload: Workload, duration_s: float, *,
               label: str = "appliance", timeout: float = 300.0, arrival: Arrival = "together",
               pid: int | None = None, every_s: float = 5.0, warmup_s: float = 30.0,
               progress: Progress | None = None) -> LevelResult:
    """measure() for duration_s while the server's RSS is sampled every every_s: once before the
    load, then on the interval, then once after (no samples when its process is not found)."""
    found = server_pid(url, pid)
    if found is None:
        print(f"bench: no RSS for {label}: no process found behind {url} (give --pid)", file=sys.stderr)
    samples: list[tuple[float, float]] = []
    t0 = time.perf_counter()

    def take() -> None:
        if found is not None and (mib := rss_mib(found)) is not None:
            samples.append((time.perf_counter() - t0, mib))

    async def sampler() -> None:
        while True:
            await asyncio.sleep(every_s)
            take()

    take()
    task = asyncio.create_task(sampler())
    try:
        level = await measure(url, concurrency, 0, workload, label=label, timeout=timeout,
                              arrival=arrival, duration_s=duration_s, progress=progress)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    take()
    level.rss_mib, level.warmup_s = samples, warmup_s
    return level
