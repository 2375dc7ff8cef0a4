"""The decision: a policy proposes, this module enforces (the engine's half).

``decide`` is the one path from a view to rates, taken by the controller's
scheduler, by its replicas for the global targets and by the simulator.
Whatever a policy returns, the rates that leave here are finite, ≥ 0, at most
b_i, 0 for a job without demand, and sum to at most B (within rounding). A
replica that holds its part of a global split (``targets``) blends it with the
local policy's decision for jobs the split does not cover yet (:func:`blend`).

Pure: no clock, no I/O; the same view and targets give the same decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from burstctl.policies.base import Policy
from burstctl.policies.schedule import Schedule
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId, SystemView

# Σ rates may exceed B by this fraction (rounding in a policy's sums) before scaling
SUM_TOLERANCE = 1e-9


class Decision(NamedTuple):
    """Enforced rates, and what enforcing them took."""

    rates: dict[JobId, float]  # the positive rates; a job of the view not listed gets 0
    period: float | None  # the policy's wish to decide again (None: at events only)
    # (job, proposed rate) for every job whose proposal broke a bound and was fixed
    fixes: tuple[tuple[JobId, float], ...] = ()
    scaled: bool = False  # the proposals summed to more than B and were scaled down
    # periodic patterns of windows for some jobs of ``rates`` (their rate is the mean rate)
    schedules: Mapping[JobId, Schedule] = MappingProxyType({})
    # (job, reason) for every schedule the policy proposed malformed: the job got none
    refused: tuple[tuple[JobId, str], ...] = ()

    @property
    def clamped(self) -> bool:
        return bool(self.fixes) or self.scaled or bool(self.refused)


class Share(Mapping[JobId, float]):
    """A replica's part of a global split: its rate for each job of the split (the
    mapping) and ``ceilings``, the most it may give each of those jobs until the next
    exchange when capacity frees up (its rate plus its part of the job's global
    headroom; ``controller/merge.py: ceilings``). Every replica's ceilings of one job
    sum to at most the job's global cap b_j, so topping up within them keeps the cap
    across replicas. A job without a ceiling is held to its rate.
    """

    __slots__ = ("_rates", "ceilings")

    def __init__(self, rates: Mapping[JobId, float], ceilings: Mapping[JobId, float]) -> None:
        self._rates = dict(rates)
        self.ceilings = dict(ceilings)

    def __getitem__(self, job_id: JobId) -> float:
        return self._rates[job_id]

    def __iter__(self) -> Iterator[JobId]:
        return iter(self._rates)

    def __len__(self) -> int:
        return len(self._rates)

    def __repr__(self) -> str:
        return f"Share({self._rates!r}, ceilings={self.ceilings!r})"


def decide(
    policy: Policy, view: SystemView, targets: Mapping[JobId, float] | None = None
) -> Decision:
    """The policy's proposal for ``view`` (blended with ``targets`` when given), enforced."""
    proposed = policy.allocate(view) if targets is None else blend(policy, view, targets)
    # Schedules only on a replica's own decision: a global split is of rates.
    wanted = policy.schedules(view) if targets is None else None
    if not wanted:
        rates, fixes, scaled = enforce(view, proposed)
        return Decision(rates, policy.period(view), fixes, scaled)
    proposed = dict(proposed)
    schedules: dict[JobId, Schedule] = {}
    refused: list[tuple[JobId, str]] = []
    capped: list[tuple[JobId, float]] = []
    for job_id, schedule in wanted.items():
        job = view.jobs.get(job_id)
        if job is None or job.demand <= 0.0:
            continue  # like a rate: only for jobs with demand
        problem = schedule.problem()
        if problem is not None:
            refused.append((job_id, problem))
            continue
        if schedule.peak_rate() > job.cap:
            capped.append((job_id, schedule.peak_rate()))
            schedule = schedule.capped(job.cap)
        schedules[job_id] = schedule
        proposed[job_id] = schedule.mean_rate()
    rates, fixes, scaled = enforce(view, proposed)
    # A schedule's mean is its job's rate: scaled with it when Σ was scaled down to B, and
    # gone with it when the job got nothing.
    schedules = {
        j: s if rates[j] >= proposed[j] else s.scaled(rates[j] / proposed[j])
        for j, s in schedules.items()
        if j in rates
    }
    fixes = (*fixes, *capped)
    return Decision(rates, policy.period(view), fixes, scaled, schedules, tuple(refused))


