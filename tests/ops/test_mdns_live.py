"""Found by name, for real: `appliance serve` with mdns on, in a network namespace of its own
(only `lo`, multicast routed on it: no packet leaves the machine), and a resolver in that
namespace that finds the box by an mDNS query (python-zeroconf's client, as a phone's
resolver asks), then opens the chat page's health by the name's address and port."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.live import live_server
from helpers.polling import wait_until

pytestmark = pytest.mark.integration

# The namespace's loopback with multicast: mDNS's 224.0.0.251 routed on it.
NETNS = ("unshare", "-n", "sh", "-c", 'ip link set lo up && ip link set lo multicast on && '
         'ip route add 224.0.0.0/4 dev lo && exec "$@"', "netns")

# Runs in the server's namespace: an A query for NAME.local, then the service's SRV and TXT
# records by a DNS-SD query, then GET /health by what was found; prints one JSON line.
RESOLVE = r"""
import json, sys, time, httpx
from zeroconf import AddressResolver, ServiceBrowser, ServiceInfo, Zeroconf
name, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
zc = Zeroconf(interfaces=["127.0.0.1"])
found, seen = [], []
ServiceBrowser(zc, "_http._tcp.local.", handlers=[lambda zeroconf, service_type, name, state_change: seen.append(name)])
while not found and time.monotonic() < deadline:
    r = AddressResolver(f"{name}.local.")
    found = r.parsed_addresses() if r.request(zc, 1000) else []
while not seen and time.monotonic() < deadline:
    time.sleep(0.1)
info = ServiceInfo("_http._tcp.local.", seen[0]) if seen else None
ok = info is not None and info.request(zc, 3000)
zc.close()
port = info.port if ok else None
r = httpx.get(f"http://{found[0]}:{port}/health", headers={"host": f"{name}.local:{port}"}, trust_env=False) \
    if found and ok else None
print(json.dumps({"addresses": found, "services": seen, "port": port, "server": info.server if ok else None,
                  "txt": {k.decode(): v.decode() for k, v in info.properties.items()} if ok else None,
                  "health": r.status_code if r is not None else None}))
"""


def resolve(pid: int, name: str, timeout_s: float) -> dict[str, object]:
    """The resolver above, run in process `pid`'s network namespace."""
    out = subprocess.run(["nsenter", "-t", str(pid), "-n", sys.executable, "-c", RESOLVE, name, str(timeout_s)],
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_box_is_found_by_its_name_on_its_own_network(tmp_path: Path, bundled_model: Path) -> None:
    with live_server(tmp_path, model=bundled_model, prefix=NETNS, ready=False, mdns="on",
                     box_name="officebox") as live:
        got = resolve(live.proc.pid, "officebox", 120)
        assert got["addresses"] == ["127.0.0.1"], (got, live.log()[-2000:])
        assert got["services"] == ["Office chat (officebox)._http._tcp.local."]
        assert got["port"] == live.port and got["server"] == "officebox.local." and got["txt"] == {"path": "/"}
        # Opened by its name: the host guard lets the announced name in (200 loaded, 503 still loading).
        assert got["health"] in (200, 503), got
        # The journal's line follows the announcement, which a resolver may see first: waited for.
        wait_until(lambda: "mDNS: announced officebox.local (127.0.0.1)" in live.log(), 60,
                   "the announcement's journal line", every=0.2, seen=lambda: live.log()[-1000:])
