"""FCFS: the oldest pending operation is served first (bandwidth-sharing paper [BWS] §4.1).

GREEDY_FILL ordered by non-decreasing post time R_i; ties by job id (the paper
does not specify ties). Each job takes what it can use (demand ≤ b_i)
and the rest goes to the next job, so the sum is min(B, Σ demand).
"""

from __future__ import annotations

from burstctl.policies.base import ArrayAllocator, ArrayView, Policy
from burstctl.policies.sharing import greedy_fill, greedy_fill_ranked
from burstctl.policies.view import JobId, SystemView


class Fcfs(Policy):
    name = "fcfs"

    def allocate(self, view: SystemView) -> dict[JobId, float]:
        order = sorted(
            view.active_jobs(),
            key=lambda j: (j.posted_at if j.posted_at is not None else view.now, j.job_id),
        )
        return greedy_fill(order, view.capacity)

    def array_allocator(self) -> ArrayAllocator | None:
        return self.allocate_arrays

    def allocate_arrays(self, rows: ArrayView) -> list[tuple[int, float]]:
        """``allocate`` over arrays (:class:`ArrayAllocator`), every R_i known: the same
        decision, bit for bit."""
        posted_at = rows.posted_at
        ranked = [(posted_at[i], i) for i in rows.active]
        return greedy_fill_ranked(ranked, rows.demand, rows.capacity)
