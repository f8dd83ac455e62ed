"""The routes that generate nothing: /health, /metrics, /v1/models, the system prompts,
a session's info and its deletion, /debug/steps and the chat page.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from appliance.engine.engine import EngineState
from appliance.engine.names import session_name
from appliance.errors import NotFound
from appliance.http.guard import caller_of
from appliance.http.state import App
from appliance.http.validate import valid_session_id


async def health(app: App, request: Request) -> Response:
    e = app.engine
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
        if operator:
            body["model"] = app.model_id
        body.update(_engine_health(app))
        body.update(_machine_health(app))
        # Degraded, not down: answers go on (counted in memory, conversations recomputed).
        if (state := app.state_dir()) is not None:
            body["state_dir"] = state if operator else {"writable": state["writable"]}
        # Requests being read (a body arriving) and parsed: slow senders hold only the former.
        body["parse"] = {"busy": app.gate.busy, "reading": app.gate.reading, "total": app.gate.total}
    return JSONResponse(body, status_code=200 if status == "ok" else 503)


def _engine_health(app: App) -> dict[str, Any]:
    """Slots, queue, engine counters and sessions, from the engine's published snapshot."""
    snap = app.engine.snapshot
    c = snap.counters
    return {
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
    }


def _machine_health(app: App) -> dict[str, Any]:
    from appliance.cpu import SENSORS  # the one reader /admin/status and /metrics share, cached for 1 s

    mem, heat = SENSORS.read()
    return {"memory": {"total_bytes": mem.total, "available_bytes": mem.available,
                       "pressure_pct": mem.pressure, "cgroup_limit_bytes": mem.cgroup_limit,
                       "park_budget_bytes": app.engine.snapshot.park_budget},
            "thermal": {"throttled": heat.throttled, "zones_c": dict(heat.zones)}}


async def system_prompts(app: App, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"name": k, "text": v} for k, v in app.system_prompts.items()]})


def models_list(model_id: str, created: int | None = None) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": model_id, "object": "model", "created": created or int(time.time()), "owned_by": "appliance"}]}


def _listed(app: App) -> dict[str, Any]:
    body = models_list(app.model_id, app.created)
    # The context one request may use (prompt + answer), named as llama-server (meta.n_ctx)
    # and vLLM (max_model_len) report it: clients size their prompts by it.
    ctx = app.bounds.ctx_limit
    body["data"][0].update(max_model_len=ctx, meta={"n_ctx": ctx, "n_vocab": app.engine.n_vocab or None})
    return body


async def models(app: App, request: Request) -> Response:
    return JSONResponse(_listed(app))


async def model(app: App, request: Request) -> Response:
    """GET /v1/models/{id}: the one model, by the id /v1/models lists (OpenAI's retrieve)."""
    (body,) = _listed(app)["data"]
    if request.path_params["model"] != body["id"]:
        raise NotFound(f"the model {request.path_params['model']!r} does not exist; this server has {body['id']!r}",
                       param="model", code="model_not_found")
    return JSONResponse(body)


async def session(app: App, request: Request) -> Response:
    # One route for both methods, so a 405 lists both in Allow.
    sid = request.path_params["sid"]
    if not valid_session_id(sid):
        raise NotFound("no such session (it may have expired)")
    # What the engine calls the session: a digest of the caller's key and the id.
    name = session_name(caller_of(request.scope["state"]).namespace, sid)
    if request.method == "DELETE":
        if not await app.engine.delete_session(name):
            raise NotFound("no such session (it may have expired)")
        return Response(status_code=204)
    info = app.engine.session_info(name)
    if info is None:
        raise NotFound("no such session (it may have expired)")
    return JSONResponse({**info, "id": sid})


async def steps(app: App, request: Request) -> Response:
    """Recent decode steps as [decode seqs, prefill seqs, prefill tokens, draft tokens],
    oldest first: shows how prefill chunks, drafts and decode tokens share each step."""
    return JSONResponse({"steps": [list(x) for x in app.engine.snapshot.step_log]})


async def prometheus(app: App, request: Request) -> Response:
    if app.metrics is None:
        raise NotFound("metrics are off")
    return Response(generate_latest(app.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def index(app: App, request: Request) -> Response:
    return FileResponse(app.web_dir / "index.html")
