"""Debian's PostgreSQL, started by the tests themselves: a throwaway cluster on a free port
(initdb, pg_ctl), run as the `postgres` user when the tests run as root (PostgreSQL refuses
root). The README's test command installs the package (scripts/setup.sh)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.live import free_port

INSTALL = "sudo apt-get install -y postgresql"


def pg_bin() -> Path | None:
    """The newest installed server's bin directory (Debian: /usr/lib/postgresql/NN/bin)."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _as_owner(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


@contextmanager
def cluster() -> Iterator[str]:
    """A running PostgreSQL with an empty database `appliance`; yields its URL."""
    bin_dir = pg_bin()
    if bin_dir is None:
        raise RuntimeError(f"no PostgreSQL server: install it with  {INSTALL}")
    # Not under pytest's tmp_path: its root is 0700 root's, which the postgres user cannot enter.
    root = Path(tempfile.mkdtemp(prefix="appliance-pg-"))
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    data, port = root / "data", free_port()
    log = root / "server.log"
    try:
        subprocess.run(_as_owner([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "appliance",
                                  "--no-sync", "-E", "UTF8"]), check=True, capture_output=True)
        subprocess.run(_as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-o",
                                  f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"]),
                       check=True, capture_output=True)
        subprocess.run(_as_owner([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "appliance",
                                  "appliance"]), check=True, capture_output=True)
        yield f"postgresql://appliance@127.0.0.1:{port}/appliance"
    finally:
        subprocess.run(_as_owner([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """A new empty database beside `url`'s; its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name
