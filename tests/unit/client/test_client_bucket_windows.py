"""Pacing to a periodic pattern of windows (issue 17): the pattern's math and the token bucket
that refills by it, on explicit clock values; the wire check of a pattern (common/limits.py)."""

from __future__ import annotations

import itertools
import math
import threading

import pytest
from support import wait_until
from support.clock import FakeClock

from burstctl.client.bucket import Pattern, Throttle, TokenBucket
from burstctl.common.limits import MAX_WINDOWS, windows_problem

EPS = 1e-9


def drain(bucket: TokenBucket, start: float, until: float, chunk: float) -> list[float]:
    """A caller that acquires ``chunk`` bytes back to back from ``start``: each grant time."""
    now, grants = start, []
    while now < until:
        target = bucket.reserve(chunk, now)
        now += bucket.delay(target, now)
        assert bucket.delay(target, now) == 0  # the computed wait is enough, never short
        grants.append(now)
    return grants


def phase(t: float, origin: float, period: float) -> float:
    return (t - origin) % period


# -------------------------------------------------------------------------- Pattern


def test_volume_is_the_integral_of_the_windows() -> None:
    pattern = Pattern(1.0, 10.0, [(0.0, 0.3, 100.0)])
    assert pattern.total == pytest.approx(30.0)
    assert pattern.mean_rate() == pytest.approx(30.0)
    assert pattern.volume(10.0, 11.0) == pytest.approx(30.0)
    assert pattern.volume(10.3, 11.0) == pytest.approx(0.0)
    assert pattern.volume(9.9, 10.1) == pytest.approx(10.0)  # before the origin too
    assert pattern.volume(10.0, 13.15) == pytest.approx(3 * 30 + 15)
    assert pattern.rate_at(12.2) == 100.0
    assert pattern.rate_at(12.5) == 0.0


def test_time_to_waits_for_the_next_window() -> None:
    pattern = Pattern(1.0, 10.0, [(0.0, 0.3, 100.0)])
    assert pattern.time_to(10.5, 10.0) == pytest.approx(11.1)  # outside: from the next start
    assert pattern.time_to(10.0, 30.0) == pytest.approx(10.3)  # exactly the whole window
    assert pattern.time_to(10.0, 31.0) == pytest.approx(11.01)  # one byte more: next period
    assert pattern.time_to(10.2, 95.0) == pytest.approx(13.25)  # 10 + 30 + 30 + 25


def test_a_window_wraps_around_the_period() -> None:
    pattern = Pattern(1.0, 0.0, [(0.8, 1.2, 10.0)])
    assert pattern.volume(0.0, 1.0) == pytest.approx(4.0)
    assert pattern.volume(0.9, 1.1) == pytest.approx(2.0)
    assert pattern.rate_at(5.1) == 10.0
    assert pattern.rate_at(5.5) == 0.0
    # 2 bytes at the end of one period, 2 at the start of the next: no gap in between
    assert pattern.time_to(0.5, 4.0) == pytest.approx(1.2)


def test_a_pattern_that_moves_nothing_waits_for_ever() -> None:
    assert Pattern(1.0, 0.0, [(0.1, 0.2, 0.0)]).time_to(0.0, 1.0) == math.inf
    assert Pattern(1.0, 0.0, []).time_to(0.0, 1.0) == math.inf
    assert Pattern(1.0, 0.0, [(0.1, 0.2, 0.5)]).total == 0  # below MIN_RATE: paced as 0


# -------------------------------------------------------------------------- TokenBucket


@pytest.mark.parametrize("chunk", [1.0, 7.0])
def test_bytes_are_granted_only_inside_windows(chunk: float) -> None:
    origin, period = 100.25, 1.0
    pattern = Pattern(period, origin, [(0.0, 0.3, 100.0)])
    bucket = TokenBucket(now=100.0)
    bucket.set_rate(pattern.mean_rate(), burst=5.0, now=100.0, pattern=pattern)
    grants = drain(bucket, 100.0, 110.0, chunk)
    assert grants
    for t in grants:
        assert phase(t, origin, period) <= 0.3 + EPS or phase(t, origin, period) >= period - EPS
    # The rate inside a window is the window's: 30 bytes a period, whatever the chunk.
    moved = chunk * len(grants)
    assert moved == pytest.approx(30.0 * (110.0 - origin) / period, abs=30.0 + chunk)


def test_wrap_around_windows_grant_on_both_sides_of_the_period_boundary() -> None:
    pattern = Pattern(1.0, 0.0, [(0.8, 1.2, 10.0)])
    bucket = TokenBucket(now=0.0)
    bucket.set_rate(pattern.mean_rate(), burst=1.0, now=0.0, pattern=pattern)
    grants = drain(bucket, 0.0, 5.0, 0.5)
    phases = [phase(t, 0.0, 1.0) for t in grants]
    assert all(p >= 0.8 - EPS or p <= 0.2 + EPS for p in phases)
    assert any(p > 0.85 for p in phases) and any(0.0 < p < 0.15 for p in phases)
    assert len(grants) * 0.5 == pytest.approx(4.0 * 5, abs=1.0)


