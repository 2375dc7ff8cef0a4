"""Set-10, the I/O-Sets strategy (bandwidth-sharing paper [BWS] §4.2, after Boito et al.).

Owns the online classification of jobs into I/O-sets by their mean iteration
length ω (learned from the views the policy is shown) and the priority split
between sets. The semantics are the reference simulator's Set10Learn
([BWS-SIM] simu.cc: ``computeSet10``), which is what the simulator's results
are checked against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field

from burstctl.common.limits import MAX_JOBS, MAX_TEXT, identifier_problem
from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.sharing import greedy_fill
from burstctl.policies.view import (
    Columns,
    JobId,
    RowRates,
    SystemView,
    job_cap,
    remaining_estimate,
)

# ω of a job seen for the first time (as ``computeSet10``): set n = −2, weight 100,
# shared by every new job — high priority, but not a strictly dominant set.
FIRST_OMEGA = 0.01

# n is clamped to ±N_LIMIT so 10^(−n) stays a positive finite weight; a mean
# iteration of 0 s (zero-length work and zero-volume operations) gets −N_LIMIT.
N_LIMIT = 30


# The range of a known ω, seconds: from a microsecond (below any iteration of
# compute and I/O) to about 31.7 years. Sets are ⌊log10 ω⌉, so this is 16 sets;
# anything outside is a unit mistake, not an application.
MIN_OMEGA = 1e-6
MAX_OMEGA = 1e9


def _job_id(value: str) -> str:
    problem = identifier_problem(value)
    if problem:
        raise ValueError(f"a job id {problem}")
    return value


# a job id as every door takes it (common/limits.py)
_JobId = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(_job_id)]
_Omega = Annotated[float, Field(ge=MIN_OMEGA, le=MAX_OMEGA, allow_inf_nan=False)]


class Set10Params(PolicyParams):
    # True: learn ω online (reference Set10Learn). False: no job is ever
    # classified, so every job stays in the one new-job set and the split is
    # FCFS by (R_i, index).
    learn: bool = True
    # ω_i known beforehand, seconds, by job id (the reference's Set10 with the
    # instance's wIter: `burstctl sim run --known-omega`; live, an operator who
    # knows a job's iteration length). A listed job is in set ⌊log10 ω_i⌉ from
    # its first operation on and is never learned; the others follow ``learn``.
    known_omega: dict[_JobId, _Omega] = Field(
        default_factory=dict,
        max_length=MAX_JOBS,
        description="ω_i known beforehand, seconds, by job id",
    )


@dataclass(slots=True)
class _Learned:
    omega: float = FIRST_OMEGA  # ω_i, mean iteration length, seconds
    count: int = 0  # c: operations counted so far
    posted_at: float | None = None  # R_i of the operation last counted
    set_index: int = 0  # n of ω (kept with it: a log10 per job and decision is costly)


def round_half_away(x: float) -> int:
    """Nearest integer, .5 away from zero, like C ``round`` (not Python's half-to-even)."""
    whole = math.floor(abs(x))
    n = whole + 1 if abs(x) - whole >= 0.5 else whole
    return int(math.copysign(n, x))


def set_index(omega: float) -> int:
    """n = ⌊log10 ω⌉ (§4.2; rounded as ``computeSet10`` rounds), clamped to ±N_LIMIT."""
    if not omega > 0.0:
        return -N_LIMIT
    x = math.log10(omega)
    if not math.isfinite(x):
        return N_LIMIT
    # round_half_away(x), inline (called at every counted operation)
    a = -x if x < 0.0 else x
    whole = math.floor(a)
    n = whole + 1 if a - whole >= 0.5 else whole
    if x < 0.0:
        n = -n
    return -N_LIMIT if n < -N_LIMIT else N_LIMIT if n > N_LIMIT else n


_FIRST_SET = set_index(FIRST_OMEGA)  # n of a job seen for the first time
_WEIGHTS = {n: 10.0 ** (-n) for n in range(-N_LIMIT, N_LIMIT + 1)}  # q_n = 10^(−n)


class Set10(Policy):
    """I/O-Sets with ω learned online (or known); sets split B by weight q_n = 10^(−n),
    FCFS inside.

    Learning (``computeSet10``, Set10Learn): each time a job of S(t) shows a new
    post (its ``posted_at`` differs from the one last counted), ω ← 0.01 on
    the first, then the running mean of w + v/b_i over its later operations,
    where w = ``last_work`` (the work phase before the operation) and v its
    full volume (``volume``; when unknown, ``remaining_estimate() + moved``).
    The first operation seen is not averaged in, as the paper ignores v^(0).
    Learning happens only for jobs in S(t) and only from the views shown that
    were observed (``SystemView.observed``); an unobserved view (the merge of
    several replicas' digests) is decided with what was learned so far.
    Jobs in ``known_omega`` are not learned: their set is ⌊log10 ω_i⌉ of the
    given ω (``computeSet10``, Set10 with wIter > 0). Nor are the other jobs of
    ``SystemView.periodic`` (a declared period, or one learned by the controller from
    the job's phases): their ω is w + vol_io/b_i of that period.

    Allocation (the paper's extended algorithm for b_i < B, as the reference
    implements it): sets in order of first appearance in the stable order; set g
    has weight q_g and demand D_g = Σ demand of its members. Scan the
    unsaturated sets, offering s_g = q_g·X/Q_tot; a set with s_g > D_g gets
    every member's demand, leaves X and Q_tot, and the scan restarts. A scan
    that saturates no set stands: each set's s_g is split by GREEDY_FILL in
    FCFS order (R_i, then the stable order). s_g ≤ D_g there, so Σ rates = X and
    the split is work-conserving.

    Choices where the paper is silent: a job with no post time sorts as if
    posted now; a non-positive ω (all samples 0 s) is the shortest class, n is
    clamped to ±30; Q_tot is re-summed over the remaining sets after a
    saturation rather than decremented, so it never cancels to ≤ 0 (the same
    value up to rounding).
    """

    name = "set-10"
    Params = Set10Params
    params: Set10Params

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self._learned: dict[JobId, _Learned] = {}
        self._known_sets = {j: set_index(w) for j, w in self.params.known_omega.items()}
        self._learns = self.params.learn  # read at every decision
        # By row of the views shown: the post last counted there, its job id and set. A
        # row whose job and post match is classified without a lookup by job id (the
        # simulator's rows are its applications; a view built from rows numbers them
        # anew, and then the rows simply do not match).
        self._row_posted: list[float | None] = []
        self._row_ids: list[str | None] = []
        self._row_set: list[int] = []
        self._row_of: dict[JobId, int] = {}  # the row a job is remembered at

    def omega(self, job_id: JobId) -> float | None:
        """ω of ``job_id``: known, or learned so far (None: neither known nor seen in S(t))."""
        if job_id in self.params.known_omega:
            return self.params.known_omega[job_id]
        state = self._learned.get(job_id)
        return None if state is None else state.omega

    def allocate(self, view: SystemView) -> RowRates:
        learn = self._learns and view.observed
        known = self._periodic_sets(view) if view.periodic else self._known_sets
        if learn and not known:
            shares = self._unsaturated(view)
            if shares is not None:
                return shares
        columns = view.columns
        job_ids = columns.job_id
        sets: dict[int, list[int]] = {}  # n → member rows, in order of first appearance
        for r in view.active:
            n = known.get(job_ids[r]) if known else None
            if n is None:
                n = self._observe(columns, r) if learn else self._classified(job_ids[r])
            members = sets.get(n)
            if members is None:
                sets[n] = [r]
            else:
                members.append(r)
        posted_at = _posted_at(view)
        rates = _split(sets, columns.demand, posted_at, view.capacity)
        return [(r, rate) for r, rate in rates.items() if rate != 0.0]

    def _periodic_sets(self, view: SystemView) -> dict[JobId, int]:
        """The sets of the known ω, and of the jobs of ``view.periodic`` not among them (a
        declared period, or one learned by the controller from the job's phases): ω_i = w +
        vol_io/b_i, its iteration at full speed, as the learned mean measures it."""
        sets = dict(self._known_sets)
        for job_id, p in view.periodic.items():
            if job_id not in sets:
                cap = job_cap(p.nodes, view.node_bandwidth, view.capacity)
                sets[job_id] = set_index(p.w + (p.vol_io / cap if cap > 0.0 else 0.0))
        return sets

    def _unsaturated(self, view: SystemView) -> list[tuple[int, float]] | None:
        """The split with learned ω only (the simulator's Set10Learn) when no set
        saturates: each set's share to its FCFS-first member (``_split``'s one scan,
        whose GREEDY_FILL gives a set's whole share to that member: each share is at
        most its demand, so at most the set's demand D_g); None when a set saturates.
        Classifies (and learns) the rows as ``allocate`` does."""
        columns = view.columns
        job_ids = columns.job_id
        posted_at = columns.posted_at
        now = view.now
        row_posted, row_ids, row_set = self._row_posted, self._row_ids, self._row_set
        if len(row_posted) < len(job_ids):
            grow = len(job_ids) - len(row_posted)
            row_posted.extend([None] * grow)
            row_ids.extend([None] * grow)
            row_set.extend([0] * grow)
        # Sets in order of first appearance, each with its FCFS-first member, the least
        # (R_i, row): a later row replaces it only if posted strictly earlier (what min
        # over the members in row order gives).
        first: dict[int, int] = {}
        first_posted: dict[int, float] = {}
        q_tot = 0.0  # Q_tot = Σ q_n over the sets, in their order
        for r in view.active:
            p = posted_at[r]
            if row_posted[r] == p and row_ids[r] == job_ids[r]:
                n = row_set[r]
            else:
                n = self._observe(columns, r)
            if p is None:
                p = now
            if n not in first:
                first[n] = r
                first_posted[n] = p
                q_tot += _WEIGHTS[n]
            elif p < first_posted[n]:
                first[n] = r
                first_posted[n] = p
        demand = columns.demand
        capacity = view.capacity
        shares = []
        for n, r in first.items():
            share = _WEIGHTS[n] * capacity / q_tot
            if not share <= demand[r]:
                return None  # a set saturates: the general split
            shares.append((r, share))
        return shares

    def _observe(self, columns: Columns, r: int) -> int:
        """Counts row ``r``'s pending operation once, the first time it is seen; returns
        the set index n of its job's ω."""
        job_id = columns.job_id[r]
        posted_at = columns.posted_at[r]
        state = self._learned.get(job_id)
        if state is None:
            state = self._learned[job_id] = _Learned()
        elif state.posted_at == posted_at:
            self._remember(r, posted_at, job_id, state.set_index)
            return state.set_index
        state.posted_at = posted_at
        if state.count == 0:
            state.omega = FIRST_OMEGA
        else:
            volume = columns.volume[r]
            if not volume > 0.0:  # unknown: remaining_estimate() + moved
                volume = remaining_estimate(columns, r) + columns.moved[r]
            # ω_i = (1/j) Σ_k (w_i^(k) + d_i,min^(k)) with d_min = v/b_i (§4.2, eq. 3),
            # kept as a running mean over the operations after the first
            c = state.count
            omega = state.omega * (c - 1) + columns.last_work[r] + volume / columns.cap[r]
            state.omega = omega / c
        state.count += 1
        n = state.set_index = set_index(state.omega)
        self._remember(r, posted_at, job_id, n)
        return n

    def _remember(self, r: int, posted_at: float | None, job_id: str, n: int) -> None:
        """Row r shows ``job_id``'s post ``posted_at``, counted, in set n. A job is
        remembered at one row only (the row it was last seen at), so a row that
        matches is the job's state as it is now."""
        row_posted = self._row_posted
        if r < len(row_posted):
            before = self._row_of.get(job_id)
            if before is not None and before != r and self._row_ids[before] == job_id:
                row_posted[before] = None
            self._row_of[job_id] = r
            row_posted[r] = posted_at
            self._row_ids[r] = job_id
            self._row_set[r] = n

    def _classified(self, job_id: JobId) -> int:
        """n of what is learned of ``job_id`` so far, without learning (a view that was
        not observed here, e.g. merged from several replicas' digests)."""
        state = self._learned.get(job_id) if self.params.learn else None
        return _FIRST_SET if state is None or state.count == 0 else state.set_index


def _posted_at(view: SystemView) -> Sequence[float]:
    """R_i by row, a job with none as if posted now."""
    posted_at = view.columns.posted_at
    if all(posted_at[r] is not None for r in view.active):
        return posted_at  # type: ignore[return-value]
    now = view.now
    return [now if p is None else p for p in posted_at]


def _split(
    sets: dict[int, list[int]],
    demand: Sequence[float],
    posted_at: Sequence[float],
    capacity: float,
) -> dict[int, float]:
    """The proposals by row (zeros included: they keep a row's place in the order)."""
    weight = {}
    total = {}
    fcfs = {}
    for n, members in sets.items():
        weight[n] = _WEIGHTS[n]  # q_n = 10^(−n)
        total[n] = sum([demand[i] for i in members])  # D_g
        if len(members) == 1:
            fcfs[n] = members
        else:
            fcfs[n] = [i for _, i in sorted([(posted_at[i], i) for i in members])]
    rates: dict[int, float] = {}
    left = list(sets)  # unsaturated sets, in order
    q_tot = sum(weight[n] for n in left)
    x = capacity
    while left:
        for n in left:
            share = weight[n] * x / q_tot  # s_g = q_g·X/Q_tot
            if share > total[n]:
                for i in sets[n]:
                    rates[i] = demand[i]
                    x -= demand[i]
                left.remove(n)
                q_tot = sum(weight[g] for g in left)
                break
            # GREEDY_FILL of the set; the members it leaves out get 0
            order = fcfs[n]
            filled = greedy_fill(order, demand, share)
            rates.update(filled)
            for i in order[len(filled) :]:
                rates[i] = 0.0
        else:
            break  # a scan that saturated nothing: its fills stand
    return rates
