"""Requests inside a server, counted so that shutdown can wait for them.

One counter per server and one deadline: the front door refuses new requests once the
drain starts, and ``wait_idle`` returns when the last request inside has left or the
deadline has passed. Nothing polls: the request that leaves last sets an event, and
only while someone waits (the hot path pays for an integer add and a test).
"""

from __future__ import annotations

import asyncio


class InFlight:
    """How many requests are inside; ``enter`` and ``leave`` pair around each one."""

    __slots__ = ("_idle", "count")

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None  # made by the first wait_idle

    def enter(self) -> None:
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        if not self.count and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is inside, for at most ``timeout_s``; True if none is."""
        if not self.count:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        self._idle.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
