"""DeficitCom: the cheapest jobs first, then shortest transfer first unless a job has
fallen behind.

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
when every τ_i is equal). The default is λ = 1 (docs/policies.md, "DeficitCom").

The key uses what GreedyCom and GreedyYield use, nothing else: V_i from
``known_remaining`` (as GreedyCom), P_i and τ_i (as GreedyYield); the
protected class below also reads ``last_work``, as Set-10 does. A job whose
volume is unknown (no volume given, no past operation) counts V_i = 0: it is
ordered by its deficit alone, as GreedyYield serves fresh jobs first, so a job
that never tells its volume is never starved by those that do.

The protected class (``budget`` β). Ordering by the key equalises the deficits,
so every yield ends near the lowest and the efficiency (the mean yield, eq. 10
with b_i = B) cannot rise much above the MinYield. Yet a job's yield is cheap or
dear in bandwidth: over a long window A_i at yield y_i moves y_i·φ_i of B, φ_i
its I/O fraction (the time of its transfers at full speed over its iteration),
so with the MinYield held, Σ y_i is largest when the jobs with the smallest φ_i
run at yield 1 and the others share what is left (a fractional knapsack). The
policy learns φ̂_i per job from the views it is shown, as Set-10 learns ω
(``last_work`` and v/b_i of each new operation after the first, running sums),
and serves first the jobs with the smallest φ̂_i whose load Σ φ̂_i·b_i is at most
β of the load of all the learned jobs (≈ W·B): they take about β·W of B and cost
the others about β·(1 − y)/(1 − β) of yield. A share of the load, not of B: at
low pressure the yields are near 1 and the protected class has little to buy, so
it shrinks with the load (an absolute share cost MinYield at W = 0.5 on the
tuning seeds). Inside each class, the key above. β = 0 is the plain key. A job not seen in S(t)
for STALE_PERIODS of its learned iterations is forgotten (it has left, or
changed), so the budget goes to the jobs still there and the state stays bounded;
a job forgotten after its first operation only (a short start-up before a long
phase) is learned again from its next. A job of ``SystemView.periodic`` (a declared
period, or one the controller learned from the job's phases, ``policies/periods.py``)
is not learned per operation: its φ is its period's, (vol_io/b_i) / (w + vol_io/b_i).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from pydantic import Field

from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.greedy import known_remaining
from burstctl.policies.sharing import greedy_fill_by
from burstctl.policies.view import (
    Columns,
    JobId,
    RowRates,
    SystemView,
    job_cap,
    remaining_estimate,
)

# λ range: 0 is GreedyCom; above 1e6 the deficit (seconds) decides alone for any
# transfer shorter than ~11 days at λ = 1e6, i.e. largest-deficit first: a larger λ is
# a unit mistake.
MAX_WEIGHT = 1e6

# A job not seen in S(t) for this many of its learned iterations (w + v/b) is
# forgotten. Far above the phase noise of [BWS] §6.2 (a phase is 0.5–1.5× its mean).
STALE_PERIODS = 10.0


class DeficitComParams(PolicyParams):
    weight: float = Field(  # λ, dimensionless (seconds of transfer per second of deficit)
        default=1.0,
        ge=0.0,
        le=MAX_WEIGHT,
        allow_inf_nan=False,
        description="λ: seconds of transfer a second of deficit outweighs",
    )
    budget: float = Field(  # β, a share of the learned I/O load
        default=0.025,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description=(
            "β: the jobs with the smallest learned I/O fractions, whose load is at most β "
            "of all the learned jobs' load, are served first (0: none)"
        ),
    )


@dataclass(slots=True)
class _Learned:
    """What is learned of one job: its last post seen, when it was last seen in S(t),
    the length of its last iteration (work before its last operation and that
    operation's transfer at full speed, the first included: for forgetting), and sums
    over its operations after the first (work before each, and its transfer)."""

    posted_at: float | None
    seen: float
    iteration: float = 0.0
    cap: float = 0.0  # b_i at the last counted operation
    count: int = 0
    work: float = 0.0
    transfer: float = 0.0

    def fraction(self) -> float:
        """φ̂: the learned I/O fraction (transfer time over iteration time)."""
        total = self.work + self.transfer
        return self.transfer / total if total > 0.0 else 1.0


class DeficitCom(Policy):
    """GREEDY_FILL: the protected class first, then by non-decreasing V_i/b_i − λ·D_i,
    then index (module docstring)."""

    name = "deficit-com"
    Params = DeficitComParams
    params: DeficitComParams

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self._learned: dict[JobId, _Learned] = {}
        # (φ̂, job id, φ̂·b_i) of every job with a counted operation, sorted by φ̂ then
        # job id: the protected class is a prefix of it, kept in order by bisection as
        # each job's φ̂ changes
        self._ranked: list[tuple[float, JobId, float]] = []
        self._protected: frozenset[JobId] = frozenset()
        self._changes = 0  # operations counted since the last sweep of stale jobs

    @property
    def protected(self) -> frozenset[JobId]:
        """The jobs served first at the last decision (the protected class)."""
        return self._protected

    def fraction(self, job_id: JobId) -> float | None:
        """φ̂ learned for ``job_id`` (None: no operation counted yet)."""
        state = self._learned.get(job_id)
        return None if state is None or state.count == 0 else state.fraction()

    def allocate(self, view: SystemView) -> RowRates:
        now = view.now
        weight = self.params.weight
        columns = view.columns
        ids = columns.job_id
        posted_at = columns.posted_at
        active = view.active
        changes = self._changes
        periodic = view.periodic
        if self.params.budget > 0.0 and periodic:
            self._declare(view)
        if self.params.budget > 0.0 and view.observed:
            learned = self._learned
            for r in active:
                if periodic and ids[r] in periodic:
                    continue  # its fraction is the period's (``_declare``)
                state = learned.get(ids[r])
                if state is None:
                    learned[ids[r]] = _Learned(
                        posted_at[r], now, columns.last_work[r] + _transfer(columns, r)
                    )
                    continue
                state.seen = now
                if state.posted_at != posted_at[r]:
                    self._count(columns, r, state)
        if self._changes != changes:
            self._protected = self._choose(now)
        protected = self._protected
        cap = columns.cap
        released_at = columns.released_at
        progress = columns.progress
        ranked = []
        for r in active:  # (the protected class first, key_i, row): rows break ties
            v = known_remaining(columns, r)
            transfer = 0.0 if v is None else v / cap[r]  # V_i/b_i, eq. (3)
            deficit = (now - released_at[r]) - progress[r]  # D_i
            ranked.append(((ids[r] not in protected, transfer - weight * deficit), r))
        return greedy_fill_by(ranked, columns.demand, view.capacity)

    def _count(self, columns: Columns, r: int, state: _Learned) -> None:
        """Counts row ``r``'s new operation (seen for the first time; a job's first is not
        counted: its work phase may be a start-up, as [BWS] §4.2 ignores v^(0)) and moves
        the job to its new place in the ranking."""
        job_id = columns.job_id[r]
        cap = columns.cap[r]
        last_work = columns.last_work[r]
        state.posted_at = columns.posted_at[r]
        transfer = _transfer(columns, r)
        if state.count > 0:
            self._unrank(job_id, state)
        state.count += 1
        state.work += last_work
        state.transfer += transfer
        state.iteration = last_work + transfer
        state.cap = cap
        phi = state.fraction()
        bisect.insort(self._ranked, (phi, job_id, phi * cap))
        self._changes += 1

    def _declare(self, view: SystemView) -> None:
        """The jobs of ``view.periodic`` (declared, or learned from their phases by the
        controller) take φ = (vol_io/b_i) / (w + vol_io/b_i) from their period instead of
        learning it per operation; they count as seen while listed (they are live)."""
        now = view.now
        learned = self._learned
        for job_id, p in view.periodic.items():
            cap = job_cap(p.nodes, view.node_bandwidth, view.capacity)
            transfer = p.vol_io / cap if cap > 0.0 else 0.0
            state = learned.get(job_id)
            if state is None:
                state = learned[job_id] = _Learned(None, now)
            state.seen = now
            if state.count == 1 and (state.work, state.transfer, state.cap) == (p.w, transfer, cap):
                continue
            if state.count > 0:
                self._unrank(job_id, state)
            state.count, state.work, state.transfer, state.cap = 1, p.w, transfer, cap
            state.iteration = p.w + transfer
            phi = state.fraction()
            bisect.insort(self._ranked, (phi, job_id, phi * cap))
            self._changes += 1

    def _unrank(self, job_id: JobId, state: _Learned) -> None:
        ranked = self._ranked
        del ranked[bisect.bisect_left(ranked, (state.fraction(), job_id))]  # (φ̂, id) is unique

    def _choose(self, now: float) -> frozenset[JobId]:
        """Forgets the stale jobs (once per as many counted operations as there are
        learned jobs: amortised O(1) an operation); returns the smallest-φ̂ jobs whose
        load Σ φ̂_i·b_i is at most β of all the learned jobs' load."""
        learned = self._learned
        if self._changes >= len(learned):
            self._changes = 0
            for job_id in [
                j for j, s in learned.items() if now - s.seen > STALE_PERIODS * s.iteration
            ]:
                state = learned.pop(job_id)
                if state.count > 0:
                    self._unrank(job_id, state)
        ranked = self._ranked
        budget = self.params.budget * math.fsum(load for _, _, load in ranked)
        chosen: list[JobId] = []
        total = 0.0
        for _, job_id, load in ranked:
            total += load
            if total > budget:
                break
            chosen.append(job_id)
        return frozenset(chosen)


def _transfer(columns: Columns, r: int) -> float:
    """v/b_i: the full-speed transfer time of row ``r``'s pending operation (v = its volume,
    or ``remaining_estimate() + moved`` when unknown, as Set-10 reads it)."""
    volume = columns.volume[r]
    if not volume > 0.0:
        volume = remaining_estimate(columns, r) + columns.moved[r]
    return volume / columns.cap[r]