def test_each_window_flows_at_its_own_rate() -> None:
    pattern = Pattern(1.0, 0.0, [(0.0, 0.2, 100.0), (0.5, 0.6, 400.0)])
    bucket = TokenBucket(now=0.0)
    bucket.set_rate(pattern.mean_rate(), burst=1.0, now=0.0, pattern=pattern)
    grants = drain(bucket, 0.0, 10.0, 1.0)
    first = [t for t in grants if phase(t, 0.0, 1.0) <= 0.2 + EPS]
    second = [t for t in grants if 0.5 - EPS <= phase(t, 0.0, 1.0) <= 0.6 + EPS]
    assert len(first) + len(second) == len(grants)
    # duration x rate per window, give or take the 1-byte burst carried into each window
    assert len(first) == pytest.approx(20 * 10, abs=10)
    assert len(second) == pytest.approx(40 * 10, abs=10)
    # 100 B/s: grants 10 ms apart in the first window; 400 B/s: 2.5 ms in the second
    gaps = [b - a for a, b in itertools.pairwise(grants)]
    assert min(gaps) == pytest.approx(1 / 400)
    assert max(g for g in gaps if g < 0.2) == pytest.approx(1 / 100)


def test_unused_window_time_is_not_carried_over_beyond_the_burst() -> None:
    pattern = Pattern(1.0, 0.0, [(0.0, 0.3, 100.0)])
    bucket = TokenBucket(now=0.0)
    bucket.set_rate(pattern.mean_rate(), burst=5.0, now=0.0, pattern=pattern)
    # Idle for ten periods: ten windows' worth (300 bytes) went by unused; inside a window
    # the bucket holds at most the burst, and between windows nothing (the window's tokens
    # are spent in the window: test_bucket_window_tokens.py).
    assert bucket.level(now=9.2) == pytest.approx(5.0)
    assert bucket.level(now=9.5) == pytest.approx(0.0)
    # 30 bytes from the next window's start: the whole window; one byte more waits for the
    # window after.
    target = bucket.reserve(30.0, now=10.0)
    assert bucket.delay(target, now=10.0) == pytest.approx(0.3)
    target = bucket.reserve(1.0, now=10.0)
    assert bucket.delay(target, now=10.0) == pytest.approx(1.01)


def test_a_new_rate_without_windows_drops_the_pattern() -> None:
    pattern = Pattern(1.0, 0.0, [(0.0, 0.3, 100.0)])
    bucket = TokenBucket(now=0.0)
    bucket.set_rate(30.0, burst=1.0, now=0.0, pattern=pattern)
    bucket.set_rate(50.0, burst=1.0, now=0.5)
    assert bucket.pattern is None
    target = bucket.reserve(10.0, now=0.5)
    # the window's burst was dropped at its end; then 50 B/s at once: no window to wait for
    assert bucket.delay(target, now=0.5) == pytest.approx(10 / 50)


def test_a_throttle_waiter_is_released_by_a_pattern_whose_window_is_open() -> None:
    clock = FakeClock(100.0)
    throttle = Throttle(clock=clock)
    done = threading.Event()

    def acquire() -> None:
        throttle.acquire(1000)
        done.set()

    thread = threading.Thread(target=acquire)
    thread.start()
    try:
        wait_until(lambda: throttle.waiting, message="the acquire to wait on rate 0")
        # The window [99.5, 101.5) is open; 1000 bytes at 1e9 B/s take a microsecond.
        throttle.set_rate(1e8, 0.0, Pattern(10.0, 99.5, [(0.0, 2.0, 1e9)]))
        clock.now = 100.001
        throttle.set_rate(1e8, 0.0, Pattern(10.0, 99.5, [(0.0, 2.0, 1e9)]))
        wait_until(done.is_set, message="the acquire to be served inside the window")
        assert throttle.pattern is not None
    finally:
        throttle.close()
        thread.join(5)


# -------------------------------------------------------------------------- windows_problem


def test_a_well_formed_pattern_has_no_problem() -> None:
    assert windows_problem(1.0, [(0.1, 0.3, 10.0), (0.5, 1.05, 0.0)]) is None
    assert windows_problem(1.0, [(0.2, 1.2, 10.0)]) is None  # the whole period, wrapped
    assert windows_problem(1.0, []) is None


@pytest.mark.parametrize(
    ("period", "windows", "field"),
    [
        (0.0, [], "period_seconds"),
        (-1.0, [], "period_seconds"),
        (math.nan, [], "period_seconds"),
        (math.inf, [], "period_seconds"),
        (1e9, [], "period_seconds"),
        (1.0, [(-0.1, 0.2, 1.0)], "window[0].start_seconds"),
        (1.0, [(math.nan, 0.2, 1.0)], "window[0].start_seconds"),
        (1.0, [(1.0, 1.2, 1.0)], "window[0].start_seconds"),
        (1.0, [(0.5, 0.5, 1.0)], "window[0].end_seconds"),
        (1.0, [(0.5, 0.4, 1.0)], "window[0].end_seconds"),
        (1.0, [(0.5, math.nan, 1.0)], "window[0].end_seconds"),
        (1.0, [(0.5, 1.6, 1.0)], "window[0].end_seconds"),  # longer than the period
        (1.0, [(0.0, 0.1, 1.0), (0.2, 0.3, -1.0)], "window[1].rate"),
        (1.0, [(0.0, 0.1, math.nan)], "window[0].rate"),
        (1.0, [(0.0, 0.1, math.inf)], "window[0].rate"),
        (1.0, [(0.0, 0.3, 1.0), (0.2, 0.4, 1.0)], "window[1].start_seconds"),  # overlap
        (1.0, [(0.1, 0.3, 1.0), (0.8, 1.2, 1.0)], "window[1].end_seconds"),  # wraps over
        (1.0, [(i / 100, i / 100 + 0.005, 1.0) for i in range(MAX_WINDOWS + 1)], "window"),
    ],
)
def test_a_malformed_pattern_names_its_field(
    period: float, windows: list[tuple[float, float, float]], field: str
) -> None:
    problem = windows_problem(period, windows)
    assert problem is not None
    assert problem[0] == field, problem
