"""The placements of [DIST-IO] §IV-B: distinct resources, n_j of them; Greedy-Non-Clairvoyant
balances the number of applications per resource; Greedy-Clairvoyant's predicted occupancy
sums to N·I/O-load(π)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from placement_instances import Q_CPU, SEEDS, instance

from burstctl.policies.placement.allocators import ALLOCATORS
from burstctl.policies.placement.model import App, Profile, io_load
from burstctl.policies.placement.placements import (
    PLACEMENTS,
    greedy_clairvoyant,
    greedy_clairvoyant_occupancy,
    greedy_non_clairvoyant,
    place,
)


def test_registry_names() -> None:
    assert set(PLACEMENTS) == {"random", "greedy-non-clairvoyant", "greedy-clairvoyant"}
    with pytest.raises(ValueError, match="unknown placement 'nearest'"):
        place("nearest", [], [], 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_placement_invariants(seed: int) -> None:
    apps, N = instance(seed)
    rng = random.Random(seed)
    alloc_name = sorted(ALLOCATORS)[seed % len(ALLOCATORS)]
    pi = ALLOCATORS[alloc_name](apps, N, Q_CPU, rng)
    for name, fn in PLACEMENTS.items():
        sets = fn(apps, pi, N, rng)
        assert len(sets) == len(apps), name
        for n, s in zip(pi, sets, strict=True):
            assert len(s) == n == len(set(s)), name
            assert all(0 <= k < N for k in s), name
    # GNC: the number of applications per resource differs by at most one
    counts = Counter(k for s in greedy_non_clairvoyant(apps, pi, N, rng) for k in s)
    per = [counts.get(k, 0) for k in range(N)]
    assert max(per) - min(per) <= 1
    # GC: Σ predicted occupancy = N·I/O-load(π)
    _, occ = greedy_clairvoyant_occupancy(apps, pi, N)
    assert sum(occ) == pytest.approx(N * io_load(apps, pi, N), rel=1e-9, abs=1e-12)


def _app(j: int, t_cpu: float, v_io: float) -> App:
    return App(f"a{j}", 1, t_cpu, v_io, 1, Profile((1.0,)))


def test_gnc_orders_by_count_and_keeps_the_cursor() -> None:
    apps = [_app(j, 1.0, 1.0) for j in range(4)]
    # order by n descending: a1 (3), a3 (2), a0 (1), a2 (1); cursor 0 → 3 → 0 → 1 → 2
    assert greedy_non_clairvoyant(apps, [1, 3, 1, 2], 5, random.Random(0)) == [
        [0],
        [0, 1, 2],
        [1],
        [3, 4],
    ]


def test_gc_places_the_heaviest_first_on_the_least_occupied() -> None:
    # r = T/(T_cpu + T): a0 0.5, a1 0.9, a2 0.1
    apps = [_app(0, 1.0, 1.0), _app(1, 1.0, 9.0), _app(2, 9.0, 1.0)]
    sets, occ = greedy_clairvoyant_occupancy(apps, [1, 1, 2], 2)
    assert sets == [[1], [0], [0, 1]]
    assert occ == pytest.approx([1.0, 0.6])
    with pytest.raises(ValueError, match="level 2"):
        greedy_clairvoyant([App("x", 1, n_perf_hint=1)], [1], 2, random.Random(0))


def test_counts_outside_the_resources_are_refused() -> None:
    with pytest.raises(ValueError, match=r"outside 1\.\.2"):
        greedy_non_clairvoyant([_app(0, 1.0, 1.0)], [3], 2, random.Random(0))
