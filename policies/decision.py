"""The decision: a policy proposes, this module enforces.

``decide`` is the one path from a view to rates, taken by the controller's
scheduler, by its replicas for the global targets and by the simulator, and
the one place a proposal is enforced. Whatever a policy returns, the rates that
leave here are finite, ≥ 0, at most b_i, 0 for a job without demand, and sum to
at most B (within rounding). A replica that holds its part of a global split
(``targets``) blends it with the local policy's decision for jobs the split does
not cover yet (:func:`blend`).

Pure: no clock, no I/O; the same view and targets give the same decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TypeAlias

from burstctl.policies import rules as _rules
from burstctl.policies.base import WITHOUT_PERIOD, WITHOUT_SCHEDULES, Policy
from burstctl.policies.rules import Bindings
from burstctl.policies.schedule import NO_SCHEDULES, Schedule
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId, RowRates, SystemView

# Σ rates may exceed B by this fraction (rounding in a policy's sums) before scaling
SUM_TOLERANCE = 1e-9

Served: TypeAlias = RowRates  # (row of the view, rate > 0)
Fixes: TypeAlias = tuple[tuple[JobId, float], ...]  # (job, proposed rate) for each proposal fixed


class Decision:
    """Enforced rates, and what enforcing them took; read-only (built by :func:`decide`,
    once per decision, so a plain record: the simulator takes one at every event).

    ``served``: (row of ``view``, rate) for the jobs with a positive rate, in the order
    the policy proposed them; ``rates``: the same by job id (a job of the view not
    listed gets 0). ``period``: the policy's wish to decide again (None: at events
    only). ``fixes``: (job, proposed rate) for every job whose proposal broke a bound
    and was fixed; ``scaled``: the proposals summed to more than B and were scaled
    down; ``schedules``: periodic patterns of windows for some jobs of ``rates`` (their
    rate is the mean rate); ``refused``: (job, reason) for every schedule the policy
    proposed malformed (the job got none).

    A proposal taken as it is (the usual case) is a ``Decision`` whose last four are
    the class's: nothing fixed, scaled, scheduled or refused; one that enforcing
    changed is an ``Enforced``, which holds its own.
    """

    __slots__ = ("period", "served", "view")

    view: SystemView
    served: Served
    period: float | None
    fixes: Fixes = ()
    scaled: bool = False
    schedules: Mapping[JobId, Schedule] = NO_SCHEDULES
    refused: tuple[tuple[JobId, str], ...] = ()

    @property
    def rates(self) -> dict[JobId, float]:
        """The positive rates by job id, in the order of ``served`` (a new dict)."""
        ids = self.view.columns.job_id
        return {ids[r]: rate for r, rate in self.served}

    @property
    def clamped(self) -> bool:
        return bool(self.fixes) or self.scaled or bool(self.refused)

    def __repr__(self) -> str:
        return (
            f"Decision(rates={self.rates!r}, period={self.period!r}, fixes={self.fixes!r}, "
            f"scaled={self.scaled!r}, schedules={dict(self.schedules)!r}, "
            f"refused={self.refused!r})"
        )


class Enforced(Decision):
    """A decision whose proposal enforcing changed, or that holds schedules."""

    __slots__ = ("fixes", "refused", "scaled", "schedules")  # (shadowing the class's)

    fixes: Fixes
    scaled: bool
    schedules: Mapping[JobId, Schedule]
    refused: tuple[tuple[JobId, str], ...]


class Share(Mapping[JobId, float]):
    """A replica's part of a global split: its rate for each job of the split (the
    mapping) and ``ceilings``, the most it may give each of those jobs until the next
    exchange when capacity frees up (its rate plus its part of the job's global
    headroom; ``controller/merge.py: ceilings``). Every replica's ceilings of one job
    sum to at most the job's global cap b_j, so topping up within them keeps the cap
    across replicas. A job without a ceiling is held to its rate.

    ``schedules``: this replica's part of a global periodic pattern (``persched`` across
    replicas, docs/replicas.md): each listed job gets its schedule, and its rate is the
    schedule's mean rate. ``reserved``: the peak of those schedules' windows together, what
    they may take at one instant (computing or not); nothing tops other jobs up into it.
    ``budgets``: rule name → this replica's part of that rule's global limit
    (policies/rules.py).
    """

    __slots__ = ("_rates", "budgets", "ceilings", "reserved", "schedules")

    def __init__(
        self,
        rates: Mapping[JobId, float],
        ceilings: Mapping[JobId, float],
        schedules: Mapping[JobId, Schedule] = NO_SCHEDULES,
        reserved: float = 0.0,
        budgets: Mapping[str, float] | None = None,
    ) -> None:
        self._rates = dict(rates)
        self.ceilings = dict(ceilings)
        self.schedules = schedules
        self.reserved = reserved
        self.budgets: Mapping[str, float] = budgets if budgets is not None else {}
        for job_id, schedule in schedules.items():  # scheduled: of the split, at their mean
            self._rates[job_id] = self.ceilings[job_id] = schedule.mean_rate()

    def __getitem__(self, job_id: JobId) -> float:
        return self._rates[job_id]

    def __iter__(self) -> Iterator[JobId]:
        return iter(self._rates)

    def __len__(self) -> int:
        return len(self._rates)

    def __repr__(self) -> str:
        return f"Share({self._rates!r}, ceilings={self.ceilings!r})"


def decide(
    policy: Policy,
    view: SystemView,
    targets: Mapping[JobId, float] | None = None,
    rules: Bindings | None = None,
) -> Decision:
    """The policy's proposal for ``view`` (blended with ``targets`` when given; with the
    operator's ``rules`` applied when given: policies/rules.py), enforced: what every
    policy promises, made true. Rates are finite, ≥ 0, ≤ b_i, only for jobs with demand,
    and Σ ≤ B: a proposal out of its bounds is fixed (and listed in ``fixes``), a sum
    above B scaled down to it (``scaled``). Proposals for jobs outside the view are
    ignored; zeros are not listed."""
    cls = type(policy)
    wanted: Mapping[JobId, Schedule] | None
    bound = rules is not None and rules.binds(view)
    if targets is not None:  # schedules: a replica's part of a global pattern, if any
        proposed: Mapping[JobId, float] | RowRates = blend(policy, view, targets, rules)
        wanted = targets.schedules if isinstance(targets, Share) and targets.schedules else None
    elif bound:
        assert rules is not None
        proposed = _rules.allocate(policy, view, rules, _enforced_pairs)
        wanted = None if cls in WITHOUT_SCHEDULES else policy.schedules(view)
    else:
        proposed = policy.allocate(view)
        wanted = None if cls in WITHOUT_SCHEDULES else policy.schedules(view)
        if not wanted and type(proposed) is list:
            # The usual case, checked in one pass: rows, every rate positive and within its
            # bounds (each test False for NaN too), Σ ≤ B: the decision is then the
            # proposal as it is. (Each comparison on its own: one the interpreter runs fast.)
            columns = view.columns
            cap = columns.cap
            demand = columns.demand
            # One list for both (the simulator's, demand = b_i): a rate in (0, b_i] has demand.
            demand_is_cap = demand is cap
            total = 0.0
            for r, rate in proposed:
                if rate > 0.0 and rate <= cap[r] and (demand_is_cap or demand[r] > 0.0):
                    total += rate
                else:
                    break
            else:
                if not total > view.capacity * _OVER:
                    taken = Decision()  # (its attributes set here: no constructor to call)
                    taken.view = view
                    taken.served = proposed
                    taken.period = None if cls in WITHOUT_PERIOD else policy.period(view)
                    return taken
    pairs = proposed if isinstance(proposed, list) else _by_row(view, proposed)
    served, fixes, scaled, schedules, refused = _enforced(view, pairs, wanted)
    if bound and schedules:  # a scheduled job's mean rate came from its pattern: its limit
        assert rules is not None
        served, schedules = _limited(view, served, schedules, rules)
    decision = Enforced()
    decision.view = view
    decision.served = served
    decision.period = None if cls in WITHOUT_PERIOD else policy.period(view)
    decision.fixes = fixes
    decision.scaled = scaled
    decision.schedules = schedules
    decision.refused = refused
    return decision


_OVER = 1 + SUM_TOLERANCE


def _by_row(view: SystemView, proposed: Mapping[JobId, float]) -> RowRates:
    """``proposed`` as (row, rate) pairs, in its order; jobs outside the view left out."""
    row_of = view.row_of
    return [(row_of[j], rate) for j, rate in proposed.items() if j in row_of]


def _enforced_pairs(view: SystemView, proposed: Mapping[JobId, float] | RowRates) -> RowRates:
    """A proposal with its bounds enforced, as (row, rate) pairs (no schedules)."""
    pairs = proposed if isinstance(proposed, list) else _by_row(view, proposed)
    return _enforced(view, pairs, None)[0]


def _limited(
    view: SystemView, served: Served, schedules: Mapping[JobId, Schedule], rules: Bindings
) -> tuple[Served, Mapping[JobId, Schedule]]:
    """``served`` with the rules' limits clamped, and the schedules scaled with their rates."""
    ids = view.columns.job_id
    rates = {ids[r]: rate for r, rate in served}
    clamped = _rules.clamp(rates, rules)
    if clamped is rates:
        return served, schedules
    kept = {
        j: s if clamped[j] >= rates[j] else s.scaled(clamped[j] / rates[j])
        for j, s in schedules.items()
    }
    return [(r, clamped[ids[r]]) for r, _ in served], kept


