"""The Starlette app: routes, SSE streaming, the chat page, health and metrics.

It talks to the engine only through prepare/submit/cancel/delete_session, reads its
published snapshot, and never touches llama.cpp.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from appliance.engine.engine import Engine, EngineState, Handle
from appliance.engine.events import Delta, Done, Failed
from appliance.engine.names import session_name
from appliance.errors import ApplianceError, EngineFailure, NotFound, PayloadTooLarge
from appliance.http import openai_api as api
from appliance.http.choices import Choice
from appliance.http.guard import Caller, Guard, GuardPolicy, caller_of
from appliance.http.keys import KeyRing
from appliance.http.limits import ParseGate
from appliance.http.metrics import Metrics
from appliance.model.prompt import Prompt

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parents[2] / "web"
QUEUE_NOTE_S = 1.0  # how often a queued stream hears ": queued N"
THREAD_PARSE_BYTES = 64 * 1024  # larger bodies are parsed off the event loop


def error_response(err: ApplianceError) -> JSONResponse:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


class App:
    """State shared by the routes: the engine and what the API says about the model."""

    def __init__(self, engine: Engine, model_id: str, limits: api.ServerLimits, web_dir: Path | None = None,
                 metrics: Metrics | None = None, *, system_prompts: dict[str, str] | None = None,
                 guard: GuardPolicy | None = None, parse_concurrency: int = 4, parse_per_client: int = 2) -> None:
        self.engine = engine
        self.metrics = metrics
        self.model_id = model_id
        self.limits = limits
        self.web_dir = web_dir or WEB_DIR
        self.system_prompts = dict(system_prompts or {})
        self.guard = guard or GuardPolicy.build(KeyRing())
        self.gate = ParseGate(parse_concurrency, parse_per_client)
        self.created = int(time.time())
        self._served: deque[float] = deque(maxlen=32)  # seconds each recent request held a slot

    def refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason).inc()

    def wait_estimate(self, position: int) -> int | None:
        """Seconds until queue position `position` gets a slot, from recent requests' times."""
        if not self._served:
            return None
        return math.ceil(position * (sum(self._served) / len(self._served)) / max(1, self.engine.snapshot.slots))

    # -- routes --------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        e = self.engine
        # Open to anyone, so counts only; the model and a load error's text (which may name
        # paths) only for the operator: this machine or an admin key.
        caller = caller_of(request.scope["state"])
        operator = caller.local or caller.admin
        stalled = e.stalled_s  # > 0 once one engine step has run longer than stall_s (a hang)
        status = "stalled" if stalled else e.state.value
        body: dict[str, Any] = {"status": status}
        if stalled:
            body["stalled_s"] = round(stalled, 1)
        if e.state is EngineState.FAILED:
            body["error"] = e.load_error if operator else "the model failed to load; see the server log"
        if e.state in (EngineState.READY, EngineState.DRAINING):
            snap = e.snapshot
            c = snap.counters
            if operator:
                body["model"] = self.model_id
            body.update({
                "slots": {"total": snap.slots, "busy": snap.running, "idle": snap.slots - snap.running},
                "queue": snap.queue,
                "engine": {
                    "steps": c.steps,
                    "peak_seqs_per_step": c.peak_seqs_per_step,
                    "prompt_tokens_received": c.prompt_tokens_received,
                    "prompt_tokens_computed": c.prompt_tokens_computed,
                    "generated_tokens": c.generated_tokens,
                    "draft_tokens": c.draft_tokens,
                    "draft_accepted": c.draft_accepted,
                    "finished": dict(c.finished),
                },
                "sessions": {
                    **snap.cache_events,  # event counts first: the current counts below win
                    "cached": snap.sessions_cached,
                    "parked": snap.sessions_parked,
                    "parked_bytes": snap.parked_bytes,
                },
            })
            from appliance.cpu import SENSORS  # here: this method is the one place server.py reads sensors

            mem, heat = SENSORS.read()
            body["memory"] = {"total_bytes": mem.total, "available_bytes": mem.available,
                              "pressure_pct": mem.pressure, "cgroup_limit_bytes": mem.cgroup_limit,
                              "park_budget_bytes": e.park_budget}
            body["thermal"] = {"throttled": heat.throttled, "zones_c": dict(heat.zones)}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    async def system_prompts_list(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"name": k, "text": v} for k, v in self.system_prompts.items()]})

    async def models(self, request: Request) -> Response:
        body = api.models_list(self.model_id, self.created)
        # The context one request may use (prompt + answer), named as llama-server (meta.n_ctx)
        # and vLLM (max_model_len) report it: clients size their prompts by it.
        ctx = self.limits.ctx_limit
        body["data"][0].update(max_model_len=ctx, meta={"n_ctx": ctx, "n_vocab": self.engine.n_vocab or None})
        return JSONResponse(body)

    async def chat(self, request: Request) -> Response:
        caller = caller_of(request.scope["state"])
        # Reading, parsing and tokenizing are bounded per client and in all before they start.
        async with self.gate.permit(caller.client):
            try:
                body = await read_body(request)
                req = await _parse(body, self.limits, request.headers.get("x-session-id"))
            except ApplianceError as e:
                if e.code:
                    self.refused(e.code)
                raise
            prompt = await self.engine.prepare(req.messages, req.params.max_tokens, req.tools)
            await self.engine.check_grammar(req.params.grammar)
        session = req.session_id or api.new_session_id()
        handles = self._submit_choices(req, prompt, caller, session)
        headers = {"X-Session-Id": session}
        extra: dict[str, Any] = {}
        if prompt.dropped_messages:
            headers["X-Dropped-Messages"] = str(prompt.dropped_messages)
            extra["dropped_messages"] = prompt.dropped_messages
        cid, created = api.new_id(), int(time.time())
        choices = [Choice(i, req.tool_names, req.params.logprobs is not None) for i in range(req.n)]
        if req.stream:
            headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return StreamingResponse(guarded(self._stream(handles, choices, req, cid, created, extra), handles),
                                     media_type="text/event-stream", headers=headers)
        return await self._complete(request, handles, choices, cid, created, extra, headers)

    def _submit_choices(self, req: api.ChatRequest, prompt: Prompt, caller: Caller, session: str) -> list[Handle]:
        """One engine request per choice. They are submitted together with one prompt, so
        the engine computes it once and the others copy its cells (kvstore's followers);
        only the first continues the session."""
        handles: list[Handle] = []
        try:
            for i in range(req.n):
                params = req.params
                if i and params.seed is not None:
                    params = dataclasses.replace(params, seed=params.seed + i)
                key = session_key(caller, session) if i == 0 else session_key(caller, api.new_session_id())
                handles.append(self.engine.submit(prompt, params, caller.client, key,
                                                  named=i == 0 and req.session_id is not None))
        except ApplianceError:
            for h in handles:
                h.cancel()
            raise
        return handles

    async def _stream(self, handles: list[Handle], choices: list[Choice], req: api.ChatRequest, cid: str,
                      created: int, extra: dict[str, Any]) -> AsyncGenerator[bytes, None]:
        model = self.model_id
        events: asyncio.Queue[tuple[int, Delta | Done | Failed]] = asyncio.Queue()

        async def pump(i: int, h: Handle) -> None:
            async for ev in h.events():
                await events.put((i, ev))

        pumps = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
        started, ends = 0.0, dict[int, Done]()
        try:
            yield api.sse(api.chunks(cid, created, model, [c.entry({"role": "assistant", "content": ""})
                                                           for c in choices], **extra))
            while len(ends) < len(handles):
                try:
                    i, ev = await asyncio.wait_for(events.get(), QUEUE_NOTE_S)
                except TimeoutError:
                    # Waiting for a slot: an SSE comment (ignored by OpenAI clients, shown by
                    # the chat page) tells the user, and finds out if they left.
                    yield self.queue_note(min((pos for h in handles if (pos := h.position)), default=0))
                    continue
                if isinstance(ev, Failed):
                    # The 200 is already sent: the error travels as one event, then we close.
                    yield sse_error(ev.error)
                    return
                if isinstance(ev, Delta):
                    started = started or time.monotonic()
                    entries = choices[i].delta(ev)
                else:
                    ends[i] = ev
                    entries, reason = choices[i].finish(ev)
                    entries.append({**choices[i].entry({}), "finish_reason": reason})
                for entry in entries:
                    yield api.sse(api.chunks(cid, created, model, [entry]))
            self.note_served(started)
            if req.include_usage:
                yield api.sse(api.usage_chunk(cid, created, model, _usage(list(ends.values()))))
            yield api.sse("[DONE]")
        finally:
            for task in pumps:
                task.cancel()
            for h in handles:
                h.cancel()  # no-op after Done; frees the slot if the client went away

    def queue_note(self, position: int) -> bytes:
        if not position:
            return b": busy\n\n"
        eta = self.wait_estimate(position)
        return f": queued {position} eta {eta}\n\n".encode() if eta is not None else f": queued {position}\n\n".encode()

    def note_served(self, started: float) -> None:
        if started:
            self._served.append(time.monotonic() - started)

    async def _complete(self, request: Request, handles: list[Handle], choices: list[Choice], cid: str,
                        created: int, extra: dict[str, Any], headers: dict[str, str]) -> Response:
        async def collect(h: Handle, choice: Choice) -> tuple[dict[str, Any], Done] | Failed:
            async for ev in h.events():
                if isinstance(ev, Delta):
                    choice.delta(ev)
                elif isinstance(ev, Done):
                    return choice.message(ev), ev
                else:
                    return ev
            raise EngineFailure("the engine ended the request without an answer")

        t0 = time.monotonic()
        work = asyncio.ensure_future(asyncio.gather(*(collect(h, c) for h, c in zip(handles, choices))))
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                for h in handles:
                    h.cancel()  # the client left: free its slots at the next step
                work.cancel()
                # A cancelled gather() ends holding its children's CancelledError as its
                # exception: fetch it, or asyncio logs "exception was never retrieved".
                work.add_done_callback(lambda f: f.cancelled() or f.exception())
        if not work.done() or work.cancelled():
            return Response(status_code=499)
        results = work.result()
        failed = next((r for r in results if isinstance(r, Failed)), None)
        if failed is not None:
            return error_response(failed.error)
        done = [r for r in results if not isinstance(r, Failed)]
        self.note_served(t0)
        body = api.completion_of(cid, created, self.model_id, [m for m, _ in done], _usage([d for _, d in done]), **extra)
        return JSONResponse(body, headers=headers)

    async def session(self, request: Request) -> Response:
        # One route for both methods, so a 405 lists both in Allow.
        if request.method == "DELETE":
            return await self.delete_session(request)
        return await self.get_session(request)

    def _session_key(self, request: Request) -> str:
        sid = request.path_params["sid"]
        if not api.valid_session_id(sid):
            raise NotFound("no such session (it may have expired)")
        return session_key(caller_of(request.scope["state"]), sid)

    async def get_session(self, request: Request) -> Response:
        key = self._session_key(request)
        info = self.engine.session_info(key)
        if info is None:
            raise NotFound("no such session (it may have expired)")
        return JSONResponse({**info, "id": request.path_params["sid"]})

    async def delete_session(self, request: Request) -> Response:
        if not await self.engine.delete_session(self._session_key(request)):
            raise NotFound("no such session (it may have expired)")
        return Response(status_code=204)

    async def steps(self, request: Request) -> Response:
        """Recent decode steps as [decode seqs, prefill seqs, prefill tokens, draft tokens],
        oldest first: shows how prefill chunks, drafts and decode tokens share each step."""
        return JSONResponse({"steps": [list(x) for x in self.engine.snapshot.step_log]})

    async def prometheus(self, request: Request) -> Response:
        if self.metrics is None:
            raise NotFound("metrics are off")
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def index(self, request: Request) -> Response:
        return FileResponse(self.web_dir / "index.html")


