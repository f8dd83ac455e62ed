"""The worker base (appliance/workers.py): a bounded inbox, its busy error, drain or cancel
at stop, health, begin's error raised by start, ticks."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers.polling import wait_until

from appliance.errors import QueueFull
from appliance.workers import Health, Worker, WorkerBusy, WorkerStopped, settle


class Recorder(Worker[str]):
    """Handles items in order once `gate` is open; records what it handled and cancelled."""

    def __init__(self, drain: bool = True, max_queue: int = 0, every: float | None = None) -> None:
        super().__init__("recorder", max_queue=max_queue, every=every,
                         busy=lambda depth: QueueFull(f"{depth} waiting", code="busy"))
        self.DRAIN = drain
        self.gate = threading.Event()
        self.took = threading.Event()  # the first item reached handle()
        self.handled: list[str] = []
        self.cancelled: list[str] = []
        self.ended = False

    def handle(self, item: str) -> None:
        self.took.set()
        assert self.gate.wait(30)
        self.handled.append(item)

    def cancel(self, item: str) -> None:
        self.cancelled.append(item)

    def end(self) -> None:
        self.ended = True


def test_a_full_queue_raises_the_workers_own_busy_error() -> None:
    w = Recorder(max_queue=2)
    w.start()
    w.submit("a")
    assert w.took.wait(30)  # "a" is being handled: it still counts until done
    w.submit("b")
    with pytest.raises(QueueFull) as e:
        w.submit("c")
    assert e.value.status == 429 and str(e.value) == "2 waiting"
    assert w.health().depth == 2 and w.health().alive
    w.gate.set()
    w.stop()
    assert w.handled == ["a", "b"] and w.health().depth == 0 and not w.health().alive


def test_weights_count_against_the_bound() -> None:
    w = Recorder(max_queue=10)
    w.start()
    w.submit("big", weight=8)
    with pytest.raises(QueueFull):
        w.submit("more", weight=3)
    w.submit("fits", weight=2)
    w.gate.set()
    w.stop()
    assert w.handled == ["big", "fits"]


def test_stop_drains_what_was_queued() -> None:
    w = Recorder(drain=True)
    w.start()
    for item in "abc":
        w.submit(item)
    assert w.took.wait(30)
    threading.Timer(0, w.gate.set).start()
    w.stop()
    assert w.handled == ["a", "b", "c"] and w.cancelled == [] and w.ended


def test_stop_cancels_what_was_queued() -> None:
    w = Recorder(drain=False)
    w.start()
    for item in "abc":
        w.submit(item)
    assert w.took.wait(30)  # "a" runs to its end; "b" and "c" are cancelled
    stopper = threading.Thread(target=w.stop)
    stopper.start()
    wait_until(lambda: w.stopping or None, 30, "the stop to begin")
    w.gate.set()
    stopper.join(30)
    assert w.handled == ["a"] and w.cancelled == ["b", "c"] and w.health().depth == 0


def test_submit_when_not_running_raises_stopped() -> None:
    w = Recorder()
    with pytest.raises(WorkerStopped):
        w.submit("early")
    w.start()
    w.stop()
    with pytest.raises(WorkerStopped):
        w.submit("late")


def test_a_custom_stopped_error() -> None:
    w: Worker[str] = Worker("custom", stopped=lambda: KeyError("off"))
    with pytest.raises(KeyError):
        w.submit("x")


def test_begins_error_is_raised_by_start() -> None:
    class Failing(Worker[str]):
        def begin(self) -> None:
            raise OSError("no model")

    w = Failing("failing")
    with pytest.raises(OSError, match="no model"):
        w.start()
    assert not w.health().alive


def test_ticks_until_one_says_stop() -> None:
    class Counter(Worker[str]):
        def __init__(self) -> None:
            super().__init__("counter", every=0.001)
            self.ticks = 0

        def tick(self) -> bool:
            self.ticks += 1
            return self.ticks < 3

    w = Counter()
    w.start()
    assert w._thread is not None
    w._thread.join(30)
    assert w.ticks == 3 and not w.health().alive
    w.stop()  # stopping an ended worker is harmless


def test_stop_from_the_workers_own_thread_does_not_wait_on_itself() -> None:
    class SelfStopping(Worker[str]):
        def handle(self, item: str) -> None:
            self.stop()

    w = SelfStopping("self")
    w.start()
    w.submit("x")
    assert w._thread is not None
    w._thread.join(30)
    assert not w.health().alive


def test_without_a_busy_error_of_its_own_a_full_queue_raises_worker_busy() -> None:
    gate = threading.Event()

    class Plain(Worker[str]):
        def handle(self, item: str) -> None:
            assert gate.wait(30)

    w = Plain("plain", max_queue=1)
    w.start()
    w.submit("a")  # counted until handled
    with pytest.raises(WorkerBusy, match="plain: 1 queued"):
        w.submit("b")
    gate.set()
    w.stop()
    assert w.health() == Health("plain", False, 0)


def test_settle_hands_a_result_or_an_error_to_the_futures_own_loop() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ok, bad, gone = loop.create_future(), loop.create_future(), loop.create_future()
        gone.cancel()  # its request went away: settling it is no error

        def from_a_thread() -> None:
            settle(loop, ok, 1)
            settle(loop, bad, error=ValueError("no"))
            settle(loop, gone, 2)

        await asyncio.to_thread(from_a_thread)
        assert await ok == 1
        with pytest.raises(ValueError, match="no"):
            await bad
        assert gone.cancelled()

    asyncio.run(main())
    closed = asyncio.new_event_loop()
    orphan = closed.create_future()
    closed.close()
    settle(closed, orphan, 3)  # the loop is gone: nobody awaits, nothing raised
    assert not orphan.done()