def _enforced(
    view: SystemView, pairs: RowRates, wanted: Mapping[JobId, Schedule] | None
) -> tuple[Served, Fixes, bool, Mapping[JobId, Schedule], tuple[tuple[JobId, str], ...]]:
    """``decide`` where the proposal is not taken as it is (a rate to fix or to drop, a
    sum to scale down to B, or schedules): the rates served, the fixes, whether the sum
    was scaled, the schedules kept and those refused."""
    schedules: dict[int, Schedule] = {}
    refused: tuple[tuple[JobId, str], ...] = ()
    capped: Fixes = ()
    if wanted:
        pairs, schedules, refused, capped = _scheduled(view, pairs, wanted)
    columns = view.columns
    cap = columns.cap
    demand = columns.demand
    ids = columns.job_id
    served: Served = []
    fixes: list[tuple[JobId, float]] = []
    total = 0.0
    for r, rate in pairs:
        c = cap[r]
        if 0.0 < rate <= c and demand[r] > 0.0:
            served.append((r, rate))
            total += rate
        elif rate != 0.0:
            fixes.append((ids[r], rate))
            if rate > c and demand[r] > 0.0:
                served.append((r, c))
                total += c
    capacity = view.capacity
    scaled = total > capacity * _OVER
    if scaled:
        scale = capacity / total
        served = [(r, rate * scale) for r, rate in served]
    # A schedule's mean is its job's rate: scaled with it when Σ was scaled down to B, and
    # gone with it when the job got nothing.
    proposals = dict(pairs)
    kept = {}
    for r, rate in served:
        schedule = schedules.get(r)
        if schedule is not None:
            wished = proposals[r]
            kept[ids[r]] = schedule if rate >= wished else schedule.scaled(rate / wished)
    return served, (*fixes, *capped), scaled, kept, refused


