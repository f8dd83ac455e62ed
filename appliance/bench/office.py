"""--workload office: N users, each on its own address, holding seeded conversations with think
times for a fixed duration, while the server's /health queue (or, without one, the requests
in flight) is sampled every second."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field, replace

import httpx

from appliance.bench.engine_time import delta, scrape
from appliance.bench.load import request, user_client
from appliance.bench.progress import Progress
from appliance.bench.results import LevelResult, RequestResult, Sample
from appliance.bench.schedule import Conversation, Office, conversations
from appliance.bench.target import base_url, is_loopback
from appliance.bench.tasks import MAX_TOKENS as TASK_TOKENS
from appliance.bench.tasks import task_messages
from appliance.bench.workload import Workload

POLL_S = 1.0  # seconds between looks at /health


async def queue_length(client: httpx.AsyncClient, url: str) -> int | None:
    """The "queue" of GET /health, None when the server has no such field (llama-server) or
    does not answer."""
    try:
        resp = await client.get(url)
        value = resp.json().get("queue") if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(slots=True)
class _Office:
    """One office run in flight: what every user shares."""

    endpoint: str
    workload: Workload
    office: Office
    timeout: float
    salt: str
    deadline: float = 0.0
    in_flight: int = 0  # safe without a lock: only awaits switch tasks
    results: list[RequestResult] = field(default_factory=list)
    timeline: list[Sample] = field(default_factory=list)
    tasks: list[RequestResult] = field(default_factory=list)  # --front-end-tasks: titles and tags
    task_clients: list[httpx.AsyncClient] = field(default_factory=list)  # their connections, per user
    pending: list[asyncio.Task[None]] = field(default_factory=list)

    async def user(self, client: httpx.AsyncClient, i: int) -> None:
        for conv in conversations(self.office, i, self.salt):
            if not await self.conversation(client, i, conv):
                return

    async def conversation(self, client: httpx.AsyncClient, i: int, conv: Conversation) -> bool:
        """Send conv's turns; False once the run is over (no turn is sent after the deadline).

        A refused (429/503) or failed turn is not retried: it ends the conversation, and the
        user starts the next one after that one's think time, as a person would start afresh.
        """
        session = f"bench-{uuid.uuid4()}"  # one per conversation, unless --no-session-id
        messages = [{"role": "system", "content": self.workload.system}]
        for t, turn in enumerate(conv.turns, 1):
            await asyncio.sleep(max(0.0, min(turn.think_s, self.deadline - time.perf_counter())))
            if time.perf_counter() >= self.deadline:
                return False
            messages.append({"role": "user", "content": turn.text})
            self.in_flight += 1
            try:
                res = await request(client, self.endpoint, self.workload, messages, self.timeout, session)
            finally:
                self.in_flight -= 1
            res.user, res.conversation, res.turn, res.pad_tokens = i, conv.index, t, conv.doc_tokens
            self.results.append(res)
            if not res.ok:
                return True
            messages.append({"role": "assistant", "content": res.text})
            if self.workload.tasks:
                self.pending += [asyncio.create_task(self.task(self.task_clients[i], m)) for m in task_messages(messages)]
        return True

    async def task(self, client: httpx.AsyncClient, messages: list[dict[str, str]]) -> None:
        """A front-end's title or tags request, sent as the answer ends (not in the user's
        think time: Open WebUI sends them at once), with no session id (Open WebUI sends none)."""
        wl = replace(self.workload, max_tokens=TASK_TOKENS, session_ids=False)
        headers = {"X-Priority": "people"} if self.workload.tasks == "people" else {}
        self.tasks.append(await request(client, self.endpoint, wl, messages, self.timeout, extra_headers=headers))

    async def poll(self, client: httpx.AsyncClient, url: str, t0: float, progress: Progress | None) -> None:
        while True:
            queue = await queue_length(client, url)
            self.timeline.append(Sample(round(time.perf_counter() - t0, 2), self.in_flight, queue))
            if progress is not None:
                progress.update(self.results)
            await asyncio.sleep(max(0.0, t0 + len(self.timeline) * POLL_S - time.perf_counter()))


async def run_office(url: str, users: int, workload: Workload, plan: Office, duration_s: float, *,
                 label: str = "appliance", timeout: float = 300.0, salt: str = "",
                 progress: Progress | None = None) -> LevelResult:
    """Run the office for duration_s: no turn starts after it, turns in flight finish (so the
    wall time includes that drain). `salt` (the round) varies only the documents' nonces."""
    run = _Office(base_url(url) + "/v1/chat/completions", workload, plan, timeout, salt)
    local = is_loopback(url)
    tls = httpx.create_ssl_context()
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(user_client(workload, timeout, tls, local, i))
                   for i in range(users)]
        # A front-end's title and tags requests go over connections of their own, as Open
        # WebUI's server sends them from its pool: over the user's two, both held by them, the
        # person's next turn waited for its own background requests (turns 2+ at p50 82 s
        # against 1.2 s without them, 12 users on the 2-core VM, 2026-12-05).
        run.task_clients = [await stack.enter_async_context(user_client(workload, timeout, tls, local, i, 16))
                            for i in range(users)] if workload.tasks else []
        # /health from the host's own address, which is no user's (see user_address).
        probe = await stack.enter_async_context(
            httpx.AsyncClient(verify=tls, timeout=min(timeout, 5.0), trust_env=False))
        if progress is not None:
            progress.begin(f"{label} office u={users}", duration_s, timed=True)
        metrics = base_url(url) + "/metrics"  # the appliance's engine counters (loopback may read them)
        before = await scrape(probe, metrics)
        t0 = time.perf_counter()
        run.deadline = t0 + duration_s
        poller = asyncio.create_task(run.poll(probe, base_url(url) + "/health", t0, progress))
        try:
            await asyncio.gather(*(run.user(clients[i], i) for i in range(users)))
            await asyncio.gather(*run.pending)  # the last answers' titles and tags
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            if progress is not None:
                progress.end()
        wall = time.perf_counter() - t0
        after = await scrape(probe, metrics) if before is not None else None
    engine = delta(before, after) if before is not None and after is not None else {}
    return LevelResult(label, users, wall, run.results, t0=t0, timeline=run.timeline, engine=engine, tasks=run.tasks)
