"""The hooks for pacing done elsewhere (the node agent, docs/preload.md) on the `Throttle`:
`count` books bytes without touching the bucket, `hold_wait` is one waiter while held, the
bucket observer sees every applied rate; and `Pattern.next_edge`, where a window's rate
changes. A settable clock: no threads, no sleeps."""

from __future__ import annotations

import math

import pytest
from support.clock import FakeClock

from burstctl.client.bucket import Pattern, Throttle
from burstctl.proto.burstctl.v1 import controller_pb2 as pb


def test_count_books_bytes_like_an_acquire_without_drawing_tokens() -> None:
    clock = FakeClock()
    throttle = Throttle(clock)
    throttle.set_rate(1000.0, 1000.0)  # an empty bucket: any acquire would wait
    throttle.count(5000, pb.OP_KIND_WRITE)
    throttle.count(300, pb.OP_KIND_READ)
    stats = throttle.snapshot()
    assert (stats.bytes, stats.acquires) == (5300, 2)
    assert (stats.bytes_written, stats.bytes_read) == (5000, 300)
    assert stats.wait_seconds == 0 and not stats.waiting
    # The bucket was not drawn from: 1000 tokens after one second are all there.
    clock.now += 1.0
    throttle.acquire(1000, pb.OP_KIND_WRITE)  # returns at once (a wait would block forever)
    throttle.close()
    with pytest.raises(RuntimeError):
        throttle.count(1)


def test_hold_wait_is_one_waiter_with_its_wait_time_and_one_notice() -> None:
    clock = FakeClock()
    notices: list[float] = []
    throttle = Throttle(clock, on_wait_start=lambda: notices.append(clock.now))
    throttle.hold_wait(True)
    throttle.hold_wait(True)  # idempotent: still one waiter, one notice
    assert throttle.waiting and notices == [100.0]
    clock.now += 2.0
    assert throttle.snapshot(reported=True).wait_seconds == pytest.approx(2.0)
    throttle.hold_wait(False)
    throttle.hold_wait(False)
    clock.now += 5.0
    stats = throttle.snapshot(reported=True)
    assert not stats.waiting and stats.wait_seconds == pytest.approx(2.0)
    throttle.hold_wait(True)  # the last report said "not waiting": a new notice
    assert notices == [100.0, 107.0]
    throttle.close()  # ends the held wait
    assert not throttle.waiting


def test_the_bucket_observer_sees_every_set_rate_outside_the_lock() -> None:
    seen: list[tuple[float, float, Pattern | None]] = []
    throttle: Throttle

    def observe(rate: float, burst: float, pattern: Pattern | None) -> None:
        assert not throttle.waiting  # takes the throttle's lock: would deadlock under it
        seen.append((rate, burst, pattern))

    throttle = Throttle(FakeClock(), on_bucket=observe)
    throttle.set_rate(2000.0, 100.0)
    throttle.set_rate(2000.0, 100.0)  # unchanged: seen too
    pattern = Pattern(10.0, 0.0, [(0.0, 2.0, 500.0)])
    throttle.set_rate(math.inf, 0.0, pattern)
    assert seen == [(2000.0, 100.0, None), (2000.0, 100.0, None), (math.inf, 0.0, pattern)]


def test_next_edge_walks_the_window_starts_and_ends() -> None:
    pattern = Pattern(10.0, 3.0, [(1.0, 3.0, 500.0), (6.0, 10.5, 100.0)])  # the last wraps
    assert pattern.next_edge(3.0) == 3.5  # the period starts inside the wrapped window
    assert pattern.next_edge(3.5) == 4.0
    assert pattern.next_edge(4.0) == 6.0
    assert pattern.next_edge(7.5) == 9.0
    assert pattern.next_edge(9.0) == 13.0  # the period's end
    assert pattern.next_edge(12.99) == 13.0
    assert [pattern.rate_at(t) for t in (3.5, 4.0, 6.0, 9.0)] == [0.0, 500.0, 0.0, 100.0]
