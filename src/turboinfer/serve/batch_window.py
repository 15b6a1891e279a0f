"""How long a batch waits for more rows: as long as more are expected and waiting pays,
never longer than ``max_queue_delay``.

A fixed delay makes a lone request wait the whole delay for rows that never come (one
client alone got 6-10x less throughput than without batching). The rule here:

- The *window* ``W`` (0 <= W <= ``max_queue_delay``) bounds how long the oldest waiting
  request may wait. A batch waits only while a further arrival is expected within the
  slack the window leaves: the running average (EWMA) of the gaps between arrivals must
  be shorter than ``oldest arrival + W - now``. Otherwise it goes at once.
- ``W`` adapts on outcomes, additive increase / multiplicative decrease as in Clipper's
  batch sizing: a wait that some request joined widens it by ``max_queue_delay / 8``; a
  wait that nobody joined halves it, and below ``max_queue_delay / 64`` it is 0.
- ``W`` grows from 0 only on evidence that waiting would have paid: a request arrives to
  an empty queue less than ``max_queue_delay`` after a batch left, while that batch still
  runs (it would have shared it). A client alone in a closed loop never does that (its
  next request follows the answer), so it never waits.
"""

from __future__ import annotations

import math

# Weight of the newest gap in the inter-arrival average.
GAP_GAIN = 0.125
WIDEN_FRACTION = 1 / 8
CLOSE_FRACTION = 1 / 64

# Why a batch left the queue.
AT_ONCE = "at_once"  # no wait: nothing more expected within the slack
WAITED = "waited"  # waited for more rows until the window's end
FULL = "full"  # the target batch size was reached
REASONS = (AT_ONCE, WAITED, FULL)


class BatchWindow:
    """The adaptive wait of one queue; all times are ``time.perf_counter()`` seconds."""

    def __init__(self, max_delay_s: float) -> None:
        self.max_delay_s = max_delay_s
        self.window_s = 0.0
        self.gap_s = math.inf  # average gap between arrivals; inf until two arrived
        self.running = 0  # batches dispatched and not finished
        self._last_arrival: float | None = None
        self._dispatched_at = -math.inf

    def arrived(self, now: float, queue_was_empty: bool) -> None:
        last, self._last_arrival = self._last_arrival, now
        if last is not None:
            gap = now - last
            self.gap_s = gap if math.isinf(self.gap_s) else (
                self.gap_s + GAP_GAIN * (gap - self.gap_s))
        if (queue_was_empty and self.running and self.window_s < self.max_delay_s
                and now - self._dispatched_at < self.max_delay_s):
            self._widen()  # it would have shared the batch that just left

    def slack(self, oldest_arrival: float, now: float) -> float:
        """Seconds the batch may still wait for more rows; 0: dispatch now."""
        remaining = oldest_arrival + self.window_s - now
        if remaining <= 0 or self.gap_s >= remaining:
            return 0.0
        return remaining

    def waited(self, joined: bool) -> None:
        """The outcome of a wait: did any request join the batch meanwhile?"""
        if joined:
            self._widen()
        else:
            self.window_s /= 2
            if self.window_s < self.max_delay_s * CLOSE_FRACTION:
                self.window_s = 0.0

    def dispatched(self, now: float) -> None:
        self._dispatched_at = now
        self.running += 1

    def finished(self) -> None:
        self.running = max(0, self.running - 1)

    def _widen(self) -> None:
        self.window_s = min(self.max_delay_s,
                            self.window_s + self.max_delay_s * WIDEN_FRACTION)
