"""The yield- and volume-ordered greedy strategies of the bandwidth-sharing paper ([BWS] §4.1).

GreedyYield, GreedyCom, PeriodicGreedyYield and LookAheadGreedyYield all end in
GREEDY_FILL (``sharing.greedy_fill``): they differ only in the order they serve
S(t) in, in LookAhead's choice of who goes first, and in Periodic's extra
decision every δ. The semantics are those of the authors' reference simulator
([BWS-SIM] simu.cc: ``computeGreedyYield``, ``computeGreedyCom``, the
fixedWindow branch of ``compute``, ``computeLookAheadGreedyYield``), which the
simulator's results are checked against; b_i there is ``demand`` here (equal to
b_i in the simulator, the controller's estimate live), so a job never gets more
than it can use and the rest flows on.

Volumes V_i come from ``JobView.remaining_estimate()``: the remaining volume
when the client said it, otherwise what the job's past operations suggest is
left. A job that has neither (no volume, no completed operation) is *unknown*.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import Field

from burstctl.policies.base import ArrayAllocator, ArrayView, Policy, PolicyParams
from burstctl.policies.decision import enforce_rows
from burstctl.policies.sharing import greedy_fill, greedy_fill_ranked, greedy_fill_rows
from burstctl.policies.view import FRESH_YIELD, JobId, JobView, SystemView


def known_remaining(job: JobView) -> float | None:
    """V_i, or None when nothing is known: no volume given and no past operation."""
    if job.remaining is None and job.mean_volume <= 0.0:
        return None
    return job.remaining_estimate()


def by_yield(jobs: Iterable[JobView], now: float) -> list[JobView]:
    """Non-decreasing y_i(t) (eq. 6), ties by the stable index (as ``computeGreedyYield``)."""
    return sorted(jobs, key=lambda j: (j.yield_at(now), j.index, j.job_id))


class GreedyYield(Policy):
    """GREEDY_FILL by non-decreasing yield y_i(t) = P_i/(t − τ_i) (eq. 6), then index.

    The lowest yields catch up first; fresh jobs (t = τ_i) have yield
    ``FRESH_YIELD`` = 0, so they come before everyone that has progressed.
    Needs no volumes.
    """

    name = "greedy-yield"

    def allocate(self, view: SystemView) -> dict[JobId, float]:
        return greedy_fill(by_yield(view.active_jobs(), view.now), view.capacity)

    def array_allocator(self) -> ArrayAllocator | None:
        return self.allocate_arrays

    def allocate_arrays(self, rows: ArrayView) -> list[tuple[int, float]]:
        """``allocate`` over arrays (:class:`ArrayAllocator`): the same decision, bit
        for bit, without building a view."""
        now = rows.now
        progress = rows.progress
        released_at = rows.released_at
        capacity = rows.capacity
        # The least (y_i, i) as the loop goes (a later row replaces it only with a
        # strictly smaller yield: min over the pairs in index order). When it takes all
        # of B (b_i = B, the simulator's case) nobody else gets anything.
        first = -1
        least = 0.0
        for i in rows.active:
            # y_i(t) as JobView.yield_at computes it (eq. 6); the index breaks ties
            elapsed = now - released_at[i]
            y = FRESH_YIELD if elapsed <= 0.0 else progress[i] / elapsed
            if first < 0 or y < least:
                first, least = i, y
        if first >= 0 and capacity > 0.0:
            d = rows.demand[first]
            if not capacity > d:
                return [(first, capacity if capacity < d else d)]
        ranked = []
        for i in rows.active:
            elapsed = now - released_at[i]
            ranked.append((FRESH_YIELD if elapsed <= 0.0 else progress[i] / elapsed, i))
        return greedy_fill_ranked(ranked, rows.demand, capacity)


# The range of δ, seconds. Every δ the controller decides once more, whatever
# happened: below 1 ms the timer alone asks for over 1,000 decisions per second
# (δ = 1e-300 kept a core busy with ~65k/s, issue 15), faster than an allocation
# reaches a client and is used (burst_window = 50 ms by default), so nothing is
# gained. Above one day a period is no period: decisions happen at every event
# anyway, and a larger number is a unit mistake. The simulator's δ from the
# paper's instances ([BWS] §6.2) is seconds to tens of seconds.
MIN_DELTA = 1e-3
MAX_DELTA = 86_400.0


class PeriodicParams(PolicyParams):
    delta: float = Field(  # δ, seconds
        default=1.0,
        ge=MIN_DELTA,
        le=MAX_DELTA,
        allow_inf_nan=False,
        description="δ, seconds between decisions without an event",
    )


class PeriodicGreedyYield(GreedyYield):
    """GreedyYield that also decides again δ seconds after every decision (§4.1).

    The reference simulator's fixedWindow restarts the period at every event
    ([BWS-SIM] simu.cc: ``compute``): returning δ from every decision is exactly
    that. The paper sets δ = (T_end − T_begin)/E(+), with E(+) the number of
    solo-mode phases; the simulator computes that (as ``addApps`` does) and
    passes it as ``delta``.
    """

    name = "periodic-greedy-yield"
    Params = PeriodicParams
    params: PeriodicParams

    def period(self, view: SystemView) -> float:
        return self.params.delta

    def fixed_period(self) -> float:
        return self.params.delta

    def array_allocator(self) -> ArrayAllocator | None:
        return self.allocate_arrays  # GreedyYield's, with δ from fixed_period


class GreedyCom(Policy):
    """GREEDY_FILL by non-decreasing V_i/b_i (time to finish at full speed), then index.

    V_i is ``remaining_estimate()``: live, when the client did not give the
    volume, it is the job's mean past volume minus what the operation moved
    (0 once overdue, so an overdue operation is taken as about to finish).
    A job with no volume and no history is unknown and served after every
    job with an estimate (§4.1 assumes volumes are known; serving them last is
    our choice, docs/references.md).
    """

    name = "greedy-com"

    def allocate(self, view: SystemView) -> dict[JobId, float]:
        def key(job: JobView) -> tuple[float, int, str]:
            v = known_remaining(job)
            # d_i = V_i / b_i, the transfer time at full speed (eq. 3)
            d = math.inf if v is None else v / job.cap
            return (d, job.index, job.job_id)

        return greedy_fill(sorted(view.active_jobs(), key=key), view.capacity)

    def array_allocator(self) -> ArrayAllocator | None:
        return self.allocate_arrays

    def allocate_arrays(self, rows: ArrayView) -> list[tuple[int, float]]:
        """``allocate`` over arrays (:class:`ArrayAllocator`), every V_i known: the same
        decision, bit for bit."""
        remaining, cap = rows.remaining, rows.cap
        capacity = rows.capacity
        # The least (V_i/b_i, i) as the loop goes (as GreedyYield's array path): when
        # it takes all of B nobody else gets anything.
        first = -1
        least = 0.0
        for i in rows.active:
            key = remaining[i] / cap[i]
            if first < 0 or key < least:
                first, least = i, key
        if first >= 0 and capacity > 0.0:
            d = rows.demand[first]
            if not capacity > d:
                return [(first, capacity if capacity < d else d)]
        ranked = [(remaining[i] / cap[i], i) for i in rows.active]
        return greedy_fill_ranked(ranked, rows.demand, capacity)


class LookAheadGreedyYield(Policy):
    """Give each job priority in turn; keep the choice with the best projected minimum yield.

    As [BWS-SIM] simu.cc: ``computeLookAheadGreedyYield``, for m ≥ 2 jobs of S(t)
    in index order: candidate i gets β_i = min(demand_i, B), the others share
    B − β_i by GreedyYield; the horizon is h = min(T, first completion t + V_k/β_k);
    Z_i = min(1, min_k y_k(h)) with y_k(h) the yield at h if the allocation
    holds; the first strictly largest Z_i above 0 wins, else candidate 0.
    With one job it gets min(demand, B).

    Where the reference cannot be followed (live only):
    - T is ``view.horizon``; live it is None and only completions bound h.
    - A job whose V_i is unknown or 0 (overdue estimate) does not bound h:
      its completion time is unknown.
    - A candidate with no horizon at all (live, T None, no known completion)
      cannot be scored and is never chosen over a scored one; when no
      candidate can be scored the allocation is GreedyYield's.
    - y_k(h) is ``FRESH_YIELD`` when h ≤ τ_k, as for y_k(t).
    """

    name = "look-ahead-greedy-yield"

    def allocate(self, view: SystemView) -> dict[JobId, float]:
        active = view.active_jobs()
        capacity = view.capacity
        if len(active) <= 1:
            return {j.job_id: min(j.demand, capacity) for j in active}
        ordered = by_yield(active, view.now)
        volumes = {j.job_id: known_remaining(j) for j in active}

        best: dict[JobId, float] | None = None
        best_z = 0.0  # reference: strict `>` from threshold 0
        first: dict[JobId, float] | None = None
        scored = False
        for candidate in active:
            beta = min(candidate.demand, capacity)
            rates = greedy_fill([j for j in ordered if j is not candidate], capacity - beta)
            rates[candidate.job_id] = beta
            if first is None:
                first = rates
            z = _min_projected_yield(view, active, rates, volumes)
            if z is None:
                continue
            scored = True
            if z > best_z:
                best_z, best = z, rates
        if not scored:
            return greedy_fill(ordered, capacity)
        if best is None:
            assert first is not None
            return first
        return best

    def array_allocator(self) -> ArrayAllocator | None:
        return self.allocate_arrays

    def allocate_arrays(self, rows: ArrayView) -> list[tuple[int, float]]:
        """``decide`` on ``allocate`` over arrays (:class:`ArrayAllocator`), every V_i
        known: the same rates, bit for bit.

        The same float operations as ``allocate``, fewer of them: a job the candidate's
        fill leaves at 0 has y_k(h) = P_k/(h − τ_k) (P_k + 0 = P_k), and when every τ_k
        is the same (synthetic windows) the least of those is the least P_k's, as
        rounded division by one positive number keeps the order. Z is a minimum, so
        the order it is taken in does not matter. ``enforce`` drops the zero rates,
        which leaves the fill's positive prefix, then the candidate."""
        active = rows.active
        capacity = rows.capacity
        demand = rows.demand
        cap = rows.cap
        if len(active) <= 1:
            one = [(i, min(demand[i], capacity)) for i in active]
            return enforce_rows(one, demand, cap, capacity)
        now = rows.now
        progress = rows.progress
        released_at = rows.released_at
        remaining = rows.remaining
        horizon = rows.horizon
        tau0 = released_at[active[0]]
        by_progress = None  # (P_k, k) ascending, when every τ_k is τ0
        if all(released_at[i] == tau0 for i in active):
            by_progress = sorted([(progress[i], i) for i in active])
            if capacity > 0.0:
                alone = _look_ahead_alone(rows, by_progress, tau0)
                if alone is not None:
                    return enforce_rows(alone, demand, cap, capacity)
        ranked = []
        for i in active:  # by_yield
            elapsed = now - released_at[i]
            ranked.append((FRESH_YIELD if elapsed <= 0.0 else progress[i] / elapsed, i))
        ranked.sort()
        ordered = [i for _, i in ranked]

        best: list[tuple[int, float]] | None = None
        best_z = 0.0  # reference: strict `>` from threshold 0
        first: list[tuple[int, float]] | None = None
        scored = False
        for c in active:
            d = demand[c]
            beta = capacity if capacity < d else d  # min(demand, capacity)
            left = capacity - beta
            served = []  # the fill's positive prefix (greedy_fill of the others)
            for j in ordered:
                if j == c:
                    continue
                if not left > 0.0:
                    break
                d = demand[j]
                give = left if left < d else d
                left -= give
                served.append((j, give))
            served.append((c, beta))
            if first is None:
                first = served
            # _min_projected_yield: h, then Z = min(1, min_k y_k(h))
            h = horizon
            for j, b in served:
                if b > 0.0:
                    v = remaining[j]
                    if v > 0.0:
                        end = now + v / b
                        if h is None or end < h:
                            h = end
            if h is None:
                continue
            scored = True
            z = 1.0
            span = h - now
            for j, r in served:
                tau = released_at[j]
                y = (progress[j] + span * r / cap[j]) / (h - tau) if h > tau else FRESH_YIELD
                if y < z:
                    z = y
            if by_progress is not None:
                taken = (c,) if len(served) == 1 else {k for k, _ in served}
                for p, j in by_progress:  # the least P_k at rate 0
                    if j not in taken:
                        y = p / (h - tau0) if h > tau0 else FRESH_YIELD
                        if y < z:
                            z = y
                        break
            else:
                rated = dict(served)
                for j in active:
                    if j not in rated:
                        tau = released_at[j]
                        y = progress[j] / (h - tau) if h > tau else FRESH_YIELD
                        if y < z:
                            z = y
            if z > best_z:
                best_z, best = z, served
        if not scored:
            return greedy_fill_rows(ordered, demand, capacity)
        chosen = best if best is not None else first
        assert chosen is not None
        return enforce_rows(chosen, demand, cap, capacity)


