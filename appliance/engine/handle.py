"""What the HTTP side holds for one request (Handle): its events, its place in the queue,
a cancel. Never the engine's Turn: commands go through the inbox, places come from the
published snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from appliance.engine.events import Delta, Done, End, Event
from appliance.engine.inbox import Cancel, Inbox
from appliance.engine.snapshot import Snapshot
from appliance.engine.turn import Lane


class Handle:
    """The HTTP side of one request: an async stream of Delta, then Done or Failed (with
    Progress before the first Delta if submitted with progress=True); its place in the
    queue, read from the published snapshot; and a cancel. It holds the request's id and
    its event queue, never the engine's Turn."""

    def __init__(self, rid: int, queue: asyncio.Queue[Event], inbox: Inbox, snapshot: Callable[[], Snapshot],
                 lane: Lane = Lane.PEOPLE) -> None:
        self.lane = lane  # a background request's queue note says it waits behind people
        self.rid = rid
        self._queue = queue  # the engine's events, put on the loop thread (Engine._emit)
        self._inbox = inbox
        self._snapshot = snapshot
        self._ended = False  # saw Done or Failed: nothing left to cancel

    async def _get(self) -> Event:
        ev = await self._queue.get()
        if isinstance(ev, End):
            self._ended = True
        return ev

    async def events(self) -> AsyncIterator[Event]:
        while True:
            ev = await self._get()
            yield ev
            if isinstance(ev, End):
                return

    async def next(self, timeout: float) -> Event | None:
        """The next event, or None after `timeout` seconds (cancelling a queue get is safe)."""
        try:
            return await asyncio.wait_for(self._get(), timeout)
        except TimeoutError:
            return None

    @property
    def position(self) -> int:
        """1-based place in the queue, 0 once running (from the last snapshot)."""
        return self._snapshot().position(self.rid)

    def cancel(self) -> None:
        if not self._ended:
            self._ended = True
            self._inbox.put(Cancel(self.rid))


def answered(text: str, lane: Lane = Lane.PEOPLE) -> Handle:
    """A handle whose answer the server wrote itself, never queued: `text` as one Delta,
    then Done with no tokens, the events a request's stream and body are made of, so every
    API writes it as it writes the model's. Its cancel reaches an inbox of its own."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    queue.put_nowait(Delta(text))
    queue.put_nowait(Done("stop", 0, 0))
    return Handle(0, queue, Inbox(1), Snapshot, lane)
