"""The adaptive batch wait: a lone request never waits; waiting starts only on evidence
that it pays, and stops when it does not or when every sender is already in."""

from __future__ import annotations

import asyncio

import pytest
from test_batcher import make, rows, run

from turboinfer.serve.batch_window import (
    ALL_IN,
    AT_ONCE,
    FULL,
    WAITED,
    BatchWindow,
    SenderCount,
)
from turboinfer.serve.batcher import Batcher, BatchingSettings

MAX = 0.008  # 8 ms, in seconds


def test_nothing_waits_before_two_arrivals_give_a_rate() -> None:
    window = BatchWindow(MAX)
    window.arrived(1.0, queue_was_empty=True)
    assert window.slack(oldest_arrival=1.0, now=1.0) == 0.0


def test_an_arrival_while_the_last_batch_runs_opens_the_window() -> None:
    window = BatchWindow(MAX)
    window.arrived(1.0, queue_was_empty=True)
    window.dispatched(1.0)
    window.arrived(1.001, queue_was_empty=True)  # would have shared the running batch
    assert window.window_s == pytest.approx(MAX / 8)
    # With arrivals 1 ms apart and 1 ms of slack left, the next one is not expected in time.
    assert window.slack(oldest_arrival=1.001, now=1.001) == 0.0
    window.arrived(1.0011, queue_was_empty=False)
    window.arrived(1.0012, queue_was_empty=False)
    assert 0 < window.slack(oldest_arrival=1.0012, now=1.0012) <= MAX / 8


def test_a_client_alone_never_opens_the_window() -> None:
    """Closed loop, one client: each request follows the answer to the previous one."""
    window = BatchWindow(MAX)
    now = 1.0
    for _ in range(50):
        window.arrived(now, queue_was_empty=True)
        assert window.slack(oldest_arrival=now, now=now) == 0.0
        window.dispatched(now)
        now += 0.0003
        window.finished()
        now += 0.0001
    assert window.window_s == 0.0


def test_waits_that_nobody_joins_close_the_window_and_joined_ones_widen_it() -> None:
    window = BatchWindow(MAX)
    for _ in range(20):
        window.waited(joined=True)
    assert window.window_s == MAX  # never beyond max_queue_delay
    window.waited(joined=False)
    assert window.window_s == MAX / 2
    for _ in range(6):
        window.waited(joined=False)
    assert window.window_s == 0.0


def test_a_lone_request_goes_at_once_despite_a_long_delay() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=8, max_queue_delay_s=30.0))
        for i in range(5):  # one client: each request after the previous answer
            result = await batcher.submit(rows(i), 1)
            assert float(result["y"][0, 0]) == 2.0 * i
        # Each batch left without waiting (a fixed delay would have held each 30 s).
        assert batcher.dispatch_reasons == {AT_ONCE: 5}
        assert batcher._queue.window.window_s == 0.0
        assert [b.shape[0] for b in session.batches] == [1] * 5
        await batcher.close()

    run(scenario())


def test_a_burst_still_forms_one_batch() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=8, max_queue_delay_s=30.0))
        await asyncio.gather(*(batcher.submit(rows(i), 1) for i in range(5)))
        assert [b.shape[0] for b in session.batches] == [5]
        await batcher.close()

    run(scenario())


def test_arrivals_overlapping_a_running_batch_make_the_next_one_wait_for_more() -> None:
    async def scenario() -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=3, max_queue_delay_s=30.0))
        session.gate.clear()
        first = asyncio.create_task(batcher.submit(rows(0), 1))
        await asyncio.sleep(0.01)  # the first batch now runs, held at the gate
        second = asyncio.create_task(batcher.submit(rows(1), 1))
        await asyncio.sleep(0)
        window = batcher._queue.window
        assert window.window_s > 0  # the second would have shared the first batch
        session.gate.set()
        await first
        await asyncio.sleep(0.01)  # the next batch has one row and waits for more
        assert batcher.pending == 1
        rest = [asyncio.create_task(batcher.submit(rows(i), 1)) for i in (2, 3)]
        await asyncio.gather(second, *rest)
        assert [b.shape[0] for b in session.batches] == [1, 3]
        assert batcher.dispatch_reasons == {AT_ONCE: 1, FULL: 1}
        await batcher.close()

    run(scenario())


def test_a_batch_goes_once_every_sender_is_in() -> None:
    """Two closed-loop clients: once both requests are in, no third can come."""
    window = BatchWindow(MAX)
    window.arrived(1.0, queue_was_empty=True, waiting=1)
    window.dispatched(1.0, requests=1)
    window.arrived(1.0001, queue_was_empty=True, waiting=1)  # two in the server at once
    window.finished(requests=1)
    assert window.senders.peak == 2 and window.window_s > 0
    window.dispatched(1.0002, requests=1)
    window.finished(requests=1)
    # A comes back first: the second sender is still expected, so it waits.
    window.arrived(1.0003, queue_was_empty=True, waiting=1)
    wait_s, reason = window.wait_s(oldest_arrival=1.0003, now=1.0003, waiting=1)
    assert wait_s > 0 and reason == WAITED
    window.arrived(1.00031, queue_was_empty=False, waiting=2)
    assert window.wait_s(oldest_arrival=1.0003, now=1.00031, waiting=2) == (0.0, ALL_IN)
    # A request running counts as a sender that cannot send now.
    window.dispatched(1.0004, requests=1)
    assert window.wait_s(oldest_arrival=1.0003, now=1.0004, waiting=1) == (0.0, ALL_IN)


def test_the_sender_count_forgets_clients_that_left() -> None:
    senders = SenderCount(horizon_s=1.0)
    senders.saw(32, now=0.0)
    senders.saw(2, now=1.5)
    assert senders.peak == 32  # the bucket before still counts
    senders.saw(2, now=2.6)
    assert senders.peak == 2
    senders.saw(1, now=10.0)  # a long silence: nothing from before counts
    assert senders.peak == 1


def test_closed_loop_clients_never_wait_out_the_window() -> None:
    """Two and four clients, each sending its next request when the last is answered,
    under a 30 s delay: every batch goes when all are in, none waits the delay out."""
    async def client(batcher: Batcher, value: int, rounds: int) -> None:
        await asyncio.sleep(0.01 if value else 0.0)  # the others come while 0's batch runs
        for _ in range(rounds):
            result = await batcher.submit(rows(value), 1)
            assert float(result["y"][0, 0]) == 2.0 * value

    async def scenario(clients: int) -> None:
        batcher, (session,) = make(BatchingSettings(max_batch_size=32,
                                                    max_queue_delay_s=30.0))
        session.gate.clear()  # the first batch runs until the others have arrived
        # Client 0's first request ran alone, so it sends one more and all end together
        # (a client that leaves costs the others one wait, bounded by the window).
        loops = asyncio.gather(*(client(batcher, i, 20 + (i == 0)) for i in range(clients)))
        await asyncio.sleep(0.03)
        assert batcher._queue.window.window_s > 0  # they would have shared it
        session.gate.set()
        await asyncio.wait_for(loops, 25.0)
        assert WAITED not in batcher.dispatch_reasons, batcher.dispatch_reasons
        assert batcher.dispatch_reasons.get(ALL_IN, 0) > 0
        assert sum(b.shape[0] for b in session.batches) == 20 * clients + 1
        await batcher.close()

    for clients in (2, 4):
        run(scenario(clients))
