"""Algorithm 3 ([DPSAC] §4.4.3) for one cluster and one time unit."""

from __future__ import annotations

import random

import pytest

from burstctl.policies.dpsac.algorithm3 import full_probability, schedule
from burstctl.policies.dpsac.dist import LoadDistribution


def test_everything_fits_the_pfs_share_and_the_spare_share_drains() -> None:
    tick = schedule([("a", 3.0), ("b", 4.0)], pfs=10.0, quota=50.0, load=2.0, p_full=0.9,
                    rng=random.Random(0))  # fmt: skip
    assert tick.granted == (("a", 3.0), ("b", 4.0))
    assert (tick.to_pfs, tick.to_buffer, tick.drain, tick.load) == (7.0, 0.0, 2.0, 0.0)
    # the drain is bounded by the spare share, not only by the load
    tick = schedule([("a", 8.0)], pfs=10.0, quota=50.0, load=5.0, p_full=0.0,
                    rng=random.Random(0))  # fmt: skip
    assert (tick.drain, tick.load) == (2.0, 3.0)


def test_p_full_zero_buffers_exactly_the_m_th() -> None:
    apps = [("a", 6.0), ("b", 6.0), ("c", 6.0), ("d", 6.0)]
    tick = schedule(apps, pfs=10.0, quota=50.0, load=0.0, p_full=0.0, rng=random.Random(1))
    # m = b (6 < 10 ≤ 12): a and b selected with certainty, c and d with 0^1·1 = 0
    assert tick.granted == (("a", 6.0), ("b", 6.0))
    assert (tick.to_pfs, tick.to_buffer, tick.drain, tick.load) == (10.0, 2.0, 0.0, 2.0)
    assert tick.buffered


def test_p_full_one_selects_nobody_past_m_and_drains_the_spare() -> None:
    apps = [("a", 6.0), ("b", 6.0), ("c", 6.0)]
    tick = schedule(apps, pfs=10.0, quota=50.0, load=3.0, p_full=1.0, rng=random.Random(1))
    assert tick.granted == (("a", 6.0),)
    assert (tick.to_pfs, tick.to_buffer, tick.drain, tick.load) == (6.0, 0.0, 3.0, 0.0)


def test_line_15_sign_fixed_overflow_means_pfs_only() -> None:
    apps = [("a", 6.0), ("b", 6.0)]
    # L + (12 − 10) = 9 + 2 ≥ quota 10: no buffering, the m-th gets the rest of the share.
    # (The paper's printed test, 12 − 9 − 10 < 10, would have buffered and overflowed.)
    tick = schedule(apps, pfs=10.0, quota=10.0, load=9.0, p_full=0.0, rng=random.Random(1))
    assert tick.granted == (("a", 6.0), ("b", 4.0))
    assert (tick.to_pfs, tick.to_buffer, tick.drain, tick.load) == (10.0, 0.0, 0.0, 9.0)
    assert not tick.buffered
    # one unit more of room: buffered
    tick = schedule(apps, pfs=10.0, quota=11.1, load=9.0, p_full=0.0, rng=random.Random(1))
    assert tick.granted == (("a", 6.0), ("b", 6.0)) and tick.load == pytest.approx(11.0)


def test_line_14_draws_are_geometric_and_seeded() -> None:
    apps = [("a", 10.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)]  # m = a (the first), pfs 10
    counts = dict.fromkeys("abcd", 0)
    rng = random.Random(5)
    runs = 20000
    for _ in range(runs):
        tick = schedule(apps, pfs=10.0, quota=1e9, load=0.0, p_full=0.5, rng=rng)
        for a, _ in tick.granted:
            counts[a] += 1
    # i ≥ m: P_full^(i−m)·(1 − P_full) = 0.5, 0.25, 0.125, 0.0625, each independent
    for app, want in zip("abcd", [0.5, 0.25, 0.125, 0.0625], strict=True):
        assert counts[app] / runs == pytest.approx(want, abs=0.015), app
    one = schedule(apps, 10.0, 1e9, 0.0, 0.5, random.Random(42))
    assert schedule(apps, 10.0, 1e9, 0.0, 0.5, random.Random(42)) == one


def test_full_probability_is_the_tail_at_quota_plus_share_minus_load() -> None:
    dist = LoadDistribution(quantum=2.0)
    dist.add(5, 0.5)  # a load of 10 with probability 1/2
    dist.add(10, 0.25)  # 20 with 1/4
    # (S + B)·U − L = 8 + 4 − 2 = 10 → Pr(X ≥ 10) = 1 − Pr(X = 0) = 1 − 0.375
    assert full_probability(dist, quota=8.0, pfs=4.0, load=2.0) == pytest.approx(0.625)
    # 20 + 4 − 2 = 22 → only the load 30 (both at once): 0.5·0.25
    assert full_probability(dist, quota=20.0, pfs=4.0, load=2.0) == pytest.approx(0.125)
    assert full_probability(dist, quota=40.0, pfs=4.0, load=0.0) == 0.0


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="p_full"):
        schedule([], 1.0, 1.0, 0.0, 1.5, random.Random(0))
    with pytest.raises(ValueError, match=">= 0"):
        schedule([], -1.0, 1.0, 0.0, 0.5, random.Random(0))