def _look_ahead_alone(
    rows: ArrayView, by_progress: list[tuple[float, int]], tau0: float
) -> list[tuple[int, float]] | None:
    """:meth:`LookAheadGreedyYield.allocate_arrays` when every candidate takes all of
    B (each demand ≥ B, the simulator's b_i = B): a candidate's fill gives nobody
    else anything, so it is served alone at β = B and the least P_k at rate 0 is
    the first of ``by_progress`` that is not it. The same values in the same order
    as the general loop, without its lists; None when that case does not hold or
    no candidate can be scored (the general path decides)."""
    capacity = rows.capacity
    demand = rows.demand
    now = rows.now
    progress = rows.progress
    released_at = rows.released_at
    remaining = rows.remaining
    cap = rows.cap
    horizon = rows.horizon
    p0, j0 = by_progress[0]
    p1, _ = by_progress[1]
    best = -1
    best_z = 0.0  # reference: strict `>` from threshold 0
    scored = False
    for c in rows.active:
        if not demand[c] >= capacity:
            return None
        h = horizon
        v = remaining[c]
        if v > 0.0:
            end = now + v / capacity
            if h is None or end < h:
                h = end
        if h is None:
            continue
        scored = True
        z = 1.0
        tau = released_at[c]
        y = (progress[c] + (h - now) * capacity / cap[c]) / (h - tau) if h > tau else FRESH_YIELD
        if y < z:
            z = y
        p = p0 if j0 != c else p1  # the least P_k at rate 0
        y = p / (h - tau0) if h > tau0 else FRESH_YIELD
        if y < z:
            z = y
        if z > best_z:
            best_z, best = z, c
    if not scored:
        return None
    return [(best if best >= 0 else rows.active[0], capacity)]


def _min_projected_yield(
    view: SystemView,
    active: Sequence[JobView],
    rates: dict[JobId, float],
    volumes: dict[JobId, float | None],
) -> float | None:
    """Z = min(1, min_k y_k(h)) under ``rates`` held until h; None without a horizon."""
    now = view.now
    h = view.horizon  # T
    for job_id, beta in rates.items():  # (``rates`` has every job of ``active``)
        if beta > 0.0:
            v = volumes[job_id]
            if v is not None and v > 0.0:
                end = now + v / beta  # completion of V_k at β_k
                if h is None or end < h:
                    h = end
    if h is None:
        return None
    z = 1.0
    for job in active:
        # y_k(h) = (P_k + (h − t)·β_k/b_k)/(h − τ_k): eq. (6) with the
        # transfer progress V^(transferred)/b_k of rate β_k over (t, h]
        if h > job.released_at:
            y = (job.progress + (h - now) * rates[job.job_id] / job.cap) / (h - job.released_at)
        else:
            y = FRESH_YIELD
        if y < z:  # z = min(z, y) without the call: this loop is the policy's hot spot
            z = y
    return z
