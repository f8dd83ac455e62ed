"""One background thread and its inbox: the base of the process's workers (the embedding
threads, the library's indexer, the usage writer, the systemd watchdog, chat retention, the
password-hash thread).

A worker takes items from its queue one at a time on its own thread (`handle`), and with
`every` set also wakes that often with nothing queued (`tick`). The queue is bounded by
weight (the embedder counts texts, not calls): a `submit` beyond `max_queue` raises the
worker's own busy error at once, so callers keep the status and words they always had.
`stop` either drains (what was queued before the stop is handled) or cancels (each queued
item goes to `cancel`, which fails it): the subclass says which with `DRAIN`. `settle`
hands a result from the thread to a future awaited on an event loop.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class WorkerStopped(RuntimeError):
    """submit() on a worker not running (never started, or stopped)."""


class WorkerBusy(RuntimeError):
    """submit() on a full queue, for a worker that names no busy error of its own."""


@dataclass(frozen=True, slots=True)
class Health:
    name: str
    alive: bool  # the thread runs
    depth: int  # queued weight not yet handled


def settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any = None,
           error: BaseException | None = None) -> None:
    """From a worker's thread: the future's result (or error), set on its own loop."""
    try:
        loop.call_soon_threadsafe(_set, future, result, error)
    except RuntimeError:
        pass  # the loop is closed: nobody awaits the future any more


def _set(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting request was cancelled (its client went away)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Stop:
    """The sentinel that wakes the thread to end (never counted against max_queue)."""


class Worker(Generic[T]):
    """A daemon thread with a bounded inbox. Subclasses override `handle` (and `begin`,
    `tick`, `end`, `cancel` as they need); `busy(depth)` builds the error a full queue raises,
    `stopped()` the one a worker not running raises."""

    DRAIN = True  # stop(): handle what is queued (True) or cancel it (False)

    def __init__(self, name: str, *, max_queue: int = 0, every: float | None = None,
                 busy: Callable[[int], Exception] | None = None,
                 stopped: Callable[[], Exception] | None = None) -> None:
        self.name = name
        self.max_queue = max_queue  # 0: unbounded
        self.every = every  # seconds between ticks with nothing queued (None: no tick)
        self._busy = busy or (lambda depth: WorkerBusy(f"{name}: {depth} queued"))
        self._stopped = stopped or (lambda: WorkerStopped(f"{name} is not running"))
        self._queue: queue.Queue[tuple[T, int] | _Stop] = queue.Queue()
        self._lock = threading.Lock()
        self._depth = 0
        self._stopping = threading.Event()  # set by stop(); a handler may wait on it as a pause
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- what a subclass does on its thread -----------------------------------------------
    def begin(self) -> None:
        """First thing on the thread; an exception here makes start() raise it."""

    def handle(self, item: T) -> None:
        raise NotImplementedError

    def tick(self) -> bool:
        """Every `every` seconds with nothing queued; False ends the thread."""
        return True

    def end(self) -> None:
        """Last thing on the thread, however it ends."""

    def cancel(self, item: T) -> None:
        """An item stop() did not handle (DRAIN False)."""

    # -- the lifecycle --------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self) -> None:
        """Start the thread and wait for begin(); its error is raised here."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def submit(self, item: T, weight: int = 1) -> None:
        with self._lock:
            if self._stopping.is_set() or self._thread is None:
                raise self._stopped()
            if self.max_queue and self._depth + weight > self.max_queue:
                raise self._busy(self._depth)
            self._depth += weight
        self._queue.put((item, weight))

    def stop(self, timeout: float | None = None) -> None:
        """Drain or cancel what is queued (DRAIN), then join the thread (from itself: no join)."""
        with self._lock:
            self._stopping.set()
        self._queue.put(_Stop())
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)

    def health(self) -> Health:
        with self._lock:
            depth = self._depth
        return Health(self.name, self._thread is not None and self._thread.is_alive(), depth)

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.begin()
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop()
        finally:
            self._cancel_rest()
            self.end()

    def _loop(self) -> None:
        while True:
            try:
                got = self._queue.get(timeout=self.every)
            except queue.Empty:
                if self._stopping.is_set() or not self.tick():
                    return
                continue
            if isinstance(got, _Stop):
                return
            item, weight = got
            try:
                if self._stopping.is_set() and not self.DRAIN:
                    self.cancel(item)
                else:
                    self.handle(item)
            finally:
                with self._lock:
                    self._depth -= weight

    def _cancel_rest(self) -> None:
        """Items left behind the stop (or by a tick that ended the thread) are cancelled."""
        while True:
            try:
                got = self._queue.get_nowait()
            except queue.Empty:
                return
            if not isinstance(got, _Stop):
                with self._lock:
                    self._depth -= got[1]
                self.cancel(got[0])
