"""Tokens a window earns are spent in that window (issue 17, live PerSched): a job that was
computing while its window ran must not spend the window's tokens after its end. Found by the
live ``persched`` test: a client arriving between its windows moved a whole bucket depth
(rate × burst_window, 25 % of its volume there) outside its windows."""

from __future__ import annotations

import pytest

from burstctl.client.bucket import Pattern, TokenBucket

RATE = 1000.0  # bytes/s in the window
BURST = 50.0  # the bucket depth: 0.05 s of the window's rate


def bucket_with(windows: list[tuple[float, float, float]], period: float = 1.0) -> TokenBucket:
    bucket = TokenBucket(now=0.0)
    bucket.set_rate(RATE, BURST, 0.0, Pattern(period, 0.0, windows))
    return bucket


def test_tokens_of_a_window_are_not_spent_after_its_end() -> None:
    bucket = bucket_with([(0.2, 0.5, RATE)])
    # Nobody acquires during the window [0.2, 0.5): the bucket fills to its depth there.
    assert bucket.level(0.45) == pytest.approx(BURST)
    # After the window, nothing: an acquire at 0.6 waits for the next window.
    assert bucket.level(0.6) == pytest.approx(0.0)
    target = bucket.reserve(10.0, 0.6)
    assert bucket.delay(target, 0.6) == pytest.approx(1.2 + 0.01 - 0.6)


def test_inside_a_window_the_burst_is_kept_and_reservations_keep_their_tokens() -> None:
    bucket = bucket_with([(0.2, 0.5, RATE)])
    assert bucket.level(0.3) == pytest.approx(BURST)  # capped at the depth, not dropped
    target = bucket.reserve(400.0, 0.3)  # 350 short; the rest of this window gives 200
    assert bucket.delay(target, 0.3) == pytest.approx(1.35 - 0.3)
    # Tokens earned for the waiting reservation are not lost at the gap.
    assert bucket.level(0.9) == pytest.approx(BURST + 200.0 - 400.0)
    assert bucket.delay(target, 0.9) == pytest.approx(1.35 - 0.9)


def test_contiguous_windows_and_a_window_across_the_period_are_one_run() -> None:
    # [0.8, 1.0) + [0.0, 0.1) wrap into one run; [0.1, 0.3) at another rate continues it.
    bucket = bucket_with([(0.8, 1.1, RATE), (0.1, 0.3, 2 * RATE)])
    assert bucket.level(0.95) == pytest.approx(BURST)
    assert bucket.level(1.05) == pytest.approx(BURST)  # across the period's end: kept
    assert bucket.level(1.2) == pytest.approx(BURST)  # into the next window: kept
    assert bucket.level(1.4) == pytest.approx(0.0)  # after the run: dropped
