"""The server's memory for the soak workload, from Linux /proc: the pid listening on a
loopback port and its VmRSS."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from appliance.bench.target import base_url, is_loopback


def listening_pid(port: int) -> int | None:
    """The process listening on TCP `port` of this host (Linux /proc), lowest pid first; None
    when there is none or it cannot be seen (another user's process, another namespace)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            # local_address is HEX_IP:HEX_PORT, state 0A is LISTEN, field 9 the socket inode.
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    pids = sorted(int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue  # gone, or not ours to look at
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    return pid
            except OSError:
                continue  # this fd closed since the listing; the process's other fds still count
    return None


def rss_mib(pid: int) -> float | None:
    """VmRSS of `pid` in MiB, None when the process is gone or unreadable."""
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmRSS:"):
                return round(int(row.split()[1]) / 1024.0, 1)  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def server_pid(url: str, pid: int | None = None) -> int | None:
    """The pid to sample for `url`: the one given, else whoever listens on its loopback port."""
    if pid is not None:
        return pid
    if not is_loopback(url):
        return None
    u = httpx.URL(base_url(url))
    return listening_pid(u.port or (443 if u.scheme == "https" else 80))
