"""The opportunity-fairness step common to every policy.

A policy says *who comes first* (an order) or *how much each deserves* (weights);
the functions here turn that into rates that never exceed what a job can use
(its demand ceiling, itself ≤ b_i) and hand every leftover byte/s to jobs that
want more. The result is work-conserving: Σ rates = min(B, Σ demand).

Each works over keys: the rows of a view (with its columns as the values, read
by row), or any hashable keys with mappings (job ids, session ids). Also here, for
the greedy orders: ``least_quotient``, the least key when every key is a quotient by
one divisor.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

K = TypeVar("K")


class Values(Protocol[K]):  # type: ignore[misc]
    """A value per key: a view's column read by row, or a mapping."""

    def __getitem__(self, key: K, /) -> float: ...


def greedy_fill(order: Iterable[K], demand: Values[K], capacity: float) -> list[tuple[K, float]]:
    """GREEDY_FILL of the paper ([BWS] §4.1): each key in ``order`` takes
    min(demand, left) of ``capacity``; ``(key, rate)`` until the budget runs out.

    Only the last one served can get a partial share; the keys after it get 0 and
    are not listed. Demand (≤ b_i) stands for b_i so that a job never receives more
    than it can use and the rest flows to the next in order.
    """
    left = capacity
    rates = []
    for k in order:
        if not left > 0.0:
            break
        d = demand[k]
        give = left if left < d else d  # min(demand, left) without the call
        left -= give
        rates.append((k, give))
    return rates


def greedy_fill_by(
    ranked: list[tuple[Any, K]], demand: Values[K], capacity: float
) -> list[tuple[K, float]]:
    """:func:`greedy_fill` in the order of ``(sort key, key)`` pairs (ties by key);
    sorts ``ranked``. When the first takes all of ``capacity`` (the simulator's usual
    case, b_i = B) it is found with one ``min`` instead of a sort, with the same rate."""
    if ranked and capacity > 0.0:
        first = min(ranked)[1]
        d = demand[first]
        if not capacity > d:  # it takes all: nobody else gets anything
            return [(first, capacity if capacity < d else d)]
    ranked.sort()
    return greedy_fill([k for _, k in ranked], demand, capacity)


def water_fill(
    ceilings: Mapping[K, float], weights: Mapping[K, float], capacity: float
) -> dict[K, float]:
    """Weighted max-min fair split of ``capacity`` under per-key ceilings, for every key
    of ``ceilings`` (:func:`water_levels`; a key without a weight has weight 0)."""
    if not weights.keys() >= ceilings.keys():
        weights = {k: weights.get(k, 0.0) for k in ceilings}
    rates = dict.fromkeys(ceilings, 0.0)
    rates.update(water_levels(ceilings, ceilings, weights, capacity))
    return rates


def water_levels(
    keys: Collection[K], ceilings: Values[K], weights: Values[K], capacity: float
) -> list[tuple[K, float]]:
    """Weighted max-min fair split of ``capacity`` under per-key ceilings.

    Every key gets ``level · weight`` for one common level, except keys whose
    ceiling is below that, which get their ceiling; the level is the largest
    with Σ rates ≤ capacity. When Σ ceilings ≤ capacity every key gets its
    ceiling. Returns ``(key, rate)`` for the keys with ceiling and weight > 0 (the
    others get 0), in the order of ``keys``; the sums run in that order, and ties
    in ceiling/weight are broken by key.
    """
    total_ceiling = 0.0
    weight_left = 0.0
    lowest = math.inf  # the smallest ceiling/weight
    every = True  # every key can take something (the usual case: no list of them)
    for k in keys:
        c = ceilings[k]
        w = weights[k]
        if c > 0.0 and w > 0.0:
            ratio = c / w
            total_ceiling += c
            weight_left += w
            if ratio < lowest:
                lowest = ratio
        else:
            every = False
    live = keys if every else [k for k in keys if ceilings[k] > 0.0 and weights[k] > 0.0]
    if total_ceiling <= capacity:
        return [(k, ceilings[k]) for k in live]
    left = capacity
    level = left / weight_left
    if lowest > level:  # nobody stops below the common level: no sort needed
        return [(k, level * weights[k]) for k in live]
    ordered = sorted([(ceilings[k] / weights[k], k, ceilings[k], weights[k]) for k in live])
    rates: dict[K, float] = {}
    for n, (ratio, k, c, w) in enumerate(ordered):
        level = left / weight_left
        if ratio <= level:
            rates[k] = c
            left -= c
            weight_left -= w
            continue
        for _, other, _, w_other in ordered[n:]:
            rates[other] = level * w_other
        break
    return [(k, rates[k]) for k in live]


def least_quotient(
    rows: Sequence[int], numerator: Sequence[float | None], divisor_of: Sequence[float]
) -> tuple[int, float, float] | None:
    """For rows (not empty) whose quotients numerator/divisor share one divisor
    (``divisor_of`` equal): the row of the least numerator (the first in row order), that
    numerator, and the least numerator of the rows before it (inf: none); None if the
    rows do not share it or a numerator is unknown (None).

    A correctly rounded division by one positive number is monotone, so the least quotient
    is that row's, unless a row before it rounds to the same quotient: the quotient of the
    least numerator before it, the least quotient before it, tells. (Found without a
    division per row: this is the greedy policies' hot loop in the simulator.)"""
    first = rows[0]
    shared = divisor_of[first]
    least = numerator[first]
    if least is None:
        return None
    before = math.inf
    for r in rows:
        if divisor_of[r] != shared:
            return None
        x = numerator[r]
        if x is None:
            return None
        if x < least:
            first, least, before = r, x, least
    return first, least, before
