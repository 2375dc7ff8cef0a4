"""Token bucket math (explicit clock values) and the waiting wrappers of `Throttle`."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
from support import async_wait_until, wait_until
from support.clock import FakeClock

from burstctl.client.bucket import Throttle, TokenBucket
from burstctl.client.waits import MAX_WAIT_SLICE, wait_slice
from burstctl.common.limits import MIN_RATE

# -------------------------------------------------------------------------- TokenBucket


def test_starts_empty_and_waits_for_a_rate() -> None:
    bucket = TokenBucket(now=0.0)
    target = bucket.reserve(10, now=0.0)
    assert bucket.delay(target, now=5.0) == math.inf
    bucket.set_rate(100, burst=0, now=5.0)
    assert bucket.delay(target, now=5.0) == pytest.approx(0.1)
    assert bucket.delay(target, now=5.1) == 0


def test_reservations_are_served_in_arrival_order() -> None:
    bucket = TokenBucket(rate=100, burst=0, now=0.0)
    targets = [bucket.reserve(50, now=0.0) for _ in range(4)]
    delays = [bucket.delay(t, now=0.0) for t in targets]
    assert delays == pytest.approx([0.5, 1.0, 1.5, 2.0])
    # At t = 1.0 exactly the first two are covered, the later ones are not.
    assert [bucket.delay(t, now=1.0) == 0 for t in targets] == [True, True, False, False]


def test_a_request_larger_than_the_burst_waits_proportionally() -> None:
    bucket = TokenBucket(rate=100, burst=10, now=0.0)
    assert bucket.level(now=60.0) == 10  # full after a long idle time, never more
    target = bucket.reserve(1000, now=60.0)
    assert bucket.delay(target, now=60.0) == pytest.approx((1000 - 10) / 100)
    assert bucket.delay(target, now=60.0 + 9.9) == 0


def test_burst_caps_only_unreserved_tokens() -> None:
    bucket = TokenBucket(rate=100, burst=10, now=0.0)
    target = bucket.reserve(500, now=0.0)
    # Tokens flowing to an outstanding reservation are not capped by the burst ...
    assert bucket.level(now=3.0) == pytest.approx(300 - 500)
    assert bucket.filled == pytest.approx(300)
    assert bucket.delay(target, now=5.0) == 0
    # ... but once it is covered the surplus beyond the burst is lost.
    assert bucket.level(now=100.0) == pytest.approx(10)


def test_rate_change_shortens_and_extends_waits() -> None:
    bucket = TokenBucket(rate=100, burst=0, now=0.0)
    target = bucket.reserve(200, now=0.0)
    assert bucket.delay(target, now=0.0) == pytest.approx(2.0)
    bucket.set_rate(200, burst=0, now=1.0)  # 100 earned at the old rate, 100 to go
    assert bucket.delay(target, now=1.0) == pytest.approx(0.5)
    bucket.set_rate(50, burst=0, now=1.25)  # 150 earned, 50 to go at 50/s
    assert bucket.delay(target, now=1.25) == pytest.approx(1.0)
    bucket.set_rate(0, burst=0, now=1.5)
    assert bucket.delay(target, now=10.0) == math.inf


def test_unthrottled_covers_everything_at_once_and_still_counts() -> None:
    bucket = TokenBucket(rate=math.inf, burst=0, now=0.0)
    target = bucket.reserve(10**12, now=0.0)
    assert bucket.delay(target, now=0.0) == 0
    assert bucket.taken == 10**12
    # Back to a finite rate: the next request waits for its own tokens only.
    bucket.set_rate(1000, burst=0, now=1.0)
    target = bucket.reserve(500, now=1.0)
    assert bucket.delay(target, now=1.0) == pytest.approx(0.5)


def test_a_clock_stepping_back_does_not_drain_or_fill() -> None:
    bucket = TokenBucket(rate=100, burst=1000, now=10.0)
    assert bucket.level(now=11.0) == pytest.approx(100)
    assert bucket.level(now=5.0) == pytest.approx(100)
    assert bucket.level(now=11.5) == pytest.approx(150)


def test_zero_byte_requests_pass_when_nothing_is_owed() -> None:
    bucket = TokenBucket(rate=0, burst=0, now=0.0)
    assert bucket.delay(bucket.reserve(0, now=0.0), now=0.0) == 0


@pytest.mark.parametrize(("rate", "burst"), [(-1, 0), (math.nan, 0), (1, -1), (1, math.inf)])
def test_rejects_invalid_rate_or_burst(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=rate, burst=burst)


def test_large_counters_keep_their_precision() -> None:
    bucket = TokenBucket(rate=1e9, burst=0, now=0.0)
    for step in range(1, 1000):
        target = bucket.reserve(1e9, now=float(step - 1))
        assert bucket.delay(target, now=float(step)) == 0


# -------------------------------------------------------------------------- Throttle


def test_unthrottled_acquire_returns_at_once_and_counts() -> None:
    throttle = Throttle()
    throttle.set_rate(math.inf, 0)
    for _ in range(3):
        throttle.acquire(1000)
    stats = throttle.snapshot()
    assert (stats.bytes, stats.acquires, stats.waiting) == (3000, 3, False)
    assert stats.wait_seconds == 0


def test_rate_change_wakes_a_blocked_thread() -> None:
    notices: list[str] = []
    throttle = Throttle(on_wait_start=lambda: notices.append("waiting"))
    done = threading.Event()
    worker = threading.Thread(target=lambda: (throttle.acquire(10), done.set()))
    worker.start()
    # rate 0: it must block, not return
    wait_until(lambda: throttle.waiting or done.is_set(), message="the acquire blocking")
    assert not done.is_set()
    throttle.set_rate(1e9, 0)
    assert done.wait(2)
    worker.join()
    assert notices == ["waiting"]
    assert throttle.total_wait_seconds > 0


def test_close_makes_blocked_threads_raise() -> None:
    throttle = Throttle()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            throttle.acquire(1)
        except RuntimeError as err:
            errors.append(err)

    worker = threading.Thread(target=work)
    worker.start()
    wait_until(lambda: throttle.waiting, message="the acquire waiting")
    throttle.close()
    worker.join(2)
    assert [str(e) for e in errors] == ["session is closed"]
    with pytest.raises(RuntimeError, match="closed"):
        throttle.acquire(0)


def test_wait_notice_is_sent_once_per_reported_transition() -> None:
    notices: list[int] = []
    throttle = Throttle(on_wait_start=lambda: notices.append(1))
    throttle.set_rate(1e6, 0)
    throttle.acquire(1000)
    throttle.acquire(1000)
    assert len(notices) == 1  # no report said "not waiting" in between
    throttle.snapshot()  # not reported: changes nothing
    throttle.acquire(1000)
    assert len(notices) == 1
    throttle.snapshot(reported=True)  # the controller now believes nobody waits
    throttle.acquire(1000)
    assert len(notices) == 2


def test_wait_seconds_include_an_ongoing_wait() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock)
    worker = threading.Thread(target=throttle.acquire, args=(10,))
    worker.start()
    wait_until(lambda: throttle.waiting, message="the acquire waiting")
    clock.now += 2.0
    stats = throttle.snapshot()
    assert stats.waiting and stats.wait_seconds == pytest.approx(2.0)
    throttle.set_rate(math.inf, 0)
    worker.join(2)
    assert throttle.snapshot().wait_seconds == pytest.approx(2.0)


async def test_async_waiters_are_woken_by_a_rate_change() -> None:
    throttle = Throttle()
    waiter = asyncio.create_task(throttle.acquire_async(100))
    await async_wait_until(lambda: throttle.waiting, interval=0, message="the waiter waiting")
    assert not waiter.done()
    throttle.set_rate(1e9, 0)
    await asyncio.wait_for(waiter, 2)


async def test_async_waiters_are_paced_in_arrival_order() -> None:
    throttle = Throttle()
    throttle.set_rate(10_000, 0)  # 100 bytes take 10 ms
    finished: list[int] = []

    async def work(index: int) -> None:
        await throttle.acquire_async(100)
        finished.append(index)

    await asyncio.gather(*(work(i) for i in range(5)))
    assert finished == [0, 1, 2, 3, 4]


async def test_async_close_raises_in_waiters() -> None:
    throttle = Throttle()
    waiter = asyncio.create_task(throttle.acquire_async(1))
    await async_wait_until(lambda: throttle.waiting, interval=0, message="the waiter waiting")
    throttle.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(waiter, 2)
    assert not throttle.waiting


# -------------------------------------------------------------------------- issue 15, finding 7


def test_a_rate_below_the_floor_is_zero() -> None:
    """A residue (6.2e-9 B/s was seen) means "wait", not "wait n / 6.2e-9 seconds"."""
    bucket = TokenBucket(rate=6.2e-9, burst=0, now=0.0)
    assert bucket.rate == 0
    target = bucket.reserve(64 * 1024, now=0.0)
    assert bucket.delay(target, now=0.0) == math.inf
    bucket.set_rate(MIN_RATE / 2, 0, now=1.0)
    assert bucket.rate == 0
    bucket.set_rate(MIN_RATE, 0, now=1.0)
    assert bucket.rate == MIN_RATE


@pytest.mark.parametrize("delay", [math.inf, 1e13, threading.TIMEOUT_MAX * 2, 12.5])
def test_every_wait_is_a_finite_slice(delay: float) -> None:
    assert 0 < wait_slice(delay) <= MAX_WAIT_SLICE
    assert wait_slice(delay) <= threading.TIMEOUT_MAX
    assert wait_slice(0.25) == 0.25
    assert wait_slice(math.nan) == 0.0
    assert wait_slice(-1.0) == 0.0


def test_a_long_wait_never_raises_and_ends_on_a_rate_change() -> None:
    throttle = Throttle()
    throttle.set_rate(MIN_RATE, 0)  # 1 B/s: 1 TiB takes 2**40 s, past threading.TIMEOUT_MAX
    errors: list[BaseException] = []
    done = threading.Event()

    def worker() -> None:
        try:
            throttle.acquire(1 << 40)
        except BaseException as exc:
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    wait_until(lambda: throttle.waiting or done.is_set())
    throttle.set_rate(math.inf, 0)
    assert done.wait(5)
    thread.join(5)
    assert not errors


def test_rate_observer_sees_each_change_after_the_floor() -> None:
    seen: list[float] = []
    throttle = Throttle(on_rate_change=seen.append)
    throttle.set_rate(6.2e-9, 0)  # floored to 0: no change from the initial 0
    throttle.set_rate(100.0, 10)
    throttle.set_rate(100.0, 20)  # same rate: not a change
    throttle.set_rate(0.5, 0)
    assert seen == [100.0, 0.0]
