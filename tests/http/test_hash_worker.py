"""The password-hash thread (http/people.HashWorker): a result or an error back on the
request's loop, and a stop that lets the running hash finish and fails what is queued."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers.polling import until

from appliance.http.people import HashWorker
from appliance.workers import WorkerStopped


def test_a_hash_returns_its_result_or_raises_its_error() -> None:
    def wrong(password: str) -> bool:
        raise ValueError(f"not {password}")

    async def main() -> None:
        w = HashWorker()
        w.start()
        try:
            assert await w.run(lambda a, b: a + b, 2, 3) == 5
            with pytest.raises(ValueError, match="not x"):
                await w.run(wrong, "x")
            assert await w.run(lambda: "after") == "after"  # the thread went on
        finally:
            w.stop()

    asyncio.run(main())


def test_stop_lets_the_running_hash_finish_and_fails_the_queued_ones() -> None:
    gate = threading.Event()

    async def main() -> None:
        w = HashWorker()
        w.start()
        running = asyncio.ensure_future(w.run(gate.wait))
        queued = asyncio.ensure_future(w.run(lambda: "never"))
        await until(lambda: w.health().depth == 2, what="both at the hash thread")
        stopper = threading.Thread(target=w.stop)
        stopper.start()
        await until(lambda: w.stopping, what="the stop to begin")
        gate.set()
        assert await running is True
        with pytest.raises(WorkerStopped):
            await queued
        await asyncio.to_thread(stopper.join)
        assert not w.health().alive
        with pytest.raises(WorkerStopped):
            await w.run(lambda: "after stop")

    asyncio.run(main())
