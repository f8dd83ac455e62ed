"""The app over the fake model, in-process: a TestClient (or uvicorn on a real socket, for
tests that act mid-stream), playing several users, with the checks every HTTP test shares
(health polling, SSE events, error bodies) and the fill-in-the-middle tokenizer.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from appliance.bench import sse, user_address
from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.http.app import create_app
from appliance.http.guard import GuardPolicy
from appliance.http.identity import parse_networks
from appliance.http.keys import KeyRing
from appliance.http.metrics import Metrics
from appliance.http.people import People
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from helpers.fakes import FakeModel, FakeTokenizer
from helpers.polling import wait_until

MODEL_ID = "fake-model"
REPLY = "hello"
CTX = 512  # tokens = characters with the fake tokenizer
USER = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"


# -- fixtures ------------------------------------------------------------------------------
def as_users(app: ASGIApp) -> ASGIApp:
    """TestClient sends every request from one address; the `x-test-client` header picks
    another, so a test can play several users (the server tells clients apart by address)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"x-test-client")
            if host:
                scope = {**scope, "client": (host.decode(), 50000)}
        await app(scope, receive, send)

    return wrapped


def user(i: int) -> dict[str, str]:
    """Headers that make a TestClient request come from simulated user i."""
    return {"x-test-client": user_address(i)}


def build(factory: Callable[[], Any], *, slots: int = 2, max_queue: int = 8,
          queue_timeout_s: float = 30.0, metrics: bool = True, defaults: dict[str, Any] | None = None,
          keys: KeyRing | None = None, people: People | None = None, trusted: tuple[str, ...] = (),
          library: Any = None, embedder: Any = None, ctx: int = CTX) -> ASGIApp:
    limits = Limits(slots=slots, batch_tokens=64, kv_tokens=4096, ctx_limit=ctx, max_wait_s=0.0,
                    max_queue=max_queue, queue_timeout_s=queue_timeout_s)
    m = Metrics() if metrics else None
    engine = Engine(factory, EngineOptions(limits, CachePolicy(n_seq=slots + 4)))
    if m is not None:
        m.attach(engine)  # the engine's counters too, as serve.py does
    server_limits = RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=ctx, **(defaults or {}))
    guard = {"guard": GuardPolicy.build(keys or KeyRing(), parse_networks(trusted), people=people)} \
        if keys is not None or people or trusted else {}
    return as_users(create_app(App(engine, MODEL_ID, server_limits, web_dir=None, metrics=m, people=people,
                                   library=library, embedder=embedder, **guard)))


def wait_health(get: Callable[[str], httpx.Response], ok: Callable[[dict[str, Any]], bool],
                timeout: float = 5.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        body = dict(get("/health").json())
        return body if ok(body) else None

    return wait_until(check, timeout, "/health to say so", every=0.01)


def is_ready(h: dict[str, Any]) -> bool:
    return h["status"] == "ok"


def is_idle(h: dict[str, Any]) -> bool:
    return h["status"] == "ok" and h["slots"]["busy"] == 0 and h["queue"] == 0


@contextmanager
def serving(factory: Callable[[], Any] = lambda: FakeModel(reply=REPLY), *, ready: bool = True,
            **kw: Any) -> Iterator[TestClient]:
    # The lifespan starts the engine thread; the model loads in it.
    # From this machine (operator routes are open to it), to a host name it answers for.
    with TestClient(build(factory, **kw), base_url="http://localhost", client=("127.0.0.1", 50000)) as client:
        if ready:
            wait_health(client.get, is_ready)
        yield client


class Served:
    """The app behind uvicorn on 127.0.0.1, reached from a loopback address per user."""

    def __init__(self, factory: Callable[[], Any], **kw: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(build(factory, **kw), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.clients: list[httpx.Client] = []

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 5
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        self.health(is_ready)
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self.clients:
            c.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def user(self, i: int, timeout: float = 10.0) -> httpx.Client:
        transport = httpx.HTTPTransport(local_address=user_address(i))
        c = httpx.Client(base_url=self.url, timeout=timeout, trust_env=False, transport=transport)
        self.clients.append(c)
        return c

    def health(self, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        return wait_health(lambda path: httpx.get(self.url + path, trust_env=False), ok)


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-style error body of `r`, after checking its status and shape."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return dict(err)


def events_of(r: httpx.Response) -> list[sse.Event]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return list(sse.iter_events(sse.lines([r.text]), comments=True))


def dicts(events: list[sse.Event]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict)]


def chat(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post(CHAT, json={"messages": USER, **body})


def failing_after(n_ok: int, client: TestClient, model: FakeModel) -> None:
    """Make the fake fail its decode call after the next `n_ok` ones (counted from now, so
    whatever the engine decodes while starting up does not matter)."""
    wait_health(client.get, is_idle)
    model.fail_on_call = len(model.calls) + n_ok



PRE, SUF, MID = 0xE000, 0xE001, 0xE002  # the fake's fill-in-the-middle tokens
CONTROL, CTL = "<|ctl|>", 0xE010  # a control token's text, and its id when parsed


class FimTokenizer(FakeTokenizer):
    """The fake tokenizer with FIM tokens and one control token, parsed only when asked."""

    fim = (PRE, SUF, MID)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        if not parse_special:
            return [ord(c) for c in text]
        out: list[int] = []
        for i, part in enumerate(text.split(CONTROL)):
            out += [CTL] * bool(i) + [ord(c) for c in part]
        return out


def sent(client: TestClient, model: FakeModel, send: Any) -> tuple[httpx.Response, list[int]]:
    """The response to send() and the prompt tokens the engine decoded for it (one request
    from a user who has nothing cached)."""
    wait_health(client.get, is_idle)
    since = len(model.calls)
    r = send()
    assert r.status_code == 200, r.text
    body = r.json()
    # The prompt's length as OpenAI, llama-server and Ollama report it.
    n = body["usage"]["prompt_tokens"] if "usage" in body else body.get("tokens_evaluated", body.get("prompt_eval_count"))
    tokens = [t for call in model.calls[since:] for t in call[0]]
    return r, tokens[:n]
