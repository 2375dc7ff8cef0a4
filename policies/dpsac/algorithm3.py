"""Probabilistic I/O scheduling of one cluster for one time unit: [DPSAC] §4.4.3, Algorithm 3.

Units: every quantity is a VOLUME PER TIME UNIT Δ (notes on [DPSAC] §4.4.2: the paper adds
capacities to bandwidths): a rate B_i is B_i·Δ, the PFS share is B·U_k·Δ, and the quota U_k·S
and the load L_k are volumes. The caller picks Δ and converts.

Given the cluster's applications in priority order, with F = B·U_k the PFS share and
Q = S·U_k the quota:

- if Σ B_i ≤ F every application gets B_i, straight to the PFS, and the spare share
  F − Σ B_i drains the partition (at most L_k: it never drains below empty);
- otherwise the first m − 1 applications, whose rates fit in F, get B_i, the m-th is the one
  that crosses F, and each application i ≥ m is selected, independently, with probability
  P_full^(i−m)·(1 − P_full) (line 14; the reading is docs/dpsac.md's); with sel the selected
  rates, if L_k + (sel − F) < Q (line 15 with its sign fixed) every selected application gets
  B_i: min(sel, F) goes to the PFS, the excess to the buffer, and a spare share (sel < F)
  drains the partition; else no buffering: the first m − 1 get B_i and the m-th F − Σ_{<m}
  B_i, all to the PFS.

Applications not granted anything wait this time unit.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from burstctl.policies.dpsac.dist import LoadDistribution


@dataclass(frozen=True, slots=True)
class Tick:
    """The outcome of one time unit for one cluster (volumes per time unit).

    ``granted``: (app_id, grant) for every application given something (B_i, or the
    m-th's partial share), in priority order; ``to_pfs`` and ``to_buffer``: where the
    granted volume goes; ``drain``: volume moved from the partition to the PFS; ``load``: the
    partition's load after the unit, L_k + to_buffer − drain; ``buffered``: whether the
    buffer took part (line 15's first branch with sel > F)."""

    granted: tuple[tuple[str, float], ...]
    to_pfs: float
    to_buffer: float
    drain: float
    load: float
    buffered: bool


def full_probability(dist: LoadDistribution, quota: float, pfs: float, load: float) -> float:
    """P_full = Pr(X ≥ (S + B)·U_k − L_k) = Pr(X ≥ quota + pfs − load) ([DPSAC] §4.4.2), with
    the volumes converted to ``dist``'s quanta (not rounded: the tail takes the next whole
    load)."""
    return dist.tail((quota + pfs - load) / dist.quantum)


def schedule(
    apps: Sequence[tuple[str, float]],
    pfs: float,
    quota: float,
    load: float,
    p_full: float,
    rng: random.Random,
) -> Tick:
    """Algorithm 3 for one cluster and one time unit.

    ``apps``: (app_id, B_i) of the applications that want I/O this unit, in priority order;
    ``pfs`` = B·U_k; ``quota`` = S·U_k; ``load`` = L_k; ``p_full`` the transition-to-full
    probability (``full_probability``); ``rng`` draws line 14 (one ``random()`` per
    application from the m-th on, so a seeded rng gives the same tick)."""
    if not (0.0 <= p_full <= 1.0) or math.isnan(p_full):
        raise ValueError(f"p_full must be within [0, 1], got {p_full!r}")
    if pfs < 0.0 or quota < 0.0 or load < 0.0:
        raise ValueError(f"pfs, quota and load must be >= 0, got {pfs!r}, {quota!r}, {load!r}")
    total = math.fsum(b for _, b in apps)
    if total <= pfs:
        drain = min(load, pfs - total)
        granted = tuple((a, b) for a, b in apps if b > 0.0)
        return Tick(granted, total, 0.0, drain, load - drain, False)
    # m: the first index whose prefix sum reaches the PFS share (0-based)
    prefix = 0.0
    m = 0
    for m, (_, b) in enumerate(apps):  # noqa: B007 (m is used after the loop)
        if prefix + b >= pfs:
            break
        prefix += b
    selected = list(apps[:m])
    for offset, (a, b) in enumerate(apps[m:]):
        chance = (p_full**offset) * (1.0 - p_full)
        if rng.random() < chance:
            selected.append((a, b))
    sel = math.fsum(b for _, b in selected)
    if load + (sel - pfs) < quota:
        direct = min(sel, pfs)
        to_buffer = sel - direct
        drain = min(load, pfs - direct)
        granted = tuple((a, b) for a, b in selected if b > 0.0)
        return Tick(granted, direct, to_buffer, drain, load + to_buffer - drain, to_buffer > 0.0)
    granted_list = [(a, b) for a, b in apps[:m] if b > 0.0]
    partial = pfs - prefix
    if partial > 0.0:
        granted_list.append((apps[m][0], partial))
    return Tick(tuple(granted_list), pfs, 0.0, 0.0, load, False)
