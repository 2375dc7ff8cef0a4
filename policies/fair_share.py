"""FairShare: every active job gets the same fraction of its b_i ([BWS] §4.1).

α_i = min(1, B / Σ_{j∈S(t)} b_j) for every i ∈ S(t), with b_i = min(p_i·b, B)
(eq. 1), so the share is proportional to b_i — to nodes only while p_i·b < B.
Opportunity fairness: a job whose demand is below α_i·b_i gets its demand and
the leftover is shared by the others in the same proportion (weighted
water-filling with weights b_i), so Σ rates = min(B, Σ demand).
"""

from __future__ import annotations

from burstctl.policies.base import ArrayAllocator, ArrayView, Policy
from burstctl.policies.decision import enforce_rows
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
        demand, cap, capacity = rows.demand, rows.cap, rows.capacity
        return enforce_rows(
            water_fill_rows(rows.active, demand, cap, capacity), demand, cap, capacity
        )
