"""Usage and refusals are each counted in one place (http/outcome.py): a request the engine
ran is recorded in usage exactly once, whole or streamed, one choice or several; a refusal,
whichever front-end or step refuses it, adds exactly one to /metrics' rejected requests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import CHAT, MODEL_ID, as_users, error_of, is_ready, wait_health
from starlette.testclient import TestClient

from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.events import Done
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.errors import ApplianceError
from appliance.http.accounting import Accounting
from appliance.http.app import create_app
from appliance.http.guard import Caller, GuardPolicy
from appliance.http.keys import KeyRing
from appliance.http.metrics import Metrics
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from appliance.usage.ledger import Ledger

HI = [{"role": "user", "content": "hi"}]


class Spy(Accounting):
    """Accounting that also lists what it was told, in order."""

    def __init__(self) -> None:
        super().__init__(Ledger(""))
        self.told: list[tuple[str, Any]] = []

    def ended(self, caller: Caller, ends: Sequence[Done], ttft_s: float | None) -> None:
        self.told.append(("ended", len(ends)))
        super().ended(caller, ends, ttft_s)

    def refused(self, caller: Caller, err: ApplianceError) -> None:
        self.told.append(("refused", err.code))
        super().refused(caller, err)


@pytest.fixture
def served() -> Iterator[tuple[TestClient, Spy]]:
    limits = Limits(slots=2, batch_tokens=64, kv_tokens=4096, ctx_limit=512, max_wait_s=0.0, max_queue=8)
    engine = Engine(lambda: FakeModel(reply="hello"), EngineOptions(limits, CachePolicy(n_seq=6)))
    metrics, spy = Metrics(), Spy()
    metrics.attach(engine)
    app = App(engine, MODEL_ID, RequestBounds(default_max_tokens=32, max_tokens_limit=256, ctx_limit=512),
              metrics=metrics, guard=GuardPolicy.build(KeyRing()), usage=spy)
    with TestClient(as_users(create_app(app)), base_url="http://localhost", client=("127.0.0.1", 50000)) as client:
        wait_health(client.get, is_ready)
        yield client, spy


def rejected(client: TestClient, reason: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'appliance_rejected_requests_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("n", [1, 2])
def test_a_request_is_recorded_in_usage_once(served: tuple[TestClient, Spy], stream: bool, n: int) -> None:
    client, spy = served
    r = client.post(CHAT, json={"messages": HI, "stream": stream, "n": n})
    assert r.status_code == 200
    r.read()
    assert spy.told == [("ended", n)]


@pytest.mark.parametrize(("path", "body", "code"), [
    ("/v1/completions", {"prompt": "x" * 2000}, "context_length_exceeded"),
    ("/completion", {"prompt": "x" * 2000}, "context_length_exceeded"),
    ("/api/generate", {"model": MODEL_ID, "prompt": "x" * 2000, "raw": True, "stream": False}, "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 2000}]}, "context_length_exceeded"),
])
def test_a_refusal_is_counted_once(served: tuple[TestClient, Spy], path: str, body: dict[str, Any],
                                   code: str) -> None:
    client, spy = served
    r = client.post(path, json=body)
    assert r.status_code == 400
    if not path.startswith("/api/"):  # Ollama's error shape carries no code
        assert error_of(r, 400)["code"] == code
    assert rejected(client, code) == 1.0
    assert len(spy.told) == 1 and spy.told[0][0] == "refused"  # told once (a client's 400 adds nothing to the ledger)


def test_a_document_refusal_is_counted_once(served: tuple[TestClient, Spy]) -> None:
    client, _ = served
    r = client.post("/v1/documents/text", content=b"x", headers={"content-type": "multipart/form-data; boundary=b"})
    assert error_of(r, r.status_code)["code"] == "unsupported_type"
    assert rejected(client, "unsupported_type") == 1.0