def enforce(
    view: SystemView, proposed: Mapping[JobId, float]
) -> tuple[dict[JobId, float], tuple[tuple[JobId, float], ...], bool]:
    """What every policy promises, made true: finite, ≥ 0, ≤ b_i, only jobs with
    demand, Σ ≤ B.

    Returns the positive rates, in the order of ``proposed`` (a job of the view
    that is not listed gets 0), the proposals that broke a bound with the job
    they were for, and whether the sum was scaled down to B. Proposals for jobs
    outside the view are ignored.
    """
    jobs = view.jobs
    rates: dict[JobId, float] = {}
    fixes: list[tuple[JobId, float]] = []
    total = 0.0
    for job_id, rate in proposed.items():
        job = jobs.get(job_id)
        if job is None:
            continue
        # `0 < rate <= cap` is False for NaN too; the common cases cost two comparisons.
        if 0.0 < rate <= job.cap and job.demand > 0.0:
            rates[job_id] = rate
            total += rate
        elif rate != 0.0:
            fixes.append((job_id, rate))
            if rate > job.cap and job.demand > 0.0:
                rates[job_id] = job.cap
                total += job.cap
    scaled = total > view.capacity * (1 + SUM_TOLERANCE)
    if scaled:
        scale = view.capacity / total
        rates = {j: r * scale for j, r in rates.items()}
    return rates, tuple(fixes) if fixes else (), scaled


def enforce_rows(
    rows: Sequence[tuple[int, float]],
    demand: Sequence[float],
    cap: Sequence[float],
    capacity: float,
) -> list[tuple[int, float]]:
    """:func:`enforce`'s rates over arrays (an array entry point's ``(i, rate)``
    proposals, demand and b_i by row): the same floats in the same order, positive
    only. What was fixed is not reported."""
    rates: list[tuple[int, float]] = []
    total = 0.0
    for i, rate in rows:
        c = cap[i]
        if 0.0 < rate <= c and demand[i] > 0.0:
            rates.append((i, rate))
            total += rate
        elif rate != 0.0 and rate > c and demand[i] > 0.0:
            rates.append((i, c))
            total += c
    if total > capacity * (1 + SUM_TOLERANCE):
        scale = capacity / total
        return [(i, r * scale) for i, r in rates]
    return rates


def blend(policy: Policy, view: SystemView, targets: Mapping[JobId, float]) -> dict[JobId, float]:
    """A replica's rates when it holds its part of the global split (``targets``).

    Only jobs with demand take part, in the stable order. Jobs of the split get
    their target (at most b_i). Jobs that started an
    operation here since the split was computed get their local fair share,
    what ``policy`` gives them on the whole local view (enforced), until the next exchange
    covers them; the targets shrink in proportion to make room. Capacity still
    left (a job's local demand fell since the exchange) is water-filled over
    unmet local demand, so the replica stays work-conserving between exchanges;
    when ``targets`` is a :class:`Share`, a job of the split is topped up only to
    its ceiling, so its sum over the replicas stays within its global cap b_j.
    """
    active = view.active_jobs()  # the stable order: the same bits whatever the view's order
    rates = {j.job_id: min(targets[j.job_id], j.cap) for j in active if j.job_id in targets}
    newer = [j.job_id for j in active if j.job_id not in targets]
    if newer:
        local, _, _ = enforce(view, policy.allocate(view))
        fresh = {j: local.get(j, 0.0) for j in newer}
        room = max(0.0, view.capacity - sum(fresh.values()))
        held = sum(rates.values())
        if held > room:
            rates = {j: r * (room / held) for j, r in rates.items()}
        rates.update(fresh)
    left = view.capacity - sum(rates.values())
    if left > 0.0:
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
    return rates
