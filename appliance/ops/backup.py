"""`appliance backup [--to DIR]`: a consistent copy of everything the box keeps, made while it
serves (docs/OPERATING.md, "Backups, restore and upgrades").

A backup is a directory `appliance-backup-<UTC time>` (not a tar): it is restored or read
with nothing but `cp` and `sqlite3`, rsync sends only what changed, and keeping the newest N
is removing directories. It is written under a `.partial` name and renamed when complete, so
a directory by the final name is a whole backup. Inside:

- `state/`: the state directory's files. Each SQLite file (people, chats, usage, the library
  and its index) through SQLite's online backup API (store/snapshot.py), never a file copy
  of a live database; any other file as it is. KV session files are a cache and left out.
- `etc/`: the config file and the API keys file, when there are such.
- `manifest.json`: the app's version, each owner's schema version, every file with its size
  and SHA-256, when it was made; with database_url, the pg_dump to run (people, chats, keys
  and usage are in PostgreSQL then, which only its own tools copy consistently).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from appliance import __version__
from appliance.config import SYSTEM_CONFIG, Config
from appliance.library import store as library_store
from appliance.people import db as people_db
from appliance.people.schema import PEOPLE
from appliance.store.migrations import Migrations
from appliance.store.snapshot import copy_sqlite
from appliance.usage import store as usage_store

FORMAT = 1
MANIFEST = "manifest.json"
PREFIX = "appliance-backup-"
PARTIAL = ".partial"
# Each owner's file and migrations: what a schema version in a manifest is measured against.
OWNERS: dict[str, Migrations] = {people_db.FILE_NAME: PEOPLE, usage_store.FILE_NAME: usage_store.USAGE,
                                 library_store.FILE_NAME: library_store.MIGRATIONS}
SKIPPED = (".kv", ".tmp", "-wal", "-shm", "-journal")  # KV sessions (a cache) and SQLite's side files


def known_versions() -> dict[str, int]:
    """The schema version this code migrates each owner to."""
    return {m.owner: len(m.steps) for m in OWNERS.values()}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Plan:
    """What one backup copies: the state directory, the config and keys files (None: none)."""

    state_dir: Path | None
    config_file: Path | None
    keys_file: Path | None
    database_url: str = ""
    files: list[dict[str, Any]] = field(default_factory=list)
    schemas: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: Config, config_file: str | None) -> Plan:
        conf = Path(config_file) if config_file else (SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None)
        return cls(Path(cfg.state_dir).resolve() if cfg.state_dir else None, conf,
                   Path(cfg.api_keys_file) if cfg.api_keys_file else None, cfg.database_url)


def pg_dump_line(database_url: str, where: Path) -> str:
    """The command that backs up the PostgreSQL database: the URL without its password, which
    pg_dump reads from ~/.pgpass or PGPASSWORD (never printed, never in a manifest)."""
    url = urlsplit(database_url)
    if url.password is not None:
        url = url._replace(netloc=f"{url.username}@{url.netloc.rsplit('@', 1)[1]}")
    return f"pg_dump --format=custom --file={where / 'postgres.dump'} '{urlunsplit(url)}'"


def _state_files(state_dir: Path, skip: Path) -> list[Path]:
    """The state directory's files to keep, by their path under it (symlinks never followed),
    but none under `skip` (backups written inside it are not backed up again)."""
    found: list[Path] = []
    for root, dirs, names in os.walk(state_dir):
        dirs[:] = sorted(d for d in dirs if (Path(root) / d).resolve() != skip)
        for name in sorted(names):
            path = Path(root) / name
            if not name.endswith(SKIPPED) and path.is_file() and not path.is_symlink():
                found.append(path.relative_to(state_dir))
    return found


def _copy_state(plan: Plan, into: Path) -> None:
    assert plan.state_dir is not None
    for rel in _state_files(plan.state_dir, into.parent.resolve()):
        dst = into / "state" / rel
        dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if rel.suffix == ".sqlite3":
            version = copy_sqlite(plan.state_dir / rel, dst)
            if str(rel) in OWNERS:
                plan.schemas[OWNERS[str(rel)].owner] = version
        else:
            shutil.copyfile(plan.state_dir / rel, dst)
        _listed(plan, into, dst)


def _listed(plan: Plan, into: Path, dst: Path) -> None:
    dst.chmod(0o600)
    plan.files.append({"path": str(dst.relative_to(into)), "size": dst.stat().st_size, "sha256": sha256(dst)})


def _copy_etc(plan: Plan, into: Path) -> None:
    for kind, src in (("config", plan.config_file), ("keys", plan.keys_file)):
        if src is not None and src.is_file():
            (into / "etc").mkdir(mode=0o700, exist_ok=True)
            dst = into / "etc" / f"{kind}-{src.name}"
            shutil.copyfile(src, dst)
            _listed(plan, into, dst)


def _fresh_dir(parent: Path, now: datetime) -> Path:
    """A new directory for the backup, under its in-progress name."""
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    for n in range(100):  # two backups in one second: -1, -2, ...
        name = PREFIX + stamp + (f"-{n}" if n else "")
        if not (parent / name).exists():
            try:
                (parent / (name + PARTIAL)).mkdir(mode=0o700)
                return parent / (name + PARTIAL)
            except FileExistsError:
                continue
    raise FileExistsError(f"no free backup name in {parent}")


def make(plan: Plan, parent: Path, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> Path:
    """Write one backup under `parent`; its directory."""
    started = now()
    work = _fresh_dir(parent, started)
    try:
        if plan.state_dir is not None and plan.state_dir.is_dir():
            _copy_state(plan, work)
        _copy_etc(plan, work)
        manifest = {"format": FORMAT, "app_version": __version__, "created_at": started.isoformat(),
                    "state_dir": str(plan.state_dir or ""), "schemas": plan.schemas, "files": plan.files,
                    "config_file": str(plan.config_file or ""), "keys_file": str(plan.keys_file or "")}
        final = work.with_name(work.name.removesuffix(PARTIAL))
        if plan.database_url:
            manifest["postgres"] = {"not_included": pg_dump_line(plan.database_url, final)}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        (work / MANIFEST).chmod(0o600)
        work.rename(final)
        return final
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def prune(parent: Path, keep: int) -> list[Path]:
    """Remove the oldest whole backups in `parent` beyond the newest `keep` (0: keep all); the
    ones removed. Only directories by our name with a manifest count: nothing else is touched."""
    if keep <= 0:
        return []
    ours = sorted(p for p in parent.iterdir() if p.name.startswith(PREFIX) and not p.name.endswith(PARTIAL)
                  and (p / MANIFEST).is_file())
    gone = ours[:-keep]
    for p in gone:
        shutil.rmtree(p)
    return gone


def run(cfg: Config, config_file: str | None, to: str | None) -> tuple[int, str]:
    """`appliance backup`: the exit code and what to print."""
    parent = Path(to or cfg.backup_dir)
    plan = Plan.of(cfg, config_file)
    where = make(plan, parent)
    lines = [f"backup written: {where}"]
    lines += [f"  {f['path']}  {f['size']:,} bytes" for f in plan.files]
    if plan.database_url:
        lines += ["people, chats, keys and usage are in PostgreSQL (database_url): back them up with",
                  f"  {pg_dump_line(plan.database_url, where)}"]
    lines += [f"removed an old backup (backup_keep = {cfg.backup_keep}): {p}" for p in prune(parent, cfg.backup_keep)]
    return 0, "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", metavar="DIR", default=None,
                   help="write the backup under DIR (default: backup_dir); the newest backup_keep there are kept")
