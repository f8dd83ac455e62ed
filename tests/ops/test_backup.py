"""`appliance backup` and `appliance restore` without a server: the state directory a box
leaves (the 73cc82a fixture), copied through SQLite's backup API with a manifest; restored
whole; refused when damaged, newer, or aimed at a directory that holds something."""

from __future__ import annotations

import json
import shutil
import sqlite3
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from appliance import __version__
from appliance.cli import main
from appliance.ops import backup, restore
from appliance.ops.restore import Refused

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "state-73cc82a"
WHEN = datetime(2026, 12, 6, 15, 30, tzinfo=UTC)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The fixture's state, a keys file and a cache file beside the databases."""
    state = tmp_path / "state"
    shutil.copytree(FIXTURE, state)
    (state / "0123abcd.kv").write_bytes(b"a saved KV session: a cache")
    return state


def plan(state: Path, tmp_path: Path) -> backup.Plan:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-secret ann\n")
    config = tmp_path / "appliance.toml"
    config.write_text('auth = "people"\n')
    return backup.Plan(state, config, keys)


def test_a_backup_holds_every_file_with_its_hash_and_the_schema_versions(state: Path, tmp_path: Path) -> None:
    made = backup.make(plan(state, tmp_path), tmp_path / "backups", now=lambda: WHEN)
    assert made.name == "appliance-backup-20261206T153000Z"
    manifest = json.loads((made / "manifest.json").read_text())
    assert manifest["app_version"] == __version__ and manifest["created_at"] == WHEN.isoformat()
    assert manifest["schemas"] == {"people": 1, "usage": 1, "library": 2}  # as 73cc82a wrote them
    paths = {f["path"] for f in manifest["files"]}
    assert paths == {"state/people.sqlite3", "state/usage.sqlite3", "state/library.sqlite3",
                     "etc/config-appliance.toml", "etc/keys-keys.txt"}  # no KV cache file
    for f in manifest["files"]:
        assert backup.sha256(made / f["path"]) == f["sha256"] and (made / f["path"]).stat().st_size == f["size"]
        assert stat.S_IMODE((made / f["path"]).stat().st_mode) == 0o600
    with sqlite3.connect(made / "state" / "people.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 8
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one file: no -wal to forget


def test_a_backup_of_a_database_being_written_is_a_consistent_one(tmp_path: Path) -> None:
    # A commit still in the -wal file (a writer holding it open, never checkpointed) is in the copy.
    state = tmp_path / "state"
    state.mkdir()
    live = sqlite3.connect(state / "usage.sqlite3", isolation_level=None)
    live.execute("PRAGMA journal_mode = WAL")
    live.execute("PRAGMA wal_autocheckpoint = 0")
    live.execute("CREATE TABLE usage (day TEXT, who TEXT)")
    live.execute("INSERT INTO usage VALUES ('2026-12-06', 'Ann')")
    assert (state / "usage.sqlite3-wal").stat().st_size > 0
    made = backup.make(backup.Plan(state, None, None), tmp_path / "b")
    live.close()
    with sqlite3.connect(made / "state" / "usage.sqlite3") as db:
        assert db.execute("SELECT who FROM usage").fetchall() == [("Ann",)]


def test_restore_puts_back_every_file_private(state: Path, tmp_path: Path) -> None:
    made = backup.make(plan(state, tmp_path), tmp_path / "backups")
    target, etc = tmp_path / "new" / "state", tmp_path / "etc"
    lines = restore.restore(made, target, etc=etc)
    assert len(lines) == 5
    for name in ("people.sqlite3", "usage.sqlite3", "library.sqlite3"):
        assert stat.S_IMODE((target / name).stat().st_mode) == 0o600
        with sqlite3.connect(target / name) as a, sqlite3.connect(state / name) as b:
            query = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            tables = [t for (t,) in a.execute(query)]
            assert tables == [t for (t,) in b.execute(query)]
            for t in tables:
                if not t.startswith(("terms_", "exact_")):  # FTS5's own tables: their shadows are compared
                    assert sorted(a.execute(f"SELECT * FROM {t}")) == sorted(b.execute(f"SELECT * FROM {t}")), t
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert (etc / "keys.txt").read_text() == "sk-secret ann\n" and stat.S_IMODE((etc / "keys.txt").stat().st_mode) == 0o600
    assert (etc / "appliance.toml").read_text() == 'auth = "people"\n'


def test_restore_refuses_a_damaged_file(state: Path, tmp_path: Path) -> None:
    made = backup.make(backup.Plan(state, None, None), tmp_path / "b")
    with open(made / "state" / "people.sqlite3", "r+b") as f:
        f.seek(4096)
        f.write(b"\xff")
    with pytest.raises(Refused, match="SHA-256"):
        restore.restore(made, tmp_path / "new")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("change", [{"schemas": {"people": backup.known_versions()["people"] + 1}},
                                    {"app_version": "99.0.0"}])
def test_restore_refuses_a_backup_from_a_newer_version(state: Path, tmp_path: Path, change: dict[str, object]) -> None:
    made = backup.make(backup.Plan(state, None, None), tmp_path / "b")
    manifest = json.loads((made / "manifest.json").read_text())
    (made / "manifest.json").write_text(json.dumps({**manifest, **change}))
    with pytest.raises(Refused, match="newer"):
        restore.restore(made, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_restore_refuses_a_state_directory_that_holds_something_unless_forced(state: Path, tmp_path: Path) -> None:
    made = backup.make(backup.Plan(state, None, None), tmp_path / "b")
    target = tmp_path / "target"
    target.mkdir()
    (target / "people.sqlite3").write_bytes(b"someone's live database")
    (target / "people.sqlite3-wal").write_bytes(b"its journal")
    with pytest.raises(Refused, match="not empty"):
        restore.restore(made, target)
    assert (target / "people.sqlite3").read_bytes() == b"someone's live database"
    restore.restore(made, target, force=True)
    assert backup.sha256(target / "people.sqlite3") == backup.sha256(made / "state" / "people.sqlite3")
    assert not (target / "people.sqlite3-wal").exists()  # an old journal is never read as the new file's


def test_restore_refuses_a_manifest_naming_a_file_outside_the_backup(state: Path, tmp_path: Path) -> None:
    made = backup.make(backup.Plan(state, None, None), tmp_path / "b")
    manifest = json.loads((made / "manifest.json").read_text())
    manifest["files"][0]["path"] = "state/../../../etc/passwd"
    (made / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Refused, match="outside"):
        restore.restore(made, tmp_path / "new")


def test_the_newest_backups_are_kept(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    made = [backup.make(backup.Plan(state, None, None), tmp_path / "b", now=lambda d=d: datetime(2026, 12, d, tzinfo=UTC))
            for d in (1, 2, 3, 4)]
    (tmp_path / "b" / "notes").mkdir()  # not a backup: never removed
    assert backup.prune(tmp_path / "b", 2) == made[:2]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted([made[2].name, made[3].name, "notes"])
    assert backup.prune(tmp_path / "b", 0) == []


def test_the_commands(state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backup", "--state-dir", str(state), "--to", str(tmp_path / "b"), "--backup-keep", "1"]) == 0
    out = capsys.readouterr().out
    made = Path(out.splitlines()[0].split(": ", 1)[1])
    assert "state/people.sqlite3" in out and made.parent == tmp_path / "b"
    assert main(["restore", str(made), "--state-dir", str(tmp_path / "new")]) == 0
    assert main(["restore", str(made), "--state-dir", str(tmp_path / "new")]) == 1
    assert "not empty" in capsys.readouterr().err


def test_with_postgresql_the_backup_says_what_to_run(state: Path, tmp_path: Path) -> None:
    # The database's password never reaches the output or the manifest (~/.pgpass holds it).
    url = "postgresql://appliance:hunter2@db.office/appliance"
    made = backup.make(backup.Plan(state, None, None, url), tmp_path / "b")
    manifest = (made / "manifest.json").read_text()
    assert "pg_dump --format=custom" in manifest and "hunter2" not in manifest
    line = backup.pg_dump_line(url, made)
    assert line == f"pg_dump --format=custom --file={made}/postgres.dump 'postgresql://appliance@db.office/appliance'"


def test_backups_kept_inside_the_state_directory_are_not_backed_up_again(state: Path) -> None:
    first = backup.make(backup.Plan(state, None, None), state / "backups")
    second = backup.make(backup.Plan(state, None, None), state / "backups")
    paths = [f["path"] for f in json.loads((second / "manifest.json").read_text())["files"]]
    assert sorted(paths) == ["state/library.sqlite3", "state/people.sqlite3", "state/usage.sqlite3"], paths
    assert first != second
