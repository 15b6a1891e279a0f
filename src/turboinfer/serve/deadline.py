"""A request's deadline holds until it is answered, not only while it waits.

The ``timeout`` a request carries (or its model's ``default_timeout_ms``) starts when it
is submitted. While the request waits, the queue's timer fails it on time
(``batch_queue``). Once its batch runs, the engine call cannot be interrupted: the
session runs on its instance's thread to the end. So ``hold`` arms the same deadline
again for the run; when it passes, the caller gets its timeout error at once while the
batch goes on in the background. The batch's other requests are still answered when it
ends; its instance stays busy until then, and the other instances and versions serve on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

from turboinfer.errors import RequestTimeoutError


class Pending(Protocol):
    """What of a queued request (``batch_queue.Pending``) its deadline needs."""

    future: asyncio.Future[Any]
    timer: asyncio.TimerHandle | None
    timeout_s: float | None


IN_QUEUE = "in the queue"
IN_ENGINE = "while the engine ran it"


def expire(future: asyncio.Future[Any], timeout_s: float, where: str) -> None:
    """Fail ``future`` with the timeout error, unless it was answered first."""
    if not future.done():
        future.set_exception(RequestTimeoutError(
            f"request timed out after {timeout_s * 1000:g} ms {where}"))


def hold(batch: Iterable[Pending]) -> list[asyncio.TimerHandle]:
    """Arm, for the engine run, the deadline of each request in ``batch`` that has one
    (at the time its queue timer was set for); ``release`` the result once it ran."""
    timers: list[asyncio.TimerHandle] = []
    for item in batch:
        queued = item.timer
        if queued is not None and item.timeout_s is not None:
            loop = asyncio.get_running_loop()
            timers.append(loop.call_at(queued.when(), expire, item.future, item.timeout_s,
                                       IN_ENGINE))
    return timers


def release(timers: list[asyncio.TimerHandle]) -> None:
    for timer in timers:
        timer.cancel()