def session_key(caller: Caller, session: str) -> str:
    """What the engine calls a session: a digest of the caller's key and the id, so another
    key's sessions are out of reach, and no raw id is held, logged or saved anywhere."""
    return session_name(caller.namespace, session)


def sse_error(err: ApplianceError) -> bytes:
    """The event that ends a stream which failed after its 200: OpenAI's error body."""
    return api.sse(err.body())


async def guarded(chunks: AsyncGenerator[bytes, None], handles: Sequence[Handle],
                  error_event: Callable[[ApplianceError], bytes] = sse_error) -> AsyncIterator[bytes]:
    """A response stream that ends in exactly one error event whatever goes wrong while it
    runs, as it does when the engine fails a request: the 200 is already sent, so the error
    can only travel in the stream (a cut connection would tell the client nothing). The
    requests are cancelled, so their slots are free at the next step."""
    async with aclosing(chunks):  # closed now, not whenever the collector gets to it
        try:
            async for chunk in chunks:
                yield chunk
            return
        except ApplianceError as e:
            log.warning("a response stream ended early: %s", e.message)
            err = e
        except Exception:
            log.exception("a response stream failed")
            err = EngineFailure("internal error; see the server log")
        for h in handles:
            h.cancel()  # no-op after Done
        yield error_event(err)


