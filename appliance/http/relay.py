"""The request life of the text routes beside chat (/v1/completions, /infill, Ollama's /api):
the body read and parsed under the parse gate, then one engine request relayed as a stream
(with waiting notes) or collected whole (a client that leaves cancels it), and timed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from appliance.engine.engine import Handle
from appliance.engine.events import Delta, Done, Failed
from appliance.errors import ApplianceError, EngineFailure
from appliance.http import openai_api as api
from appliance.http.guard import Caller, caller_of
from appliance.http.server import QUEUE_NOTE_S, THREAD_PARSE_BYTES, App, disconnected, read_body, session_key
from appliance.model.prompt import Prompt
from appliance.sampling import SamplingParams


@dataclass(slots=True)
class Timing:
    """Wall-clock marks of one request (monotonic s): what Ollama's durations and
    llama-server's timings report. The first text marks the end of the prompt's work."""

    submitted: float = field(default_factory=time.monotonic)
    first: float = 0.0
    done: float = 0.0

    def saw_text(self) -> None:
        self.first = self.first or time.monotonic()

    def finish(self) -> None:
        self.done = time.monotonic()

    @property
    def prompt_s(self) -> float:
        return max(0.0, (self.first or self.done or time.monotonic()) - self.submitted)

    @property
    def predict_s(self) -> float:
        end = self.done or time.monotonic()
        return max(0.0, end - (self.first or end))

    @property
    def total_s(self) -> float:
        return max(0.0, (self.done or time.monotonic()) - self.submitted)


@asynccontextmanager
async def intake(app: App, request: Request) -> AsyncIterator[tuple[Caller, dict[str, Any]]]:
    """The caller and its JSON body, read and parsed under the parse gate; the gate stays held
    for the block, where the route validates and tokenizes. Refusals are counted as chat's."""
    caller = caller_of(request.scope["state"])
    async with app.gate.permit(caller.client):
        try:
            yield caller, await read_json(request, app.limits.max_messages)
        except ApplianceError as e:
            if e.code:
                app.refused(e.code)
            raise


async def read_json(request: Request, max_messages: int) -> dict[str, Any]:
    body = await read_body(request)
    api.precheck(body, max_messages)  # bodies of countless messages, before parsing
    if len(body) > THREAD_PARSE_BYTES:
        return await asyncio.to_thread(api.parse_json, body)
    return api.parse_json(body)


def submit(app: App, caller: Caller, prompt: list[int] | Prompt, params: SamplingParams) -> Handle:
    """Queue a request without a session id: like chat's, it may continue or share its own
    client's cached conversations by prefix, and nobody else's."""
    return app.engine.submit(prompt, params, caller.client, session_key(caller, api.new_session_id()), named=False)


async def collect(app: App, request: Request, handle: Handle, timing: Timing) -> tuple[list[Delta], Done | Failed] | None:
    """The whole answer's deltas and how it ended; None if the client left first (its request
    is then cancelled, so its slot is free at the next step)."""
    async def answer() -> tuple[list[Delta], Done | Failed]:
        parts: list[Delta] = []
        async for ev in handle.events():
            if isinstance(ev, Delta):
                timing.saw_text()
                parts.append(ev)
            else:
                timing.finish()
                if isinstance(ev, Done):
                    app.note_served(timing.first)  # the wait estimates in queue notes
                return parts, ev
        raise EngineFailure("the engine ended the request without an answer")

    work = asyncio.ensure_future(answer())
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            handle.cancel()
            work.cancel()
    if not work.done() or work.cancelled():
        return None
    return work.result()


async def relay(app: App, handle: Handle, timing: Timing, notes: bool) -> AsyncIterator[Delta | Done | Failed | int]:
    """The request's events as they come; with `notes`, its queue position (an int, 0 =
    running) whenever nothing came for QUEUE_NOTE_S, for a stream that can carry a note (SSE
    comments; NDJSON cannot). The request is cancelled when the stream ends early."""
    async def events() -> AsyncIterator[Delta | Done | Failed | None]:
        if not notes:
            async for ev in handle.events():
                yield ev
            return
        while True:
            got = await handle.next(QUEUE_NOTE_S)
            yield got
            if got is not None and not isinstance(got, Delta):
                return

    try:
        async for ev in events():
            if ev is None:
                yield handle.position
                continue
            if isinstance(ev, Delta):
                timing.saw_text()
            else:
                timing.finish()
                if isinstance(ev, Done):
                    app.note_served(timing.first)  # the wait estimates in queue notes
            yield ev
    finally:
        handle.cancel()  # no-op after Done
