"""The allocators of [DIST-IO] §IV-A and MCKP: definitions, the invariants of issue 19
("Acceptance"), TCPU-Allocator against its round-by-round transcription, and speed."""

from __future__ import annotations

import math
import random

import pytest
from placement_instances import Q_CPU, SEEDS, instance

from burstctl.policies.placement.allocators import (
    ALLOCATORS,
    Tables,
    allocate,
    best_bdw,
    mckp,
    nsys_allocator,
    static,
    tcpu_allocator,
    tcpu_reference,
    tcpu_rounds,
)
from burstctl.policies.placement.model import App, Profile, cpu_load, io_load, n_perf, n_sys

RNG = random.Random(0)


def test_registry_names() -> None:
    assert set(ALLOCATORS) == {
        "random",
        "static",
        "best-bdw",
        "nsys-allocator",
        "tcpu-allocator",
        "mckp",
    }
    with pytest.raises(ValueError, match="unknown allocator 'fastest'"):
        allocate("fastest", [], 4, 8)


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_every_allocator_gives_counts_in_range(name: str) -> None:
    for seed in range(60):
        apps, N = instance(seed)
        pi = allocate(name, apps, N, Q_CPU, random.Random(seed))
        assert len(pi) == len(apps)
        assert all(isinstance(n, int) and 1 <= n <= N for n in pi)


def test_static_rounds_half_up_and_clamps() -> None:
    apps = [App(str(q), q) for q in (1, 12, 36, 60, 360, 480)]
    # Q·N/Q^cpu with N = 20, Q^cpu = 480: 0.04, 0.5, 1.5, 2.5 (half up: 3, not 2), 15, 20
    assert static(apps, 20, 480, RNG) == [1, 1, 2, 3, 15, 20]
    assert static([App("x", 600)], 20, 480, RNG) == [20]


@pytest.mark.parametrize("seed", SEEDS)
def test_tcpu_invariants(seed: int) -> None:
    """TCPU-Allocator = BestBdw when I/O-load(π_perf) ≤ 1; its I/O-load exceeds 1 only when
    I/O-load(π_sys) does (and then it is π_sys); it stays between π_sys and π_perf; it
    terminates within Σ(n_perf − n_sys) rounds; the fast version is Algorithm 1 exactly."""
    apps, N = instance(seed)
    pi = tcpu_allocator(apps, N, Q_CPU, RNG)
    perf = best_bdw(apps, N, Q_CPU, RNG)
    sys_ = nsys_allocator(apps, N, Q_CPU, RNG)
    if io_load(apps, perf, N) <= 1:
        assert pi == perf
    load_sys = io_load(apps, sys_, N)
    if io_load(apps, pi, N) > 1 + 1e-9:
        assert load_sys > 1
    if load_sys > 1:
        assert pi == sys_
    assert all(s <= n <= p for s, n, p in zip(sys_, pi, perf, strict=True))
    ref, rounds = tcpu_rounds(apps, N, Q_CPU)
    assert ref == pi
    assert rounds <= sum(p - s for p, s in zip(perf, sys_, strict=True))


def test_tcpu_commits_the_largest_cpuload_gain_first() -> None:
    """Room for one step only: the application of larger Q (larger CPUload gain) gets it
    (Algorithm 1 line 16)."""
    prof = Profile((1.0, 2.0))
    small = App("s", q=1, t_cpu=100.0, v_io=100.0, profile=prof)
    big = App("b", q=50, t_cpu=100.0, v_io=100.0, profile=prof)
    # I/O-Stress at n = 1: 100/200 = 0.5; at n = 2: 2·50/150 = 2/3, a step of 1/6
    assert io_load([small, big], [1, 1], 2) == pytest.approx(0.5)
    assert tcpu_allocator([small, big], 2, Q_CPU, RNG) == [2, 2]
    # load(π_sys) = 2/2 = 1.0: no step fits
    assert tcpu_allocator([small, big, small, small], 2, Q_CPU, RNG) == [1, 1, 1, 1]
    # stress of c at n = 1: 50/150 = 1/3; load(π_sys) = (1.5 + 1/3)/2 ≈ 0.917 and a step
    # adds 1/12 (small, big) or 1/15 (c): exactly one fits, and the big one takes it
    c = App("c", q=1, t_cpu=100.0, v_io=50.0, profile=prof)
    apps = [small, big, small, c]
    assert tcpu_allocator(apps, 2, Q_CPU, RNG) == [1, 2, 1, 1]
    assert io_load(apps, [1, 2, 1, 1], 2) <= 1


def test_tcpu_line_15_reading_gain_against_the_current_count() -> None:
    """Non-monotone b: n=2 is a dip, n=3 the best. The gain of n=3 is measured against π(i)
    = 1 (the stated intent), so the application reaches 3 in one step."""
    app = App("a", q=4, t_cpu=100.0, v_io=100.0, profile=Profile((1.0, 0.5, 3.0)))
    assert n_sys(app, 3) == 1
    assert n_perf(app, 3) == 3
    assert tcpu_allocator([app], 3, Q_CPU, RNG) == [3]
    assert tcpu_rounds([app], 3, Q_CPU)[1] == 1


