"""FCFS: the oldest pending operation is served first (bandwidth-sharing paper [BWS] §4.1).

GREEDY_FILL ordered by non-decreasing post time R_i (a job with none sorts as if
posted now); ties in the stable order (the paper does not specify ties). Each job
takes what it can use (demand ≤ b_i) and the rest goes to the next job, so the
sum is min(B, Σ demand).
"""

from __future__ import annotations

from burstctl.policies.base import Policy
from burstctl.policies.sharing import greedy_fill_by
from burstctl.policies.view import RowRates, SystemView


class Fcfs(Policy):
    name = "fcfs"

    def allocate(self, view: SystemView) -> RowRates:
        columns = view.columns
        posted_at = columns.posted_at
        now = view.now
        capacity = view.capacity
        # The least (R_i, row) as the loop goes (a later row replaces it only if posted
        # strictly earlier: rows are in the stable order, so the row breaks ties). When it
        # takes all of B (b_i = B, the simulator's case) nobody else gets anything.
        first = -1
        least = 0.0
        for r in view.active:
            p = posted_at[r]
            if p is None:
                p = now
            if first < 0 or p < least:
                first, least = r, p
        if first >= 0 and capacity > 0.0:
            d = columns.demand[first]
            if not capacity > d:
                return [(first, capacity if capacity < d else d)]
        ranked = [(now if (p := posted_at[r]) is None else p, r) for r in view.active]
        return greedy_fill_by(ranked, columns.demand, capacity)
