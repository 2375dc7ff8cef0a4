"""The model of [DIST-IO] §III: profiles and their domain, I/O-Stress, n_perf, n_sys,
I/O-load; the issue-19 invariants that concern the model."""

from __future__ import annotations

import math
import random

import pytest
from placement_instances import SEEDS, instance

from burstctl.policies.placement.model import (
    App,
    Profile,
    cpu_load,
    io_load,
    io_stress,
    n_perf,
    n_sys,
    t_cf_io,
)


def test_profile_is_capped_beyond_its_largest_count() -> None:
    p = Profile((1.0, 2.0, 3.0))
    assert [p(n) for n in range(1, 7)] == [1.0, 2.0, 3.0, 3.0, 3.0, 3.0]
    assert p.array(5).tolist() == [1.0, 2.0, 3.0, 3.0, 3.0]
    assert p.array(2).tolist() == [1.0, 2.0]


def test_profile_from_points_interpolates_and_scales_below() -> None:
    p = Profile.from_points({2: 4.0, 4: 8.0, 8: 4.0})
    assert p.n_max == 8
    assert p.measured == frozenset({2, 4, 8})
    assert p(1) == pytest.approx(2.0)  # b(2)·1/2
    assert p(3) == pytest.approx(6.0)
    assert p(6) == pytest.approx(6.0)
    assert p(20) == 4.0


@pytest.mark.parametrize(
    "points", [{}, {0: 1.0}, {1: 0.0}, {1: -1.0}, {1: math.nan}, {1: math.inf}]
)
def test_profile_rejects_bad_points(points: dict[int, float]) -> None:
    with pytest.raises(ValueError):
        Profile.from_points(points)


def test_app_rejects_bad_fields() -> None:
    with pytest.raises(ValueError, match="q"):
        App("a", q=0)
    with pytest.raises(ValueError, match="v_io"):
        App("a", q=1, v_io=0.0)
    with pytest.raises(ValueError, match="t_cpu"):
        App("a", q=1, t_cpu=-1.0)
    with pytest.raises(ValueError, match="n_perf_hint"):
        App("a", q=1, n_perf_hint=0)


def test_levels() -> None:
    p = Profile((1.0, 2.0))
    assert App("a", 1).level == 0
    assert App("a", 1, n_perf_hint=3).level == 1
    assert App("a", 1, profile=p).level == 1
    assert App("a", 1, t_cpu=1.0, v_io=2.0).level == 0
    assert App("a", 1, t_cpu=1.0, v_io=2.0, profile=p).level == 2


def test_formulas_on_a_worked_example() -> None:
    # b = 1, 2, 2.5; V = 10, T_cpu = 10
    app = App("a", q=8, t_cpu=10.0, v_io=10.0, profile=Profile((1.0, 2.0, 2.5)))
    assert t_cf_io(app, 2) == 5.0
    assert io_stress(app, 1) == pytest.approx(1 * 10 / 20)
    assert io_stress(app, 2) == pytest.approx(2 * 5 / 15)
    assert io_stress(app, 3) == pytest.approx(3 * 4 / 14)
    assert cpu_load(app, 2) == pytest.approx(8 * 10 / 15)
    assert n_perf(app, 10) == 3
    assert n_perf(app, 2) == 2  # never beyond N
    assert n_sys(app, 10) == 1
    assert io_load([app, app], [1, 2], 4) == pytest.approx((0.5 + 10 / 15) / 4)


def test_ties_go_to_the_smallest_count() -> None:
    flat = App("a", q=1, t_cpu=1.0, v_io=1.0, profile=Profile((2.0, 2.0, 2.0)))
    assert n_perf(flat, 5) == 1
    assert n_sys(flat, 5) == 1
    # a tie in stress: T_cpu = 1, T(1) = 2, T(2) = 0.5 give I/O-Stress 2/3 at n = 1 and 2
    tie = App("t", q=1, t_cpu=1.0, v_io=2.0, profile=Profile((1.0, 4.0)))
    assert io_stress(tie, 1) == io_stress(tie, 2)
    assert n_sys(tie, 5) == 1
    hint = App("b", q=1, n_perf_hint=7)
    assert n_perf(hint, 5) == 5
    assert n_perf(hint, 9) == 7


def test_level_two_functions_refuse_missing_data() -> None:
    with pytest.raises(ValueError, match="level 2"):
        io_stress(App("a", q=1, n_perf_hint=2), 1)
    with pytest.raises(ValueError, match="neither"):
        n_perf(App("a", q=1), 4)
    app = App("a", q=1, t_cpu=1.0, v_io=1.0, profile=Profile((1.0,)))
    with pytest.raises(ValueError, match=r"1\.\.3"):
        io_load([app], [4], 3)
    with pytest.raises(ValueError, match="counts"):
        io_load([app], [], 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_nsys_below_nperf_and_pi_sys_minimises_io_load(seed: int) -> None:
    """n_sys ≤ n_perf (Lemma 1), and I/O-load(π_sys) ≤ I/O-load(π) for random π over 1..N
    (counts beyond a profile's n_max included: the capped domain)."""
    apps, N = instance(seed)
    rng = random.Random(seed)
    pi_sys = [n_sys(a, N) for a in apps]
    for a, ns in zip(apps, pi_sys, strict=True):
        assert 1 <= ns <= n_perf(a, N) <= min(N, a.profile.n_max)  # type: ignore[union-attr]
        # n_sys is the true minimum over the whole of 1..N, not only over 1..n_perf
        assert all(io_stress(a, ns) <= io_stress(a, n) for n in range(1, N + 1))
    low = io_load(apps, pi_sys, N)
    for _ in range(5):
        pi = [rng.randint(1, N) for _ in apps]
        assert low <= io_load(apps, pi, N) + 1e-12