def test_tcpu_line_15_reading_never_trades_cpuload_away() -> None:
    """b = 1, 0.5, 0.8, 1.1 and room for n = 3 but not n = 4. The literal layout of line 15
    would move π̃(a) to 2, then accept n = 3 for its gain over n = 2 although CPUload(a, 3) <
    CPUload(a, 1); measured against π(a) = 1 (the reading implemented) no step is taken."""
    a = App("a", q=4, t_cpu=100.0, v_io=100.0, profile=Profile((1.0, 0.5, 0.8, 1.1)))
    other = App("o", q=1, t_cpu=400.0, v_io=100.0, profile=Profile((1.0,)))
    # stress(a): 0.5, 4/3, 5/3, ≈1.905; 11 others of stress 0.2; N = 4: room while
    # stress(a) ≤ 4 − 2.2 = 1.8
    apps = [a] + [other] * 11
    assert io_load(apps, [3] + [1] * 11, 4) <= 1 < io_load(apps, [4] + [1] * 11, 4)
    assert cpu_load(a, 3) < cpu_load(a, 1) < cpu_load(a, 4)
    assert tcpu_allocator(apps, 4, Q_CPU, RNG) == [1] * 12


def test_tcpu_accepts_a_zero_gain() -> None:
    """Algorithm 1 line 17 stops only on a negative gain: with b = 1, 1, 1.5 and room for
    n = 2 but not n = 3, the application takes the step to 2 (gain 0)."""
    a = App("a", q=4, t_cpu=100.0, v_io=100.0, profile=Profile((1.0, 1.0, 1.5)))
    other = App("o", q=1, t_cpu=900.0, v_io=100.0, profile=Profile((1.0,)))
    # stress(a): 0.5, 1.0, 1.2; 19 others of stress 0.1; N = 3: room while stress(a) ≤ 1.1
    apps = [a] + [other] * 19
    assert io_load(apps, [2] + [1] * 19, 3) <= 1 < io_load(apps, [3] + [1] * 19, 3)
    assert cpu_load(a, 2) == cpu_load(a, 1)
    assert tcpu_allocator(apps, 3, Q_CPU, RNG) == [2] + [1] * 19


@pytest.mark.parametrize("seed", SEEDS)
def test_tcpu_never_lowers_the_sum_of_cpuload(seed: int) -> None:
    """Every committed step has a gain ≥ 0 against π(i), so Σ CPUload(π) ≥ Σ CPUload(π_sys)
    and ≥ that of any single step's start (the line-15 reading)."""
    apps, N = instance(seed)
    pi = tcpu_allocator(apps, N, Q_CPU, RNG)
    sys_ = nsys_allocator(apps, N, Q_CPU, RNG)
    for app, n, s in zip(apps, pi, sys_, strict=True):
        assert cpu_load(app, n) >= cpu_load(app, s)


@pytest.mark.parametrize("seed", SEEDS)
def test_mckp_respects_its_constraint_and_is_optimal(seed: int) -> None:
    apps, N = instance(seed)
    pi = mckp(apps, N, Q_CPU, RNG)
    cap = N * math.ceil(len(apps) / N)
    assert sum(pi) <= cap
    assert all(1 <= n <= N for n in pi)
    total = sum(a.profile(n) for a, n in zip(apps, pi, strict=True))  # type: ignore[misc]
    if len(apps) <= 3:  # brute force on small instances
        best = _brute_mckp(apps, N, cap)
        assert total == pytest.approx(best)
    # never below π_1 or π_perf-when-it-fits
    assert total >= sum(a.profile(1) for a in apps) - 1e-9  # type: ignore[misc]


def _brute_mckp(apps: list[App], N: int, cap: int) -> float:
    import itertools

    best = -math.inf
    for pi in itertools.product(range(1, N + 1), repeat=len(apps)):
        if sum(pi) <= cap:
            best = max(best, sum(a.profile(n) for a, n in zip(apps, pi, strict=True)))  # type: ignore[misc]
    return best


def test_mckp_favours_exclusive_access() -> None:
    prof = Profile((1.0, 1.9, 2.7, 3.4))
    apps = [App(str(i), 1, 1.0, 1.0, 1, prof) for i in range(3)]
    # 3 apps on 6 resources: 2 each (Σ b = 5.7) beats any other split of 6
    assert mckp(apps, 6, Q_CPU, RNG) == [2, 2, 2]
    # 5 apps on 2 resources: capacity 2·⌈5/2⌉ = 6, so one app gets 2
    apps5 = [App(str(i), 1, 1.0, 1.0, 1, prof) for i in range(5)]
    assert sorted(mckp(apps5, 2, Q_CPU, RNG)) == [1, 1, 1, 1, 2]
    with pytest.raises(ValueError, match="MCKP needs b_j"):
        mckp([App("x", 1, n_perf_hint=2)], 4, Q_CPU, RNG)


def test_tcpu_at_the_live_advice_size_equals_the_round_by_round_transcription() -> None:
    """1,000 applications over 200 resources, the live-advice size, in the light-load regime
    where it walks every application from n_sys to n_perf (Σ(n_perf − n_sys) > 1,000 rounds):
    the event-driven allocator gives Algorithm 1's answer. Its speed is measured by
    bench/placement_speed.py, not here."""
    rng = random.Random(7)
    from burstctl.policies.placement.profiles import random_profile

    apps = []
    for j in range(1000):
        _, p = random_profile(rng, 8)
        x = rng.uniform(0, 400)
        apps.append(
            App(str(j), rng.randint(1, 50), 5000 * (1 - 1 / (1 + x)), 5000 * p(1) / (1 + x), 3, p)
        )
    t = Tables.build(apps, 200)
    assert sum(p - s for p, s in zip(t.n_perf, t.n_sys, strict=True)) > 1000
    assert tcpu_allocator(apps, 200, Q_CPU, rng) == tcpu_reference(apps, 200, Q_CPU, rng)
