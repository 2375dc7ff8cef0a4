"""Adding a batch of applications to existing clusters ([DPSAC] §4.1 and the end of §4.2).

A batch no larger than the average existing cluster is inserted member by member into the
closest cluster (the centroid is recomputed after each insertion); a larger one is clustered
on its own (Algorithm 1 with the elbow) and its clusters merged with the existing ones: when
the batch gives fewer clusters than exist, each new cluster joins its closest existing one,
otherwise each existing cluster joins its closest new one. "Closest" is the distance between
centroids, ties to the lower index (docs/dpsac.md, "Readings").

A cluster here is a list of ``(app_id, length)``; results are sorted by centroid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from burstctl.policies.dpsac.clustering import cluster

Item = tuple[str, float]  # (app_id, l_i)


def centroid(members: Sequence[Item]) -> float:
    """The mean length of ``members`` (NaN for none)."""
    if not members:
        return math.nan
    return math.fsum(length for _, length in members) / len(members)


def closest(centroids: Sequence[float], value: float) -> int:
    """The index of the centroid nearest ``value``; ties to the lower index."""
    best, best_d = -1, math.inf
    for i, c in enumerate(centroids):
        d = abs(value - c)
        if d < best_d:
            best, best_d = i, d
    if best < 0:
        raise ValueError("no cluster to choose from")
    return best


def _sorted(clusters: list[list[Item]]) -> list[list[Item]]:
    return sorted((c for c in clusters if c), key=centroid)


def merge_clusters(
    existing: Sequence[Sequence[Item]], new: Sequence[Sequence[Item]]
) -> list[list[Item]]:
    """[DPSAC] §4.2: min(#new, #existing) clusters, the smaller side merged into the larger's
    closest members (fewer new clusters: each new joins its closest existing one)."""
    old = [list(c) for c in existing if c]
    fresh = [list(c) for c in new if c]
    if not old or not fresh:
        return _sorted(old + fresh)
    keep, fold = (old, fresh) if len(fresh) < len(old) else (fresh, old)
    targets = [centroid(c) for c in keep]  # centroids before merging: the order does not matter
    for group in fold:
        keep[closest(targets, centroid(group))].extend(group)
    return _sorted(keep)


def insert(clusters: list[list[Item]], item: Item) -> int:
    """Puts ``item`` into the cluster with the closest centroid; returns its index."""
    k = closest([centroid(c) for c in clusters], item[1])
    clusters[k].append(item)
    return k


def add_batch(
    existing: Sequence[Sequence[Item]], batch: Sequence[Item], k_max: int = 5
) -> list[list[Item]]:
    """The clusters after a batch of applications arrives ([DPSAC] §4.1's heuristic).

    With no existing cluster the batch is clustered (Algorithm 1, elbow over 1..k_max)."""
    clusters = [list(c) for c in existing if c]
    if not batch:
        return _sorted(clusters)
    if clusters and len(batch) <= sum(len(c) for c in clusters) / len(clusters):
        for item in batch:
            insert(clusters, item)
        return _sorted(clusters)
    result = cluster([length for _, length in batch], k_max)
    new = [[batch[i] for i in members] for members in result.members]
    return merge_clusters(clusters, new)