def _scheduled(
    view: SystemView, pairs: RowRates, wanted: Mapping[JobId, Schedule]
) -> tuple[RowRates, dict[int, Schedule], tuple[tuple[JobId, str], ...], Fixes]:
    """The proposals with each well-formed schedule's mean rate for its job; the
    schedules kept (by row, capped at b_i), those refused, and those capped."""
    by_row = dict(pairs)
    row_of = view.row_of
    columns = view.columns
    schedules: dict[int, Schedule] = {}
    refused: list[tuple[JobId, str]] = []
    capped: list[tuple[JobId, float]] = []
    for job_id, schedule in wanted.items():
        row = row_of.get(job_id)
        if row is None or columns.demand[row] <= 0.0:
            continue  # like a rate: only for jobs with demand
        problem = schedule.problem()
        if problem is not None:
            refused.append((job_id, problem))
            continue
        cap = columns.cap[row]
        if schedule.peak_rate() > cap:
            capped.append((job_id, schedule.peak_rate()))
            schedule = schedule.capped(cap)
        schedules[row] = schedule
        by_row[row] = schedule.mean_rate()
    return list(by_row.items()), schedules, tuple(refused), tuple(capped)


def blend(
    policy: Policy,
    view: SystemView,
    targets: Mapping[JobId, float],
    rules: Bindings | None = None,
) -> dict[JobId, float]:
    """A replica's rates when it holds its part of the global split (``targets``).

    Only jobs with demand take part, in the stable order. Jobs of the split get
    their target (at most b_i); a scheduled job of a :class:`Share` its mean rate. Jobs
    that started an operation here since the split was computed get their local fair share,
    what ``policy`` gives them on the whole local view (enforced), until the next exchange
    covers them; the targets shrink in proportion to make room. Capacity still
    left (a job's local demand fell since the exchange) is water-filled over
    unmet local demand, so the replica stays work-conserving between exchanges;
    when ``targets`` is a :class:`Share`, a job of the split is topped up only to
    its ceiling, so its sum over the replicas stays within its global cap b_j. With
    ``rules``, the newer jobs' local shares apply them, and each rule's total here is
    clamped to its limit and its budget on this replica (policies/rules.py: ``clamp``).
    """
    active = view.active_jobs()  # the stable order: the same bits whatever the view's order
    rates = {j.job_id: min(targets[j.job_id], j.cap) for j in active if j.job_id in targets}
    newer = [j.job_id for j in active if j.job_id not in targets]
    if newer:
        # the local policy's rates on the whole view, enforced (its schedules aside)
        if rules is not None and rules.binds(view):
            served = _rules.allocate(policy, view, rules, _enforced_pairs)
        else:
            served = _enforced_pairs(view, policy.allocate(view))
        ids = view.columns.job_id
        local = {ids[r]: rate for r, rate in served}
        fresh = {j: local.get(j, 0.0) for j in newer}
        room = max(0.0, view.capacity - sum(fresh.values()))
        held = sum(rates.values())
        if held > room:
            rates = {j: r * (room / held) for j, r in rates.items()}
        rates.update(fresh)
    left = view.capacity - sum(rates.values())
    if isinstance(targets, Share) and targets.schedules:  # the windows' peak, not their means
        scheduled = targets.schedules
        others = {j: r for j, r in rates.items() if j not in scheduled}
        room = max(0.0, view.capacity - targets.reserved)
        total = sum(others.values())
        if total > room:  # newer jobs too: beside the windows' peak, never above B
            rates.update((j, r * (room / total)) for j, r in others.items())
            total = room
        left = room - total
    if left > 0.0 and type(policy).conserving:
        ceilings = targets.ceilings if isinstance(targets, Share) else None
        unmet = {}
        for job in active:
            job_id = job.job_id
            ceiling = math.inf  # a plain mapping, or a job not in the split yet: b_i here
            if ceilings is not None and job_id in targets:
                ceiling = ceilings.get(job_id, targets[job_id])
            want = min(job.demand, job.cap, ceiling) - rates.get(job_id, 0.0)
            if want > 0.0:
                unmet[job_id] = want
        if unmet:
            extra = water_fill(unmet, dict.fromkeys(unmet, 1.0), left)
            for j, r in extra.items():
                rates[j] = rates.get(j, 0.0) + r
    return _rules.clamp(rates, rules) if rules is not None else rates
