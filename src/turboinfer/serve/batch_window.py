"""How long a batch waits for more rows: as long as more are expected and waiting pays,
never longer than ``max_queue_delay``.

A fixed delay makes a lone request wait the whole delay for rows that never come (one
client alone got 6-10x less throughput than without batching), and it makes a few
closed-loop clients slower than one: two clients' requests arrive together, and the
batch then waits out the delay for a third that cannot come (346 req/s at 2 clients
against 1,571 at 1 on a small CNN with a 5 ms delay). The rule here:

- The *window* ``W`` (0 <= W <= ``max_queue_delay``) bounds how long the oldest waiting
  request may wait. A batch waits only while a further arrival is expected within the
  slack the window leaves: the running average (EWMA) of the gaps between arrivals must
  be shorter than ``oldest arrival + W - now``. Otherwise it goes at once.
- It goes at once too when no further arrival can come: every sender has a request in
  the server. The senders are counted as the most requests seen in the server at once
  (waiting plus running) over the last ``SENDER_HORIZON_S``; a closed-loop client has
  at most one request in at a time, so when as many are waiting or running, the next
  arrival follows an answer, not the wait.
- (A rule on silence, going once the time since the last arrival is long against the
  gaps within bursts, was measured and left out: on a busy event loop the gaps it sees
  stretch while requests sit unread in the sockets, and at 32 clients it halved the
  batches, 16 rows instead of 32, and cost 11% of the throughput.)
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

# Weight of the newest gap in the inter-arrival averages.
GAP_GAIN = 0.125
WIDEN_FRACTION = 1 / 8
CLOSE_FRACTION = 1 / 64
# The sender count is the peak of requests in the server over the last one to two of
# these: long against a closed loop's round trip, short against clients coming and going.
SENDER_HORIZON_S = 0.5

# Why a batch left the queue.
AT_ONCE = "at_once"  # no wait: nothing more expected within the slack
WAITED = "waited"  # waited for more rows until the window's end
FULL = "full"  # the target batch size was reached
ALL_IN = "all_in"  # every sender has a request in the server: none more can come
REASONS = (AT_ONCE, WAITED, FULL, ALL_IN)


class SenderCount:
    """The most requests in the server at once over the last one to two horizons: two
    buckets, the current one and the one before, so an old peak ages out."""

    def __init__(self, horizon_s: float = SENDER_HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self._bucket_start = -math.inf
        self._now = 0
        self._before = 0

    def saw(self, in_server: int, now: float) -> None:
        if now - self._bucket_start >= self.horizon_s:
            recent = now - self._bucket_start < 2 * self.horizon_s
            self._before = self._now if recent else 0
            self._now, self._bucket_start = 0, now
        self._now = max(self._now, in_server)

    @property
    def peak(self) -> int:
        return max(self._now, self._before)


class BatchWindow:
    """The adaptive wait of one queue; all times are ``time.perf_counter()`` seconds."""

    def __init__(self, max_delay_s: float) -> None:
        self.max_delay_s = max_delay_s
        self.window_s = 0.0
        self.gap_s = math.inf  # average gap between arrivals; inf until two arrived
        self.running = 0  # batches dispatched and not finished
        self.running_requests = 0  # their requests
        self.senders = SenderCount()
        self._last_arrival: float | None = None
        self._dispatched_at = -math.inf

    def arrived(self, now: float, queue_was_empty: bool, waiting: int = 1) -> None:
        """A request arrived at ``now``; ``waiting`` counts it and those queued before."""
        last, self._last_arrival = self._last_arrival, now
        self.senders.saw(waiting + self.running_requests, now)
        if last is not None:
            gap = now - last
            self.gap_s = gap if math.isinf(self.gap_s) else (
                self.gap_s + GAP_GAIN * (gap - self.gap_s))
        if (queue_was_empty and self.running and self.window_s < self.max_delay_s
                and now - self._dispatched_at < self.max_delay_s):
            self._widen()  # it would have shared the batch that just left

    def slack(self, oldest_arrival: float, now: float) -> float:
        """Seconds the batch may still wait for more rows by the window and the arrival
        rate; 0: dispatch now."""
        remaining = oldest_arrival + self.window_s - now
        if remaining <= 0 or self.gap_s >= remaining:
            return 0.0
        return remaining

    def wait_s(self, oldest_arrival: float, now: float, waiting: int) -> tuple[float, str]:
        """How long the batch of ``waiting`` requests may still wait, and when that is 0,
        why it goes now."""
        slack = self.slack(oldest_arrival, now)
        if slack <= 0:
            return 0.0, AT_ONCE
        if waiting + self.running_requests >= self.senders.peak:
            return 0.0, ALL_IN
        return slack, WAITED

    def waited(self, joined: bool) -> None:
        """The outcome of a wait: did any request join the batch meanwhile?"""
        if joined:
            self._widen()
        else:
            self.window_s /= 2
            if self.window_s < self.max_delay_s * CLOSE_FRACTION:
                self.window_s = 0.0

    def dispatched(self, now: float, requests: int = 1) -> None:
        self._dispatched_at = now
        self.running += 1
        self.running_requests += requests

    def finished(self, requests: int = 1) -> None:
        self.running = max(0, self.running - 1)
        self.running_requests = max(0, self.running_requests - requests)

    def _widen(self) -> None:
        self.window_s = min(self.max_delay_s,
                            self.window_s + self.max_delay_s * WIDEN_FRACTION)