async def disconnected(request: Request) -> None:
    """Returns when a client waiting for a whole (non-streamed) answer goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_body(request: Request) -> bytes:
    if int(request.headers.get("content-length") or 0) > api.MAX_BODY_BYTES:
        raise PayloadTooLarge(f"the request body is larger than {api.MAX_BODY_BYTES // 2**20} MiB", code="body_too_large")
    body = bytearray()
    async for part in request.stream():  # bounded even without a Content-Length
        body += part
        if len(body) > api.MAX_BODY_BYTES:
            raise PayloadTooLarge(f"the request body is larger than {api.MAX_BODY_BYTES // 2**20} MiB",
                                  code="body_too_large")
    return bytes(body)


async def _parse(body: bytes, limits: api.ServerLimits, session_header: str | None) -> api.ChatRequest:
    def parse() -> api.ChatRequest:
        return api.parse_chat_request(api.parse_json(body), limits, session_header)

    api.precheck(body, limits.max_messages)  # a few ms for 4 MiB, and no GIL held for long

    # A 4 MiB body takes tens of ms to parse and check: not on the event loop.
    return await asyncio.to_thread(parse) if len(body) > THREAD_PARSE_BYTES else parse()


def _usage(ends: list[Done]) -> dict[str, Any]:
    """One prompt (computed once for all choices), every choice's completion tokens."""
    first = ends[0]
    return api.usage(first.prompt_tokens, sum(d.completion_tokens for d in ends), first.cached_tokens)


