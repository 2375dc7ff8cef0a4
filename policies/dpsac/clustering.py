"""1-D K-means by dynamic programming: Ckmeans.1d.dp, [DPSAC] §4.2, Algorithm 1.

The objective is the within-cluster sum of squared errors (SSE), "min Σ_i Σ_{l∈C_i}
‖l − c_i‖²". In one dimension an optimal partition is made of runs of the sorted values,
so the DP over the sorted values is exact. With the fixes Algorithm 1 needs (docs/dpsac.md,
"Readings"): D[0,0] = 0 and D[i,0] = +∞ for i > 0 (the paper's D[·,0] = 0 would let the
first cluster be empty), the backtrack starts at CI[n,K] (not n+1), and d(j..i) comes in
constant time from prefix sums of the values shifted by their median (less cancellation).

Cost: O(n²·K) time (vectorised over the first index of the last cluster), O(n·K) space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The elbow rule (docs/dpsac.md, "Readings"): values are clustered only if some step from K − 1
# to K clusters keeps less than ELBOW_STRUCTURE times what evenly spread values keep
# (((K − 1)/K)²); then K is the smallest whose next step removes less than ELBOW_FRACTION of
# the SSE of one cluster.
ELBOW_FRACTION = 0.1
ELBOW_STRUCTURE = 0.5


@dataclass(frozen=True, slots=True)
class Clustering:
    """An optimal partition of values into contiguous clusters of their sorted order.

    ``order``: the original indices sorted by value (stable: equal values keep their input
    order). ``bounds``: for each cluster, the half-open range ``(start, end)`` of positions
    in ``order`` (clusters in increasing value order). ``members``: for each cluster the
    ORIGINAL indices of its values, in sorted order. ``centroids``: each cluster's mean.
    ``sse``: the total within-cluster SSE, computed directly from the members (two-pass).
    """

    bounds: tuple[tuple[int, int], ...]
    members: tuple[tuple[int, ...], ...]
    centroids: tuple[float, ...]
    sse: float
    order: tuple[int, ...]

    @property
    def k(self) -> int:
        """The number of clusters."""
        return len(self.bounds)


EMPTY = Clustering((), (), (), 0.0, ())


def _distinct(sorted_values: Sequence[float]) -> int:
    return sum(1 for i, v in enumerate(sorted_values) if i == 0 or v != sorted_values[i - 1])


def _dp(xs: np.ndarray, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """The DP table of Algorithm 1 over sorted ``xs``: D[m, i] (the least SSE of the first i
    values in m clusters, +∞ where i < m) and CI[m, i] (1-based first index of the last
    cluster), for m = 0..k_max, i = 0..n."""
    n = len(xs)
    shifted = xs - (float(np.median(xs)) if n else 0.0)
    s1 = np.concatenate(([0.0], np.cumsum(shifted)))
    s2 = np.concatenate(([0.0], np.cumsum(shifted * shifted)))
    d = np.full((k_max + 1, n + 1), math.inf)
    ci = np.zeros((k_max + 1, n + 1), dtype=np.int64)
    d[0, 0] = 0.0
    for i in range(1, n + 1):
        j = np.arange(1, i + 1)  # the last cluster is values j..i (1-based)
        size = i - j + 1
        total = s1[i] - s1[j - 1]
        cost = np.maximum(0.0, (s2[i] - s2[j - 1]) - total * total / size)
        for m in range(1, min(i, k_max) + 1):
            # j ≥ m: the first m − 1 clusters need m − 1 values
            cand = d[m - 1, m - 1 : i] + cost[m - 1 :]
            best = int(np.argmin(cand))
            d[m, i] = cand[best]
            ci[m, i] = best + m
    return d, ci


def _sse(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values)


def _clustering(
    values: Sequence[float], order: list[int], cuts: list[tuple[int, int]]
) -> Clustering:
    members = tuple(tuple(order[a:b]) for a, b in cuts)
    groups = [[float(values[i]) for i in m] for m in members]
    centroids = tuple(math.fsum(g) / len(g) for g in groups)
    sse = math.fsum(_sse(g) for g in groups)
    return Clustering(tuple(cuts), members, centroids, sse, tuple(order))


def _sorted(values: Sequence[float]) -> tuple[list[int], np.ndarray]:
    for v in values:
        if not math.isfinite(v):
            raise ValueError(f"values must be finite, got {v!r}")
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order, np.array([float(values[i]) for i in order], dtype=float)


def kmeans_1d(values: Sequence[float], k: int) -> Clustering:
    """The optimal (least SSE) partition of ``values`` into exactly min(k, number of
    distinct values) non-empty clusters, contiguous in sorted order ([DPSAC] Algorithm 1).
    ``k`` ≥ 1; no values give the empty clustering."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not values:
        return EMPTY
    order, xs = _sorted(values)
    k = min(k, _distinct(xs.tolist()))
    _, ci = _dp(xs, k)
    cuts: list[tuple[int, int]] = []
    i = len(xs)
    for m in range(k, 0, -1):  # backtrack from CI[n, K]
        j = int(ci[m, i])
        cuts.append((j - 1, i))
        i = j - 1
    cuts.reverse()
    return _clustering(values, order, cuts)


def wss_curve(values: Sequence[float], k_max: int) -> list[float]:
    """The least SSE for K = 1..k_max, from ONE DP table (O(n²·k_max)). Entries for K at or
    above the number of distinct values are 0.0 (each distinct value its own cluster)."""
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    if not values:
        return [0.0] * k_max
    _, xs = _sorted(values)
    distinct = _distinct(xs.tolist())
    kk = min(k_max, distinct)
    d, _ = _dp(xs, kk)
    n = len(xs)
    return [float(d[m, n]) if m < distinct else 0.0 for m in range(1, kk + 1)] + [0.0] * (
        k_max - kk
    )


def elbow(
    wss: Sequence[float], fraction: float = ELBOW_FRACTION, structure: float = ELBOW_STRUCTURE
) -> int:
    """The elbow of an SSE curve ``wss`` (wss[K − 1] = SSE with K clusters).

    First, is there any cluster structure? Evenly spread values keep ((K − 1)/K)² of the SSE
    at the step from K − 1 to K clusters (1/4, 4/9, 9/16, ...); the values count as
    clustered only if some step keeps less than ``structure`` times that. If not: 1. If so:
    the smallest K whose next step removes less than ``fraction`` of wss[0] (the SSE of one
    cluster), or len(wss) when every step removes more.

    Deterministic; 1 for an empty or one-point curve or wss[0] = 0 (all values equal).
    docs/dpsac.md, "Readings"."""
    if len(wss) <= 1 or not wss[0] > 0.0:
        return 1
    clustered = any(
        wss[k - 2] > 0.0 and wss[k - 1] / wss[k - 2] < structure * ((k - 1) / k) ** 2
        for k in range(2, len(wss) + 1)
    )
    if not clustered:
        return 1
    floor = fraction * wss[0]
    for k in range(1, len(wss)):
        if wss[k - 1] - wss[k] < floor:
            return k
    return len(wss)


def cluster(values: Sequence[float], k_max: int = 5) -> Clustering:
    """``kmeans_1d`` with the elbow's K over K = 1..min(k_max, n − 1) (Algorithm 1, line 8;
    K = n, every value alone, always has SSE 0 and says nothing of structure)."""
    if not values:
        return EMPTY
    top = max(1, min(k_max, len(values) - 1))
    return kmeans_1d(values, elbow(wss_curve(values, top)))
