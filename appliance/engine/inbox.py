"""The one way into the engine thread: typed commands in a queue under a condition
variable, and the one place that counts queued requests and each client's share.

The event loop puts commands; the engine thread takes them all at the top of each loop
iteration. Counting happens here, under the same lock, so `submit` can refuse a request
(429) before it is queued and nothing is counted twice.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from appliance.engine.turn import Turn
from appliance.errors import QueueFull, Unavailable


@dataclass(slots=True)
class Submit:
    turn: Turn


@dataclass(slots=True)
class Cancel:
    rid: int  # the request's id: the HTTP side holds no Turn


@dataclass(slots=True)
class DeleteSession:
    session: str
    done: Future[bool] = field(default_factory=Future)  # True if there was anything to drop


Command = Submit | Cancel | DeleteSession


class Inbox:
    def __init__(self, max_queue: int, max_per_client: int = 0) -> None:
        self.max_queue = max_queue
        self.max_per_client = max_per_client  # running + queued per client identity; 0 = no cap
        self._cv = threading.Condition()
        self._items: deque[Command] = deque()
        self._queued = 0  # submitted, not yet admitted to a slot (or ended while waiting)
        self._open: dict[str, int] = {}  # per client: submitted and not yet finished
        self._closed = False

    # -- event loop side -----------------------------------------------------------------
    def submit(self, turn: Turn) -> None:
        """Queue a request, or refuse it: QueueFull (429) or Unavailable after close()."""
        with self._cv:
            if self._closed:
                raise Unavailable("the server is shutting down", retry_after=10)
            if self._queued >= self.max_queue:
                raise QueueFull(f"the server is busy: {self._queued} requests are queued",
                                retry_after=2, code="queue_full")
            cap = self.max_per_client
            if cap and self._open.get(turn.client, 0) >= cap:
                raise QueueFull(f"at most {cap} requests at once per client", retry_after=2, code="client_cap")
            self._open[turn.client] = self._open.get(turn.client, 0) + 1
            self._queued += 1
            self._items.append(Submit(turn))
            self._cv.notify()

    def put(self, command: Command) -> None:
        with self._cv:
            self._items.append(command)
            self._cv.notify()

    @property
    def n_open(self) -> int:
        """Requests submitted and not yet finished (queued or running)."""
        with self._cv:  # the engine thread changes the table meanwhile
            return sum(self._open.values())

    # -- engine thread side --------------------------------------------------------------
    def take(self) -> list[Command]:
        with self._cv:
            items = list(self._items)
            self._items.clear()
            return items

    def wait(self, timeout: float) -> None:
        """Sleep until a command arrives or `timeout` seconds pass."""
        with self._cv:
            if not self._items:
                self._cv.wait(timeout)

    def wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def dequeued(self, n: int = 1) -> None:
        """n requests left the queue (admitted, cancelled or timed out while waiting)."""
        with self._cv:
            self._queued -= n

    def finished(self, turn: Turn) -> None:
        with self._cv:
            left = self._open.get(turn.client, 1) - 1
            if left > 0:
                self._open[turn.client] = left
            else:
                self._open.pop(turn.client, None)

    def close(self) -> list[Command]:
        """Refuse new requests from now on; returns the commands not yet taken."""
        with self._cv:
            self._closed = True
            return self.take()
