"""The instantaneous load distribution of a cluster: Dist, [DPSAC] §4.4.1, Algorithm 2.

Each application i of a cluster does I/O in a time unit with probability P_i (X_i ~
Bernoulli(P_i), independent) at its rate B_i, so the cluster's load is X = Σ_i B_i·X_i and
Dist(x) = Pr(X = x). Algorithm 2 builds it one application at a time, like a 0/1 knapsack,
over INTEGER loads: each B_i is counted in whole ``quantum``s, rounded UP (a cluster is never
thought lighter than it is; docs/dpsac.md, "Readings"). Loads are volumes per time unit Δ
(B_i·Δ), so the quantum is a volume and ``tail`` compares like with like (§4.4.2).

``add`` is one pass of Algorithm 2; ``remove`` is its exact inverse, which the paper does not
give: solved in ascending load for p ≤ 1/2 and in descending load for p > 1/2, the direction in
which the recurrence divides by the larger of p and 1 − p, so rounding errors shrink instead of
growing (p = 1 is a plain shift back). Each is O(Σ units) with numpy, block by block.
"""

from __future__ import annotations

import math

import numpy as np

# values within this relative distance below a whole number of quanta count as that number:
# float noise (3·(0.1) / 0.1) must not add a quantum
_ROUNDING_SLACK = 1e-9


def to_units(value: float, quantum: float) -> int:
    """``value`` (≥ 0) in whole quanta, rounded up (float noise aside)."""
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"a load must be finite and >= 0, got {value!r}")
    if not (math.isfinite(quantum) and quantum > 0.0):
        raise ValueError(f"the quantum must be finite and > 0, got {quantum!r}")
    return math.ceil(value / quantum * (1.0 - _ROUNDING_SLACK))


class LoadDistribution:
    """Dist of one cluster over loads 0..``total_units`` (in quanta), incrementally updated.

    ``add(b_units, p)`` takes an application of rate ``b_units`` quanta doing I/O with
    probability ``p`` into the cluster; ``remove(b_units, p)`` takes it out again (exactly,
    within rounding: the caller removes only what it added). ``tail(x)`` = Pr(load ≥ x), x
    in quanta.
    """

    __slots__ = ("_pmf", "count", "quantum")

    def __init__(self, quantum: float = 1.0) -> None:
        if not (math.isfinite(quantum) and quantum > 0.0):
            raise ValueError(f"the quantum must be finite and > 0, got {quantum!r}")
        self.quantum = quantum
        self._pmf = np.ones(1)  # Dist(0) = 1: the empty cluster has no load
        self.count = 0  # applications in the distribution

    @property
    def pmf(self) -> np.ndarray:
        """A copy of Dist: ``pmf[x]`` = Pr(load = x quanta), x = 0..total_units."""
        return self._pmf.copy()

    @property
    def total_units(self) -> int:
        """Σ b_units of the applications in the distribution (the largest possible load)."""
        return len(self._pmf) - 1

    def units(self, value: float) -> int:
        """``value`` (a volume per time unit) in whole quanta of this distribution, rounded up."""
        return to_units(value, self.quantum)

    @staticmethod
    def _check(b_units: int, p: float) -> None:
        if b_units < 0 or int(b_units) != b_units:
            raise ValueError(f"b_units must be a whole number >= 0, got {b_units!r}")
        if not (0.0 <= p <= 1.0):
            raise ValueError(f"p must be within [0, 1], got {p!r}")

    def add(self, b_units: int, p: float) -> None:
        """One pass of Algorithm 2: Dist'(x) = (1 − p)·Dist(x) + p·Dist(x − b)."""
        self._check(b_units, p)
        b = int(b_units)
        old = self._pmf
        new = np.zeros(len(old) + b)
        new[: len(old)] = (1.0 - p) * old
        new[b:] += p * old
        self._pmf = new
        self.count += 1

    def remove(self, b_units: int, p: float) -> None:
        """The exact inverse of ``add(b_units, p)`` (which the caller made before)."""
        self._check(b_units, p)
        b = int(b_units)
        new = self._pmf
        n_old = len(new) - b
        if n_old < 1 or self.count < 1:
            raise ValueError("remove: the distribution holds no such application")
        if b == 0 or p == 0.0:
            old = new[:n_old].copy() if b else new.copy()
            if b and p == 0.0 and np.any(np.abs(new[n_old:]) > 1e-12):
                raise ValueError("remove: the distribution holds no such application")
        elif p <= 0.5:
            # ascending: old(x) = (Dist(x) − p·old(x − b)) / (1 − p), a block of b loads at a time
            old = np.empty(n_old)
            q = 1.0 - p
            for start in range(0, n_old, b):
                stop = min(start + b, n_old)
                block = new[start:stop].copy()
                if start >= b:
                    block -= p * old[start - b : stop - b]
                old[start:stop] = block / q
        else:
            # descending: old(x − b) = (Dist(x) − (1 − p)·old(x)) / p, from the top load down
            old = np.zeros(n_old)
            q = 1.0 - p
            top = len(new) - 1
            for hi in range(top, b - 1, -b):  # x = hi .. max(b, hi − b + 1)
                lo = max(b, hi - b + 1)
                xs = np.arange(lo, hi + 1)
                above = np.where(xs < n_old, old[np.minimum(xs, n_old - 1)], 0.0)
                old[xs - b] = (new[xs] - q * above) / p
        self._pmf = old
        self.count -= 1

    def tail(self, x: float) -> float:
        """Pr(load ≥ x), x in quanta (not necessarily whole): 1 for x ≤ 0, 0 above the total."""
        if x <= 0.0:
            return 1.0
        start = math.ceil(x - _ROUNDING_SLACK)
        if start >= len(self._pmf):
            return 0.0
        return float(min(1.0, max(0.0, float(self._pmf[start:].sum()))))

    def __repr__(self) -> str:
        return (
            f"LoadDistribution(quantum={self.quantum!r}, count={self.count}, "
            f"total_units={self.total_units})"
        )
