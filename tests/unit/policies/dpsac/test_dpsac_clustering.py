"""Algorithm 1 ([DPSAC] §4.2) against brute force, and the elbow rule.

The brute force is a seeded loop (not hypothesis) of 600 cases, n ≤ 9, K ≤ 4: every split
of the sorted values into K contiguous runs, and for n ≤ 7 every assignment of the values
to K non-empty clusters (which also proves that contiguity loses nothing).
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from burstctl.policies.dpsac.clustering import cluster, elbow, kmeans_1d, wss_curve


def sse_of(groups: list[list[float]]) -> float:
    total = 0.0
    for g in groups:
        mean = math.fsum(g) / len(g)
        total += math.fsum((v - mean) ** 2 for v in g)
    return total


def brute_contiguous(values: list[float], k: int) -> float:
    xs = sorted(values)
    n = len(xs)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0, *cuts, n)
        best = min(best, sse_of([xs[a:b] for a, b in itertools.pairwise(edges)]))
    return best


def brute_assignments(values: list[float], k: int) -> float:
    """The least SSE over every labelling with exactly k non-empty clusters (numpy)."""
    xs = np.array(values)
    labels = np.array(list(itertools.product(range(k), repeat=len(values))))
    onehot = labels[:, :, None] == np.arange(k)[None, None, :]  # (L, n, k)
    counts = onehot.sum(axis=1)
    full = (counts > 0).all(axis=1)
    sums = (onehot * xs[None, :, None]).sum(axis=1)
    squares = (onehot * (xs * xs)[None, :, None]).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per = np.where(counts > 0, squares - sums * sums / np.maximum(counts, 1), 0.0)
    return float(per.sum(axis=1)[full].min())


def random_values(rng: random.Random) -> list[float]:
    n = rng.randint(1, 9)
    kind = rng.random()
    if kind < 0.3:  # duplicates likely
        return [float(rng.randint(0, 4)) for _ in range(n)]
    if kind < 0.6:  # separated groups
        return [rng.choice([0.0, 10.0, 100.0]) + rng.uniform(-1, 1) for _ in range(n)]
    return [rng.uniform(-50, 1000) for _ in range(n)]


CASES = 600


def test_dp_equals_brute_force_on_600_random_inputs() -> None:
    rng = random.Random(18)
    checked_assignments = 0
    for case in range(CASES):
        values = random_values(rng)
        k = rng.randint(1, 4)
        result = kmeans_1d(values, k)
        distinct = len(set(values))
        kk = min(k, distinct)
        assert result.k == kk, (case, values, k)
        assert all(len(m) > 0 for m in result.members)
        assert sorted(i for m in result.members for i in m) == list(range(len(values)))
        for (a, b), members in zip(result.bounds, result.members, strict=True):
            assert list(result.order[a:b]) == list(members)
        expected = brute_contiguous(values, kk)
        tol = 1e-9 * max(1.0, expected) + 1e-9
        assert result.sse == pytest.approx(expected, rel=1e-9, abs=tol), (case, values, k)
        assert result.sse == pytest.approx(
            sse_of([[values[i] for i in m] for m in result.members]), rel=1e-12, abs=1e-12
        )
        if len(values) <= 7:
            checked_assignments += 1
            anywhere = brute_assignments(values, kk)
            assert expected == pytest.approx(anywhere, rel=1e-9, abs=tol), (case, values, k)
        curve = wss_curve(values, 4)
        assert curve[kk - 1] == pytest.approx(expected, rel=1e-9, abs=tol)
    assert checked_assignments > 200


def test_members_are_original_indices_and_centroids_means() -> None:
    values = [100.0, 1.0, 102.0, 2.0, 50.0]
    result = kmeans_1d(values, 3)
    assert result.members == ((1, 3), (4,), (0, 2))
    assert result.centroids == (1.5, 50.0, 101.0)
    assert result.order == (1, 3, 4, 0, 2)
    assert result.bounds == ((0, 2), (2, 3), (3, 5))
    assert result.sse == pytest.approx(0.5 + 0.0 + 2.0)


def test_degenerate_inputs() -> None:
    assert kmeans_1d([], 3).k == 0
    assert cluster([]).k == 0
    one = kmeans_1d([7.0], 4)
    assert one.k == 1 and one.sse == 0.0 and one.members == ((0,),)
    same = kmeans_1d([3.0] * 6, 4)
    assert same.k == 1 and same.sse == 0.0
    assert wss_curve([3.0] * 6, 3) == [0.0, 0.0, 0.0]
    assert wss_curve([1.0, 2.0], 4)[1:] == [0.0, 0.0, 0.0]
    assert wss_curve([], 2) == [0.0, 0.0]
    with pytest.raises(ValueError, match="k must be"):
        kmeans_1d([1.0], 0)
    with pytest.raises(ValueError, match="finite"):
        kmeans_1d([1.0, math.nan], 2)


def test_elbow_rule() -> None:
    assert elbow([]) == 1
    assert elbow([5.0]) == 1
    assert elbow([0.0, 0.0, 0.0]) == 1  # all equal
    # evenly spread values keep 1/4, 4/9, 9/16 of the SSE: no structure, one cluster
    assert elbow([144.0, 36.0, 16.0, 9.0]) == 1
    # structure (a step keeps 10 % < 0.5 · 1/4); the step 2 → 3 removes 5 % of wss[0]: K = 2
    assert elbow([100.0, 10.0, 5.0, 2.5]) == 2
    # three evenly spaced tight groups: 2 keeps 1/4 (as even values), 3 keeps ~0: K = 3
    assert elbow([100.0, 25.0, 0.15, 0.1]) == 3
    # every step removes at least 10 % of wss[0]: the last K
    assert elbow([100.0, 5.0e1, 2.0, 1.0e-3][:3]) == 3
    # removing exactly the fraction is not "less than": go on
    assert elbow([100.0, 10.0, 0.0]) == 3
    assert elbow([100.0, 1.0, 0.0, 0.0]) == 2


def test_cluster_needs_structure_to_split() -> None:
    assert cluster([10.0, 12.0, 14.0]).k == 1
    assert cluster([float(x) for x in range(10, 19)]).k == 1
    assert cluster([1.0, 1.0, 100.0]).members == ((0, 1), (2,))
    assert cluster([1.0, 100.0]).k == 1  # two values: no evidence of two groups


def test_cluster_finds_the_three_size_classes_of_the_paper() -> None:
    # [DPSAC] §5.2.1: small (EAP, LAP, VPIC), medium (×5, ×0.5) and big (×10) I/O lengths
    lengths = [20.0, 25.0, 23.4, 100.0, 125.0, 140.0, 200.0, 234.0, 280.0]
    result = cluster(lengths, k_max=5)
    assert result.members == ((0, 2, 1), (3, 4, 5), (6, 7, 8))
