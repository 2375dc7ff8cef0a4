"""Algorithm 2 ([DPSAC] §4.4.1) against enumeration over all subsets, and exact removal."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from support.sweep import seeds

from burstctl.policies.dpsac.dist import LoadDistribution, to_units


def enumerate_pmf(apps: list[tuple[int, float]]) -> np.ndarray:
    """Pr(Σ b_i X_i = x) by summing over all 2^n subsets of doing-I/O applications."""
    pmf = np.zeros(sum(b for b, _ in apps) + 1)
    for chosen in itertools.product((0, 1), repeat=len(apps)):
        prob = 1.0
        load = 0
        for (b, p), x in zip(apps, chosen, strict=True):
            prob *= p if x else 1.0 - p
            load += b * x
        pmf[load] += prob
    return pmf


def random_apps(rng: random.Random, n: int) -> list[tuple[int, float]]:
    apps = []
    for _ in range(n):
        b = rng.choice([0, 1, 1, 2, 3, 5, 8, rng.randint(1, 20)])
        p = rng.choice([0.0, 1.0, 0.5, rng.random(), rng.random(), rng.uniform(0.9, 1.0)])
        apps.append((b, p))
    return apps


@pytest.mark.parametrize("seed", seeds(15, 60))
def test_dist_equals_enumeration_and_tail(seed: int) -> None:
    rng = random.Random(seed)
    apps = random_apps(rng, rng.randint(0, 10))
    dist = LoadDistribution()
    for b, p in apps:
        dist.add(b, p)
    expected = enumerate_pmf(apps)
    assert dist.total_units == len(expected) - 1
    np.testing.assert_allclose(dist.pmf, expected, rtol=0, atol=1e-12)
    for x in range(-1, len(expected) + 2):
        want = float(expected[max(0, x) :].sum()) if x < len(expected) else 0.0
        assert dist.tail(x) == pytest.approx(min(1.0, want), abs=1e-12)
    assert dist.tail(0.5) == pytest.approx(float(expected[1:].sum()), abs=1e-12)


@pytest.mark.parametrize("seed", seeds(10, 40))
def test_remove_undoes_add_in_every_order(seed: int) -> None:
    rng = random.Random(1000 + seed)
    apps = random_apps(rng, rng.randint(1, 6 if seed % 2 else 10))
    orders = (
        list(itertools.permutations(range(len(apps))))
        if len(apps) <= 5
        else [rng.sample(range(len(apps)), len(apps)) for _ in range(30)]
    )
    full = LoadDistribution()
    for b, p in apps:
        full.add(b, p)
    for order in orders:
        dist = LoadDistribution()
        dist._pmf = full.pmf  # the same state, restored for each order
        dist.count = full.count
        left = list(range(len(apps)))
        for i in order:
            dist.remove(*apps[i])
            left.remove(i)
            expected = enumerate_pmf([apps[j] for j in left])
            np.testing.assert_allclose(dist.pmf, expected, rtol=0, atol=1e-12)
        assert dist.count == 0 and dist.pmf.tolist() == pytest.approx([1.0], abs=1e-12)


def test_add_then_remove_restores_the_previous_vector() -> None:
    rng = random.Random(7)
    dist = LoadDistribution()
    for _ in range(8):
        dist.add(rng.randint(1, 9), rng.random())
    for b, p in [(3, 0.2), (4, 0.5), (5, 0.8), (2, 1.0), (6, 0.0), (0, 0.4), (7, 0.999)]:
        before = dist.pmf
        dist.add(b, p)
        dist.remove(b, p)
        assert len(dist.pmf) == len(before)
        np.testing.assert_allclose(dist.pmf, before, rtol=0, atol=1e-12)


def test_units_round_up_and_bad_input() -> None:
    assert to_units(0.0, 1.0) == 0
    assert to_units(1.0, 1.0) == 1
    assert to_units(1.01, 1.0) == 2
    assert to_units(0.3, 0.1) == 3  # 0.3 / 0.1 = 2.9999999999999996 is three quanta
    assert LoadDistribution(0.5).units(1.2) == 3
    with pytest.raises(ValueError, match="quantum"):
        LoadDistribution(0.0)
    dist = LoadDistribution()
    with pytest.raises(ValueError, match="p must"):
        dist.add(1, 1.5)
    with pytest.raises(ValueError, match="b_units"):
        dist.add(-1, 0.5)
    with pytest.raises(ValueError, match="no such application"):
        dist.remove(1, 0.5)
