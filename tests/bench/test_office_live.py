"""The office workload as a short functional test against the real appliance on the bundled
model (speed is measured in benchmarks, not here): three users on their own addresses in
seeded multi-turn conversations for a few seconds, every turn answered, the engine's time
breakdown read back from /metrics, and the office system prompt the users share made public
once two of them sent it (engine/kv/commons.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.live import Live, live_server

from appliance import bench

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def live(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_server(tmp_path_factory.mktemp("office"), model=bundled_model, slots=4, kv_tokens=8192) as s:
        yield s


def test_a_short_office_run_is_answered_and_shows_where_the_engine_time_went(live: Live, tmp_path: Path) -> None:
    out = tmp_path / "office.json"
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--url", live.url, "--workload", "office", "--concurrency", "3", "--duration-s", "6",
                              "--think-s", "0.3", "--doc-share", "1/3", "--doc-tokens", "120", "--max-tokens", "12",
                              "--no-session-id", "--quiet", "--json", str(out)])
    assert bench.run(args) == 0
    (level,) = json.loads(out.read_text())["levels"]
    s = level["results"]["appliance"]
    assert s["completed"] == s["requests"] >= 3 and s["rejected"] == s["failed"] == 0
    assert s["users_answered"] == 3 and s["turn1_ttft_ms_p50"] is not None
    e = s["engine"]
    assert e is not None and e["steps"] > 0 and e["decode_rows"] > 0 and e["prefill_rows"] > 0
    assert e["generated"] == s["completion_tokens"]  # nobody else used the engine meanwhile
    assert 0 < e["decode_share"] < 1 and e["rows_per_step"] >= 1
    # Three addresses sent the office tool's system prompt: it became public on the second.
    assert e["promoted"] == 1
    health = live.health()
    assert health["engine"]["generated_tokens"] >= e["generated"]