async def _appliance_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApplianceError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound(f"no route {request.method} {request.url.path}"))
    err = ApplianceError(str(exc.detail))
    err.status, err.type = exc.status_code, "invalid_request_error"
    response = error_response(err)
    response.headers.update(exc.headers or {})  # e.g. a 405's Allow
    return response


async def _client_left(request: Request, exc: Exception) -> Response:
    # Mid-body (or dropped by conn.py's deadline): nobody to answer and nothing to log.
    return Response(status_code=499)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return error_response(EngineFailure("internal error; see the server log"))


def create_app(app_state: App) -> Starlette:
    """The app behind its front door (guard.Guard): every route sees a checked caller."""
    from appliance.http import (
        completions,
        ollama,  # here: the route modules build on this module's App
    )

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # The HTTP server is up before the model loads: /health says "loading" meanwhile.
        app_state.engine.start(asyncio.get_running_loop())
        yield
        await asyncio.to_thread(app_state.engine.stop)

    routes = [
        Route("/health", app_state.health),
        Route("/v1/models", app_state.models),
        Route("/v1/system_prompts", app_state.system_prompts_list),
        Route("/metrics", app_state.prometheus),
        Route("/debug/steps", app_state.steps),
        Route("/v1/chat/completions", app_state.chat, methods=["POST"]),
        # Text completion, fill-in-the-middle and tokens (completions.py).
        Route("/v1/completions", partial(completions.completions, app_state), methods=["POST"]),
        Route("/infill", partial(completions.infill, app_state), methods=["POST"]),
        Route("/tokenize", partial(completions.tokenize, app_state), methods=["POST"]),
        Route("/detokenize", partial(completions.detokenize, app_state), methods=["POST"]),
        # Ollama's API (ollama.py).
        Route("/api/chat", partial(ollama.chat, app_state), methods=["POST"]),
        Route("/api/generate", partial(ollama.generate, app_state), methods=["POST"]),
        Route("/api/tags", partial(ollama.tags, app_state)),
        Route("/api/show", partial(ollama.show, app_state), methods=["POST"]),
        Route("/api/ps", partial(ollama.ps, app_state)),
        Route("/api/version", partial(ollama.version, app_state)),
        Route("/v1/sessions/{sid}", app_state.session, methods=["GET", "DELETE"]),
        Route("/", app_state.index),
        # Under /static so that no catch-all shadows the API's 405s and 404s.
        Mount("/static", StaticFiles(directory=app_state.web_dir), name="web"),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(Guard, policy=app_state.guard, on_refuse=app_state.refused)],
        exception_handlers={ApplianceError: _appliance_error, HTTPException: _http_error,
                            ClientDisconnect: _client_left, Exception: _unexpected},
    )
