"""The opportunity-fairness step common to every policy.

A policy says *who comes first* (an order) or *how much each deserves* (weights);
the functions here turn that into rates that never exceed what a job can use
(its demand ceiling, itself ≤ b_i) and hand every leftover byte/s to jobs that
want more. The result is work-conserving: Σ rates = min(B, Σ demand).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from burstctl.policies.view import JobId, JobView


def greedy_fill(order: Iterable[JobView], capacity: float) -> dict[JobId, float]:
    """GREEDY_FILL of the paper ([BWS] §4.1): each job in turn takes min(demand, left).

    Only the last job served can get a partial share; jobs after the budget
    runs out get 0. Demand (≤ b_i) stands for b_i so that a job never receives
    more than it can use and the rest flows to the next in order.
    """
    left = capacity
    rates: dict[JobId, float] = {}
    for job in order:
        if left > 0.0:
            demand = job.demand
            give = left if left < demand else demand  # min(demand, left) without the call
            left -= give
        else:
            give = 0.0
        rates[job.job_id] = give
    return rates


def greedy_fill_rows(
    order: Iterable[int], demand: Sequence[float], capacity: float
) -> list[tuple[int, float]]:
    """:func:`greedy_fill` over rows (``demand`` by row), positive rates only: the rows
    after the budget runs out get 0. Its rates pass ``decision.enforce`` unchanged when
    every demand is positive and at most b_i (each rate is at most its demand, and
    their sum at most ``capacity``)."""
    left = capacity
    rates = []
    for i in order:
        if not left > 0.0:
            break
        d = demand[i]
        give = left if left < d else d
        left -= give
        rates.append((i, give))
    return rates


def greedy_fill_ranked(
    ranked: list[tuple[float, int]], demand: Sequence[float], capacity: float
) -> list[tuple[int, float]]:
    """:func:`greedy_fill_rows` in the order of (key, row) pairs, ties by row; sorts
    ``ranked``. When the first row takes all of ``capacity`` (the simulator's usual
    case, b_i = B) it is found with one ``min`` instead of a sort, with the same rate."""
    if ranked and capacity > 0.0:
        first = min(ranked)[1]
        d = demand[first]
        if not capacity > d:  # it takes all: nobody else gets anything
            return [(first, capacity if capacity < d else d)]
    ranked.sort()
    return greedy_fill_rows([i for _, i in ranked], demand, capacity)


def water_fill(
    ceilings: Mapping[JobId, float], weights: Mapping[JobId, float], capacity: float
) -> dict[JobId, float]:
    """Weighted max-min fair split of ``capacity`` under per-job ceilings.

    Every job gets ``level · weight`` for one common level, except jobs whose
    ceiling is below that, which get their ceiling; the level is the largest
    with Σ rates ≤ capacity. Jobs with weight 0 or ceiling 0 get 0. When
    Σ ceilings ≤ capacity every job gets its ceiling.
    """
    rates = dict.fromkeys(ceilings, 0.0)
    # (ceiling/weight, id, ceiling, weight) for jobs that can take something
    live = []
    total_ceiling = 0.0
    weight_left = 0.0
    lowest = math.inf  # the smallest ceiling/weight
    for j, c in ceilings.items():
        w = weights.get(j, 0.0)
        if c > 0.0 and w > 0.0:
            ratio = c / w
            live.append((ratio, j, c, w))
            total_ceiling += c
            weight_left += w
            if ratio < lowest:
                lowest = ratio
    if total_ceiling <= capacity:
        for _, j, c, _ in live:
            rates[j] = c
        return rates
    left = capacity
    level = left / weight_left
    if lowest > level:  # nobody stops below the common level: no sort needed
        for _, j, _, w in live:
            rates[j] = level * w
        return rates
    live.sort()
    _saturate(live, left, weight_left, rates)
    return rates


def _saturate(
    ordered: Sequence[tuple[float, Any, float, float]],
    left: float,
    weight_left: float,
    rates: dict[Any, float],
) -> None:
    """The water fill's last step, shared by `water_fill` and `water_fill_rows`: in order of
    ceiling/weight (``ordered``: (ratio, key, ceiling, weight)), the jobs that stop below the
    common level get their ceiling, the rest ``level · weight``; written into ``rates``."""
    for k, (ratio, key, c, w) in enumerate(ordered):
        level = left / weight_left
        if ratio <= level:
            rates[key] = c
            left -= c
            weight_left -= w
            continue
        for _, other, _, w_other in ordered[k:]:
            rates[other] = level * w_other
        break


def water_fill_rows(
    active: Sequence[int],
    ceilings: Sequence[float],
    weights: Sequence[float],
    capacity: float,
) -> list[tuple[int, float]]:
    """:func:`water_fill` over arrays: ``(i, rate)`` for the rows of ``active`` that can
    take something, in the order of ``active``, with the same floats as ``water_fill``
    gives jobs whose ids sort like their rows (ties in ceiling/weight go by row).
    Rows that get 0 are left out."""
    live = []
    total_ceiling = 0.0
    weight_left = 0.0
    lowest = math.inf
    for i in active:  # the same sums, in the same order, as water_fill
        c = ceilings[i]
        w = weights[i]
        if c > 0.0 and w > 0.0:
            ratio = c / w
            live.append((ratio, i, c, w))
            total_ceiling += c
            weight_left += w
            if ratio < lowest:
                lowest = ratio
    if total_ceiling <= capacity:
        return [(i, c) for _, i, c, _ in live]
    left = capacity
    level = left / weight_left
    if lowest > level:
        return [(i, level * w) for _, i, _, w in live]
    rates: dict[int, float] = {}
    _saturate(sorted(live), left, weight_left, rates)  # sorted: ``live`` keeps row order
    return [(i, rates[i]) for _, i, _, _ in live]
