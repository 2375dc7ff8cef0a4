"""FairShare: every active job gets the same fraction of its b_i ([BWS] §4.1).

α_i = min(1, B / Σ_{j∈S(t)} b_j) for every i ∈ S(t), with b_i = min(p_i·b, B)
(eq. 1), so the share is proportional to b_i — to nodes only while p_i·b < B.
Opportunity fairness: a job whose demand is below α_i·b_i gets its demand and
the leftover is shared by the others in the same proportion (weighted
water-filling with weights b_i), so Σ rates = min(B, Σ demand).
"""

from __future__ import annotations

import math

from burstctl.policies.base import ArrayAllocator, ArrayView, Policy
from burstctl.policies.decision import SUM_TOLERANCE, enforce_rows
from burstctl.policies.sharing import water_fill, water_fill_rows
from burstctl.policies.view import JobId, SystemView


class FairShare(Policy):
    name = "fair-share"

    def allocate(self, view: SystemView) -> dict[JobId, float]:
        # Order does not matter: water_fill sorts by (ceiling/weight, id) itself.
        ceilings = {j: v.demand for j, v in view.jobs.items() if v.demand > 0.0}
        weights = {j: view.jobs[j].cap for j in ceilings}  # α·b_i: proportional to b_i
        return water_fill(ceilings, weights, view.capacity)

    def array_allocator(self) -> ArrayAllocator | None:
        return self.allocate_arrays

    def allocate_arrays(self, rows: ArrayView) -> list[tuple[int, float]]:
        """``decide`` on ``allocate`` over arrays (:class:`ArrayAllocator`): the same
        rates, bit for bit."""
        active, demand, cap, capacity = rows.active, rows.demand, rows.cap, rows.capacity
        # The simulator's case in two light passes: every row can take something, and
        # nobody stops below the common level (water_fill's second branch); the same
        # sums in the same order, and what enforce would check.
        total_ceiling = 0.0
        weight_left = 0.0
        lowest = math.inf
        for i in active:
            c = demand[i]
            w = cap[i]
            if not (c > 0.0 and w > 0.0):
                break
            ratio = c / w
            total_ceiling += c
            weight_left += w
            if ratio < lowest:
                lowest = ratio
        else:
            if total_ceiling > capacity:
                level = capacity / weight_left
                if lowest > level:
                    rates = []
                    total = 0.0
                    for i in active:
                        w = cap[i]
                        r = level * w
                        if not 0.0 < r <= w:
                            break
                        rates.append((i, r))
                        total += r
                    else:
                        if not total > capacity * (1 + SUM_TOLERANCE):
                            return rates
        return enforce_rows(water_fill_rows(active, demand, cap, capacity), demand, cap, capacity)
