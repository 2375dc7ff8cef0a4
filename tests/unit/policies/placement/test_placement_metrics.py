"""The metrics of [DIST-IO] §III-C: ρ ≥ 1, ρ_io ≥ 1, BestBdw gives ρ_io ≡ 1, and the formulas."""

from __future__ import annotations

import random

import pytest
from placement_instances import Q_CPU, SEEDS, instance

from burstctl.policies.placement.allocators import ALLOCATORS, best_bdw
from burstctl.policies.placement.metrics import (
    io_spread,
    machine_idle_time,
    max_slowdown,
    mean_slowdown,
    resource_occupancy,
    slowdown,
)
from burstctl.policies.placement.model import Profile, t_cf_io


@pytest.mark.parametrize("seed", SEEDS)
def test_slowdown_invariants(seed: int) -> None:
    """For any allocation and any measured time at least the congestion-free one: ρ ≥ 1,
    ρ_io ≥ 1, ρ_con ≥ 0; BestBdw gives ρ_io = 1 for every application."""
    apps, N = instance(seed)
    rng = random.Random(seed)
    for fn in ALLOCATORS.values():
        pi = fn(apps, N, Q_CPU, rng)
        for a, n in zip(apps, pi, strict=True):
            assert a.profile is not None and a.v_io is not None
            t = t_cf_io(a, n) * (1 + rng.expovariate(1.0))  # some congestion
            s = slowdown(t, a.v_io, n, a.profile, N)
            assert s.rho >= 1 - 1e-12
            assert s.rho_io >= 1
            assert s.rho_con >= -1e-12
            assert s.rho == pytest.approx(s.rho_io + s.rho_con)
    for a, n in zip(apps, best_bdw(apps, N, Q_CPU, rng), strict=True):
        assert a.profile is not None and a.v_io is not None
        assert slowdown(t_cf_io(a, n), a.v_io, n, a.profile, N).rho_io == 1.0


def test_slowdown_worked_example() -> None:
    p = Profile((1.0, 4.0, 2.0))
    # n_perf = 2, b = 4; on n = 3 (b = 2) V = 8 takes 4 s free; measured 6 s
    s = slowdown(6.0, 8.0, 3, p, 10)
    assert (s.rho, s.rho_io, s.rho_con) == pytest.approx((3.0, 2.0, 1.0))
    # with N = 1, n_perf is 1: measured against b(1)
    assert slowdown(8.0, 8.0, 1, p, 1).rho == 1.0
    with pytest.raises(ValueError, match="io_time"):
        slowdown(0.0, 8.0, 1, p, 3)
    with pytest.raises(ValueError, match="outside"):
        slowdown(1.0, 8.0, 4, p, 3)


def test_aggregates() -> None:
    assert mean_slowdown([1.0, 2.0, 6.0]) == 3.0
    assert max_slowdown([1.0, 2.0, 6.0]) == 6.0
    occ = resource_occupancy([10.0, 40.0, 25.0], 50.0)
    assert occ == [0.2, 0.8, 0.5]
    assert io_spread(occ) == pytest.approx(0.6)
    # two apps, Q = 100 and 380 of 480; I/O times 10 s and 5 s over 100 s
    assert machine_idle_time([10.0, 5.0], [100, 380], 100.0, 480) == pytest.approx(
        (10 * 100 + 5 * 380) / (100 * 480)
    )
    for bad in ([],):
        with pytest.raises(ValueError):
            mean_slowdown(bad)
        with pytest.raises(ValueError):
            io_spread(bad)
    with pytest.raises(ValueError, match="sizes"):
        machine_idle_time([1.0], [], 1.0, 1)
