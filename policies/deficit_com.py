"""DeficitCom: shortest transfer first, unless a job has fallen behind (issue 21).

The published strategies sit on a front ([BWS] §6.2, W = 1.1): GreedyYield keeps
the worst yield highest and GreedyCom (shortest transfer first) the efficiency.
DeficitCom serves S(t) by GREEDY_FILL in non-decreasing order of

    key_i = V_i/b_i − λ·D_i,    D_i = (t − τ_i) − P_i

where V_i/b_i is the time A_i's pending operation still needs at full speed
(GreedyCom's key, eq. 3) and D_i the time A_i has lost so far against running
alone: y_i(t) = 1 − D_i/(t − τ_i) (eq. 6). D_i only grows while A_i waits for
I/O, and the MinYield at T_end is 1 − max_i D_i(T_end)/(T_end − τ_i), so the
deficit is the quantity the worst-case yield is made of.

Why this key: for two jobs j, k, serving j first delays k by V_j/b_j and serving
k first delays j by V_k/b_k; the larger of the two deficits after both are done
is smaller with j first exactly when V_j/b_j − D_j ≤ V_k/b_k − D_k. So λ = 1 is
the pairwise min-max order, λ → 0 is GreedyCom (which minimises the number of
waiting jobs, the efficiency loss), λ → ∞ is largest-deficit first (GreedyYield
when every τ_i is equal). λ is tuned (docs/policies.md, "DeficitCom").

It uses what GreedyCom and GreedyYield use, nothing else: V_i from
``remaining_estimate()`` (as GreedyCom), P_i and τ_i (as GreedyYield). A job whose
volume is unknown (no volume given, no past operation) counts V_i = 0: it is
ordered by its deficit alone, as GreedyYield serves fresh jobs first, so a job
that never tells its volume is never starved by those that do.
"""

from __future__ import annotations

from pydantic import Field

from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.greedy import known_remaining
from burstctl.policies.sharing import greedy_fill
from burstctl.policies.view import JobId, JobView, SystemView

# λ range: 0 is GreedyCom; above 1e6 the deficit (seconds) decides alone for any
# transfer shorter than ~11 days at λ = 1e6, i.e. largest-deficit first: a larger λ is
# a unit mistake.
MAX_WEIGHT = 1e6


class DeficitComParams(PolicyParams):
    weight: float = Field(  # λ, dimensionless (seconds of transfer per second of deficit)
        default=0.3,
        ge=0.0,
        le=MAX_WEIGHT,
        allow_inf_nan=False,
        description="λ: seconds of transfer a second of deficit outweighs",
    )


class DeficitCom(Policy):
    """GREEDY_FILL by non-decreasing V_i/b_i − λ·D_i, then index (module docstring)."""

    name = "deficit-com"
    Params = DeficitComParams
    params: DeficitComParams

    def allocate(self, view: SystemView) -> dict[JobId, float]:
        now = view.now
        weight = self.params.weight

        def key(job: JobView) -> tuple[float, int, str]:
            v = known_remaining(job)
            transfer = 0.0 if v is None else v / job.cap  # V_i/b_i, eq. (3)
            deficit = (now - job.released_at) - job.progress  # D_i
            return (transfer - weight * deficit, job.index, job.job_id)

        return greedy_fill(sorted(view.active_jobs(), key=key), view.capacity)
