"""Waiting for a condition, the one way the tests poll: sync and async, with a deadline that
fails the test saying what it waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], timeout: float = 5.0, what: str = "a condition", every: float = 0.02,
               *, seen: Callable[[], object] | None = None) -> T:
    """check()'s first truthy value; an AssertionError after `timeout` seconds, ending with
    seen() if given (the last state polled, say)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f": {seen()}" if seen else ""))
        time.sleep(every)


async def until(check: Callable[[], Any], timeout: float = 5.0, what: str = "a condition", every: float = 0.01) -> Any:
    """As wait_until, on the event loop (the engine's events keep flowing meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)
