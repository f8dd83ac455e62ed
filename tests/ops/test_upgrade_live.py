"""Upgrades keep everything: the state directory commit 73cc82a left (tests/fixtures/
make_state.py made it, in people mode) started on today's code loses nothing (every account,
chat and message, the share link, a person's key, the library's documents, the usage rows),
and each owner's tables are migrated to the version this code knows."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.live import Live
from helpers.office_state import check, usage_rows

from appliance.ops.backup import OWNERS, known_versions

pytestmark = pytest.mark.integration
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "state-73cc82a"


def test_a_state_directory_from_73cc82a_is_kept_whole(start_server: Callable[..., Live], tmp_path: Path) -> None:
    made = json.loads(FIXTURE.with_suffix(".json").read_text())
    state = tmp_path / "old-state"
    shutil.copytree(FIXTURE, state)
    # Usage rows older than usage_retention_days are pruned on start: the fixture's day must stay.
    box = start_server(auth="people", state_dir=state, usage_retention_days=36500)
    check(box, made)
    assert box.stop() == 0
    for file_name, migrations in OWNERS.items():
        with sqlite3.connect(state / file_name) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == known_versions()[migrations.owner]
    before, after = usage_rows(FIXTURE / "usage.sqlite3"), usage_rows(state / "usage.sqlite3")
    assert {r[1] for r in before} == set(made["usage"])
    for row, counts in before.items():  # today's chats may add to a row of the same day, never take away
        assert all(a >= b for a, b in zip(after[row], counts, strict=True)), (row, after[row], counts)
