"""systemd's notify protocol without libsystemd: READY=1 once the model is loaded, watchdog
pings while the engine makes progress, STOPPING=1 when draining.

A message is one datagram of "KEY=value" lines to the AF_UNIX socket named by
NOTIFY_SOCKET (a path, or with a leading '@' a name in the abstract namespace). The
watchdog interval comes in WATCHDOG_USEC; WATCHDOG_PID, when set, names the process it is
meant for. Without NOTIFY_SOCKET (not under systemd, or Type=simple) sending does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping

from appliance.workers import Worker

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, address: str = "", watchdog_s: float = 0.0) -> None:
        self.address = address
        self.watchdog_s = watchdog_s  # systemd's WatchdogSec; 0 = no watchdog
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._failed = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, pid: int | None = None) -> Notifier:
        address = environ.get("NOTIFY_SOCKET", "")
        watchdog_s = 0.0
        usec = environ.get("WATCHDOG_USEC", "")
        meant_for = environ.get("WATCHDOG_PID", "")
        if usec.isdigit() and (not meant_for or meant_for == str(pid if pid is not None else os.getpid())):
            watchdog_s = int(usec) / 1e6
        return cls(address, watchdog_s)

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        """Send one message; False when there is nowhere to send or it failed (logged once)."""
        if not self.address:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto("\n".join(fields).encode(), target)
                return True
            except OSError as e:
                if not self._failed:
                    log.warning("cannot notify systemd at %s: %s", self.address, e)
                    self._failed = True
                return False

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class Watchdog(Worker[None]):
    """Says READY=1 once `ready()` holds, then pings systemd's watchdog for as long as
    `alive()` holds: the engine loop made progress within its stall limit. A decode that
    hangs stops the pings, and systemd kills and restarts the service WatchdogSec later.
    `alive()` returning None means the engine stopped on purpose (SIGTERM): the pings end
    with an info line, not an error (the engine stops a moment before the watchdog does).

    `ready()` returns None while starting, True once serving, False if start-up failed
    (then nothing is sent: the process exits non-zero and systemd sees the failure).
    `status()` is shown by `systemctl status` (STATUS=).
    """

    READY_POLL_S = 0.05

    def __init__(self, notifier: Notifier, ready: Callable[[], bool | None], alive: Callable[[], bool | None],
                 status: Callable[[], str] = lambda: "") -> None:
        super().__init__("watchdog", every=self.READY_POLL_S)
        self.notifier = notifier
        self.ready = ready
        self.alive = alive
        self.status = status
        # systemd suggests pinging at half the interval; a quarter leaves room for a late
        # wake-up on a busy machine. At most 1 s apart, so a stall (and the STATUS= line)
        # shows promptly; a datagram a second costs nothing.
        self.tick_s = min(1.0, notifier.watchdog_s / 4) if notifier.watchdog_s else 1.0
        self.pings = 0
        self._ready_sent = False
        self._stalled = False
        self._shown = ""

    def stop(self, timeout: float | None = 5) -> None:
        super().stop(timeout)

    def begin(self) -> None:
        self._ready_sent = False

    def tick(self) -> bool:
        if not self._ready_sent:
            return self._wait_ready()
        if (live := self.alive()) is None:
            log.info("engine stopped; watchdog pings end")
            return False
        if live:
            self._progress()
        elif not self._stalled:
            self._stalled = True
            text = self.status()
            log.error("%s; watchdog pings stopped%s", text,
                      f" (systemd restarts the service within {self.notifier.watchdog_s:g} s)"
                      if self.notifier.watchdog_s else "")
            self.notifier.send(f"STATUS={text}")
            self._shown = text
        return True

    def _wait_ready(self) -> bool:
        """READY=1 once ready() holds (None: not yet; False: start-up failed, send nothing)."""
        if (ok := self.ready()) is None:
            return True
        if not ok:
            return False
        self._shown = self.status()
        self.notifier.send("READY=1", f"STATUS={self._shown}")
        log.info("ready%s", f" (systemd watchdog {self.notifier.watchdog_s:g} s)" if self.notifier.watchdog_s else "")
        self._ready_sent, self.every = True, self.tick_s
        return True

    def _progress(self) -> None:
        if self._stalled:
            self._stalled = False
            log.warning("engine making progress again; watchdog pings resume")
        text = self.status()
        fields = [f"STATUS={text}"] if text != self._shown else []
        self._shown = text
        if self.notifier.watchdog_s:
            fields.insert(0, "WATCHDOG=1")
            self.pings += 1
        if fields:
            self.notifier.send(*fields)
