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

Each reads the view's columns. Volumes V_i are ``known_remaining``: the
remaining volume when the client said it, otherwise what the job's past
operations suggest is left (``JobView.remaining_estimate``). A job that has
neither (no volume, no completed operation) is *unknown*. Ties are broken in
the stable order (the row).
"""

from __future__ import annotations

import math

from pydantic import Field

from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.sharing import greedy_fill, greedy_fill_by, least_quotient
from burstctl.policies.view import FRESH_YIELD, Columns, RowRates, SystemView, remaining_estimate


def known_remaining(columns: Columns, row: int) -> float | None:
    """V_i of ``row``, or None when nothing is known: no volume given and no past
    operation (``JobView.remaining_estimate`` otherwise)."""
    if columns.remaining[row] is None and columns.mean_volume[row] <= 0.0:
        return None
    return remaining_estimate(columns, row)


def yields(view: SystemView) -> list[tuple[float, int]]:
    """(y_i(t), row) for S(t), in the stable order: y_i(t) as ``JobView.yield_at`` (eq. 6)."""
    columns = view.columns
    now = view.now
    progress = columns.progress
    released_at = columns.released_at
    ranked = []
    for r in view.active:
        elapsed = now - released_at[r]
        ranked.append((FRESH_YIELD if elapsed <= 0.0 else progress[r] / elapsed, r))
    return ranked


def by_yield(view: SystemView) -> list[int]:
    """The rows of S(t) by non-decreasing y_i(t) (eq. 6), ties by the stable order (as
    ``computeGreedyYield``)."""
    return [r for _, r in sorted(yields(view))]


class GreedyYield(Policy):
    """GREEDY_FILL by non-decreasing yield y_i(t) = P_i/(t − τ_i) (eq. 6), then index.

    The lowest yields catch up first; fresh jobs (t = τ_i) have yield
    ``FRESH_YIELD`` = 0, so they come before everyone that has progressed.
    Needs no volumes.
    """

    name = "greedy-yield"

    def allocate(self, view: SystemView) -> RowRates:
        active = view.active
        if not active:
            return []
        columns = view.columns
        now = view.now
        progress = columns.progress
        released_at = columns.released_at
        capacity = view.capacity
        # The least (y_i, row). With one release time τ for every job (the synthetic
        # windows) and t > τ, the yields P_i/(t − τ) share their divisor
        # (``least_quotient``: no yield computed); otherwise each is computed as the loop
        # goes (a later row replaces the least only with a strictly smaller yield: min
        # over the pairs in row order).
        first = -1
        found = least_quotient(active, progress, released_at)
        if found is not None:
            row, least, before = found
            elapsed = now - released_at[row]
            if elapsed <= 0.0:
                first = active[0]  # every job fresh: every yield is FRESH_YIELD
            elif before / elapsed > least / elapsed:
                first = row
        if first < 0:
            least = 0.0
            for r in active:
                elapsed = now - released_at[r]
                y = FRESH_YIELD if elapsed <= 0.0 else progress[r] / elapsed  # (yields)
                if first < 0 or y < least:
                    first, least = r, y
        # When it takes all of B (b_i = B, the simulator's case) nobody else gets anything.
        if capacity > 0.0:
            d = columns.demand[first]
            if not capacity > d:
                return [(first, capacity if capacity < d else d)]
        return greedy_fill_by(yields(view), columns.demand, capacity)


# The range of δ, seconds. Every δ the controller decides once more, whatever
# happened: below 1 ms the timer alone asks for over 1,000 decisions per second,
# faster than an allocation reaches a client and is used (burst_window = 50 ms by
# default), so nothing is gained; a tiny δ only keeps a core busy. Above one day a
# period is no period: decisions happen at every event anyway, and a larger number
# is a unit mistake. The simulator's δ from the paper's instances ([BWS] §6.2) is
# seconds to tens of seconds.
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

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self._delta = self.params.delta  # asked at every decision

    def period(self, view: SystemView) -> float:
        return self._delta


class GreedyCom(Policy):
    """GREEDY_FILL by non-decreasing V_i/b_i (time to finish at full speed), then index.

    V_i is ``known_remaining``: live, when the client did not give the
    volume, it is the job's mean past volume minus what the operation moved
    (0 once overdue, so an overdue operation is taken as about to finish).
    A job with no volume and no history is unknown and served after every
    job with an estimate (§4.1 assumes volumes are known; serving them last is
    our choice, docs/references.md).
    """

    name = "greedy-com"

    def allocate(self, view: SystemView) -> RowRates:
        columns = view.columns
        remaining = columns.remaining
        cap = columns.cap
        capacity = view.capacity
        # The least (d_i, row), d_i = V_i/b_i the transfer time at full speed (eq. 3): with
        # one b_i for every job (b_i = B, the simulator's case) the quotients share their
        # divisor (``least_quotient``); else as the loop goes, as GreedyYield's. When it
        # takes all of B nobody else gets anything.
        first = -1
        found = least_quotient(view.active, remaining, cap) if view.active else None
        if found is not None:
            row, least, before = found
            if before / cap[row] > least / cap[row]:
                first = row
        if first < 0:
            least = 0.0
            for r in view.active:
                v = remaining[r]
                if v is None:
                    v = known_remaining(columns, r)
                key = math.inf if v is None else v / cap[r]
                if first < 0 or key < least:
                    first, least = r, key
        if first >= 0 and capacity > 0.0:
            d = columns.demand[first]
            if not capacity > d:
                return [(first, capacity if capacity < d else d)]
        ranked = []
        for r in view.active:
            v = remaining[r]
            if v is None:
                v = known_remaining(columns, r)
            ranked.append((math.inf if v is None else v / cap[r], r))
        return greedy_fill_by(ranked, columns.demand, capacity)


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

    A job the candidate's fill leaves at 0 has y_k(h) = P_k/(h − τ_k) (P_k + 0 = P_k),
    and when every τ_k is the same (synthetic windows) the least of those is the least
    P_k's, as rounded division by one positive number keeps the order; Z is a minimum,
    so the order it is taken in does not matter. A candidate's proposal is its fill's
    positive prefix, then the candidate (``decide`` drops the zeros).
    """

    name = "look-ahead-greedy-yield"

    def allocate(self, view: SystemView) -> RowRates:
        columns = view.columns
        active = view.active
        capacity = view.capacity
        demand = columns.demand
        if len(active) <= 1:
            return [(r, min(demand[r], capacity)) for r in active]
        now = view.now
        progress = columns.progress
        released_at = columns.released_at
        remaining = columns.remaining
        cap = columns.cap
        horizon = view.horizon
        tau0 = released_at[active[0]]
        by_progress = None  # (P_k, k) ascending, when every τ_k is τ0
        if all(released_at[r] == tau0 for r in active):
            by_progress = sorted([(progress[r], r) for r in active])
            if capacity > 0.0:
                alone = _look_ahead_alone(view, by_progress, tau0)
                if alone is not None:
                    return alone
        ordered = by_yield(view)

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
            # h, then Z = min(1, min_k y_k(h))
            h = horizon
            for j, b in served:
                if b > 0.0:
                    v = remaining[j]
                    if v is None:
                        v = known_remaining(columns, j)
                    if v is not None and v > 0.0:
                        end = now + v / b  # completion of V_k at β_k
                        if h is None or end < h:
                            h = end
            if h is None:
                continue
            scored = True
            z = 1.0
            span = h - now
            for j, r in served:
                # y_k(h) = (P_k + (h − t)·β_k/b_k)/(h − τ_k): eq. (6) with the
                # transfer progress V^(transferred)/b_k of rate β_k over (t, h]
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
            return greedy_fill(ordered, demand, capacity)
        chosen = best if best is not None else first
        assert chosen is not None
        return chosen


def _look_ahead_alone(
    view: SystemView, by_progress: list[tuple[float, int]], tau0: float
) -> list[tuple[int, float]] | None:
    """:meth:`LookAheadGreedyYield.allocate` when every candidate takes all of B (each
    demand ≥ B, the simulator's b_i = B): a candidate's fill gives nobody else
    anything, so it is served alone at β = B and the least P_k at rate 0 is the
    first of ``by_progress`` that is not it. The same values in the same order as
    the general loop, without its lists; None when that case does not hold or no
    candidate can be scored (the general loop decides)."""
    columns = view.columns
    capacity = view.capacity
    demand = columns.demand
    now = view.now
    progress = columns.progress
    released_at = columns.released_at
    remaining = columns.remaining
    cap = columns.cap
    horizon = view.horizon
    p0, j0 = by_progress[0]
    p1, _ = by_progress[1]
    best = -1
    best_z = 0.0  # reference: strict `>` from threshold 0
    scored = False
    for c in view.active:
        if not demand[c] >= capacity:
            return None
        h = horizon
        v = remaining[c]
        if v is None:
            v = known_remaining(columns, c)
        if v is not None and v > 0.0:
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
    return [(best if best >= 0 else view.active[0], capacity)]
