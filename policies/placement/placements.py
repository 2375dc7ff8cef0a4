"""The placement step of [DIST-IO] §IV-B: which n_j resources each application uses.

Every placement has one signature, ``(apps, allocation, N, rng) -> list[list[int]]``: for
each application (in the order of ``apps``) its ``allocation[j]`` distinct resource indices in
0..N−1. ``PLACEMENTS`` maps the command-line names to them and ``place`` looks one up.
Resources are identical, as in the paper (§III-A): the caller maps indices to replicas (in
burstctl, one replica with its storage per index). Pure: no I/O, no clock, no threads.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np

from .model import App, t_cf_io

Placement = Callable[[Sequence[App], Sequence[int], int, random.Random], list[list[int]]]


def _check(apps: Sequence[App], allocation: Sequence[int], N: int) -> None:
    if N < 1:
        raise ValueError(f"N (I/O resources) must be ≥ 1, got {N}")
    if len(apps) != len(allocation):
        raise ValueError(f"{len(apps)} applications but {len(allocation)} counts")
    for a, n in zip(apps, allocation, strict=True):
        if not 1 <= n <= N:
            raise ValueError(f"{a.app_id}: count {n} is outside 1..{N}")


def random_placement(
    apps: Sequence[App], allocation: Sequence[int], N: int, rng: random.Random
) -> list[list[int]]:
    """Random-Placement: n_j distinct resources drawn uniformly for each application (current
    practice, [DIST-IO] §IV-B)."""
    _check(apps, allocation, N)
    return [sorted(rng.sample(range(N), n)) for n in allocation]


def _order(keys: Sequence[float]) -> list[int]:
    """Indices by decreasing key, ties by index (a stable sort)."""
    return sorted(range(len(keys)), key=lambda j: -keys[j])


def greedy_non_clairvoyant(
    apps: Sequence[App], allocation: Sequence[int], N: int, rng: random.Random
) -> list[list[int]]:
    """Greedy-Non-Clairvoyant: applications by decreasing n_j (ties by index), each given the
    next n_j resources of a round-robin cursor that persists across applications (burstctl's
    reading: persistence is what balances the number of applications per resource, the
    counts differ by at most one). Needs no application data."""
    _check(apps, allocation, N)
    out: list[list[int]] = [[] for _ in apps]
    cursor = 0
    for j in _order([float(n) for n in allocation]):
        n = allocation[j]
        out[j] = sorted((cursor + k) % N for k in range(n))
        cursor = (cursor + n) % N
    return out


def occupancy_ratio(app: App, n: int) -> float:
    """r_j = T_cf_io(n)/(T_cpu + T_cf_io(n)) = I/O-Stress(j, n)/n: the predicted fraction of
    time application j occupies each of its n resources."""
    if app.t_cpu is None:
        raise ValueError(f"{app.app_id}: needs V_io, T_cpu and b_j (information level 2)")
    t = t_cf_io(app, n)
    return t / (app.t_cpu + t)


def greedy_clairvoyant_occupancy(
    apps: Sequence[App], allocation: Sequence[int], N: int
) -> tuple[list[list[int]], list[float]]:
    """Greedy-Clairvoyant's placement and the predicted I/O-res-occ of each resource
    (Σ occ = N·I/O-load(π))."""
    _check(apps, allocation, N)
    r = [occupancy_ratio(a, n) for a, n in zip(apps, allocation, strict=True)]
    occ = np.zeros(N, dtype=np.float64)
    out: list[list[int]] = [[] for _ in apps]
    for j in _order(r):
        chosen = np.argsort(occ, kind="stable")[: allocation[j]]  # least occupied, lowest index
        occ[chosen] += r[j]
        out[j] = sorted(int(k) for k in chosen)
    return out, occ.tolist()


def greedy_clairvoyant(
    apps: Sequence[App], allocation: Sequence[int], N: int, rng: random.Random
) -> list[list[int]]:
    """Greedy-Clairvoyant: applications by decreasing r_j = T_cf_io(n_j)/(T_cpu + T_cf_io(n_j))
    (ties by index), each placed on the n_j resources of lowest *predicted* I/O-res-occ (the
    sum of r of the applications already there, burstctl's reading of "I/O-res-occ"; ties by
    lowest index). Needs V_io, T_cpu and b_j."""
    return greedy_clairvoyant_occupancy(apps, allocation, N)[0]


PLACEMENTS: dict[str, Placement] = {
    "random": random_placement,
    "greedy-non-clairvoyant": greedy_non_clairvoyant,
    "greedy-clairvoyant": greedy_clairvoyant,
}
"""The placements by their command-line names ([DIST-IO] §IV-B)."""

PLACEMENT_LEVEL: dict[str, int] = {
    "random": 0,
    "greedy-non-clairvoyant": 0,
    "greedy-clairvoyant": 2,
}
"""The information level each placement needs for every application ([DIST-IO] Table II)."""


def place(
    name: str,
    apps: Sequence[App],
    allocation: Sequence[int],
    N: int,
    rng: random.Random | None = None,
) -> list[list[int]]:
    """The placement of ``apps`` with ``allocation`` by the placement called ``name`` (a key
    of ``PLACEMENTS``); ``rng`` defaults to ``random.Random(0)``."""
    try:
        fn = PLACEMENTS[name]
    except KeyError:
        raise ValueError(
            f"unknown placement {name!r}; known: {', '.join(sorted(PLACEMENTS))}"
        ) from None
    return fn(apps, allocation, N, rng if rng is not None else random.Random(0))
