"""The app's lifespan (http/lifecycle.py): the services start in order and stop in reverse,
and what the app owns (the people store, its hash thread) is closed when it stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers.fakes import FakeModel
from helpers.inprocess import MODEL_ID, is_ready, wait_health
from starlette.testclient import TestClient

from appliance.engine.engine import Engine, EngineOptions
from appliance.engine.kv.store import CachePolicy
from appliance.engine.scheduler import Limits
from appliance.http.accounting import Accounting
from appliance.http.app import create_app
from appliance.http.people import People
from appliance.http.state import App
from appliance.http.validate import RequestBounds
from appliance.people.db import Database
from appliance.people.passwords import Hasher
from appliance.usage.ledger import Ledger
from appliance.workers import Worker


def app_owning(people: People, usage: Accounting) -> App:
    limits = Limits(slots=1, batch_tokens=64, kv_tokens=4096, ctx_limit=512, max_wait_s=0.0, max_queue=4)
    engine = Engine(lambda: FakeModel(reply="hello"), EngineOptions(limits, CachePolicy(n_seq=4)))
    return App(engine, MODEL_ID, RequestBounds(default_max_tokens=8, max_tokens_limit=64, ctx_limit=512),
               usage=usage, people=people, store=people)


def test_the_people_store_and_the_hash_thread_close_when_the_app_stops(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    db = Database(tmp_path / "state")
    people = People(db, retention_days=30, hasher=Hasher(n=2**10))
    usage = Accounting(Ledger(tmp_path / "state"))
    stopped: list[str] = []
    for name, obj in (("store", db), ("usage", usage.ledger)):
        close = obj.close
        monkeypatch.setattr(obj, "close", lambda name=name, close=close: (stopped.append(name), close())[1])
    with TestClient(create_app(app_owning(people, usage)), base_url="http://localhost",
                    client=("127.0.0.1", 50000)) as client:
        wait_health(client.get, is_ready)
        assert client.portal is not None
        assert client.portal.call(people.hash_worker.run, lambda: 1) == 1  # serving: the hash thread takes work
        people.prune_due(now=0.0)  # chat retention's thread starts with its first prune
        assert people.pruner.health().alive and stopped == []
    assert stopped == ["usage", "store"]  # the usage writer (it may write to the store) first
    with pytest.raises(RuntimeError):
        asyncio.run(people.hashing().run(lambda: 1))  # shut down
    assert not people.pruner.health().alive


def test_a_people_store_the_app_was_lent_stays_open(tmp_path: Path) -> None:
    people = People(Database(tmp_path / "state"), hasher=Hasher(n=2**10))
    app = app_owning(people, Accounting())
    app.store = None  # as tests that share one People between apps build theirs
    with TestClient(create_app(app), base_url="http://localhost", client=("127.0.0.1", 50000)) as client:
        wait_health(client.get, is_ready)
    assert asyncio.run(people.hashing().run(lambda: 2)) == 2
    assert people.accounts is not None and people.accounts.add("Ann")


class Quiet(Worker[None]):
    """An announcer that announces nothing: what the lifespan does with one."""

    def __init__(self) -> None:
        super().__init__("mdns")
        self.state = "announced"


def test_the_announcer_starts_with_the_app_and_stops_with_it(tmp_path: Path) -> None:
    app = app_owning(People(Database(tmp_path / "state"), hasher=Hasher(n=2**10)), Accounting())
    app.announcer = announcer = Quiet()
    with TestClient(create_app(app), base_url="http://localhost", client=("127.0.0.1", 50000)) as client:
        wait_health(client.get, is_ready)
        now = client.get("/admin/status").json()
        assert now["now"]["box"] == {"name": "appliance.local", "url": "http://appliance.local:8080/",
                                     "mdns": "announced"}
        assert {"name": "mdns", "alive": True, "depth": 0} in now["workers"]
    assert announcer.started and not announcer.health().alive
