"""FairShare: every active job gets the same fraction of its b_i ([BWS] §4.1).

α_i = min(1, B / Σ_{j∈S(t)} b_j) for every i ∈ S(t), with b_i = min(p_i·b, B)
(eq. 1), so the share is proportional to b_i — to nodes only while p_i·b < B.
Opportunity fairness: a job whose demand is below α_i·b_i gets its demand and
the leftover is shared by the others in the same proportion (weighted
water-filling with weights b_i), so Σ rates = min(B, Σ demand).
"""

from __future__ import annotations

from burstctl.policies.base import Policy
from burstctl.policies.sharing import water_levels
from burstctl.policies.view import RowRates, SystemView


class FairShare(Policy):
    name = "fair-share"
    reads = frozenset({"demand", "cap"})

    def allocate(self, view: SystemView) -> RowRates:
        columns = view.columns
        # ceilings: the demands; weights: b_i (α·b_i is proportional to b_i). Sums run
        # and ties in demand/b_i break in the stable order (the rows').
        return water_levels(view.active, columns.demand, columns.cap, view.capacity)
