"""`appliance bench` against a server in people mode: its users sign in first (one person each,
added through /admin/people, invite taken from the user's own address) and every request
carries that person's cookie and CSRF token, as the page's do."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers.fakes import FakeModel
from helpers.inprocess import Served

from appliance import bench
from appliance.http.people import People
from appliance.people.db import Database
from appliance.people.passwords import Hasher


def test_the_bench_signs_its_users_in_on_a_people_mode_server(tmp_path: Path) -> None:
    people = People(Database(tmp_path / "state"), hasher=Hasher(n=2**10))
    prompts, follow_ups = bench.PROMPT_SETS["chat"]
    workload = bench.Workload(model="fake-model", max_tokens=8, prompts=prompts, follow_ups=follow_ups)
    with Served(lambda: FakeModel(reply="hello"), people=people) as server:
        level = asyncio.run(bench.measure(server.url, 3, 6, workload, timeout=10))
        again = asyncio.run(bench.measure(server.url, 2, 2, workload, timeout=10))  # the same people again
    assert len(level.results) == 6 and all(r.ok for r in level.results + again.results)
    assert people.accounts is not None
    rows = people.accounts.people()
    assert len(rows) == 3 and all(a.name.startswith("bench-") and n["sessions"] == 1 for a, n in rows)


def test_open_mode_gets_no_sign_in(tmp_path: Path) -> None:
    prompts, follow_ups = bench.PROMPT_SETS["chat"]
    workload = bench.Workload(model="fake-model", max_tokens=8, prompts=prompts, follow_ups=follow_ups)
    with Served(lambda: FakeModel(reply="hello")) as server:
        level = asyncio.run(bench.measure(server.url, 2, 2, workload, timeout=10))
    assert all(r.ok for r in level.results)
