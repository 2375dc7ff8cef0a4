"""``GreedyYield.allocate_columns``, the simulator's fast path: ``allocate``, bit for bit."""

from __future__ import annotations

import math
import random

import pytest

from burstctl.policies import JobView, SystemView
from burstctl.policies.greedy import GreedyYield


def columns_case(seed: int) -> tuple[SystemView, list[int], list[float], list[float], list[float]]:
    """A view whose jobs are all active and in index order, and the same view in columns
    (NaN in the rows that are not jobs of the view, so reading one shows)."""
    rng = random.Random(seed)
    now = rng.choice([0.0, 1.0, 1000.0, 1.8e6])
    capacity = rng.choice([1.0, 4.0, 0.3, 1e9])
    size = rng.randint(0, 40)
    active = sorted(rng.sample(range(size), rng.randint(0, size)))
    progress, released_at, demand = ([math.nan] * size for _ in range(3))
    jobs = {}
    for i in active:
        cap = capacity * rng.choice([1.0, 1.0, 0.5, rng.uniform(0.01, 1.0)])
        demand[i] = rng.choice([cap, cap * rng.uniform(0.01, 1.0)])
        # fresh (τ ≥ t) and equal yields (P = 0, or P proportional to the age) for ties
        released_at[i] = rng.choice([now, now + 1.0, now * rng.uniform(0.0, 1.0), 0.0])
        age = now - released_at[i]
        progress[i] = rng.choice([0.0, age * 0.5, age * rng.uniform(0.0, 1.0)]) if age > 0 else 0.0
        job_id = f"{i:02d}"
        jobs[job_id] = JobView(
            job_id, "u", "g", 1, 1.0, cap, demand[i],
            released_at=released_at[i], progress=progress[i], index=i,
        )  # fmt: skip
    view = SystemView(now=now, capacity=capacity, node_bandwidth=capacity, jobs=jobs)
    return view, active, progress, released_at, demand


@pytest.mark.parametrize("seed", range(500))
def test_allocate_columns_is_allocate(seed: int) -> None:
    view, active, progress, released_at, demand = columns_case(seed)
    policy = GreedyYield()
    rates = policy.allocate(view)
    expected = [(view.jobs[j].index, rate) for j, rate in rates.items() if rate > 0.0]
    got = policy.allocate_columns(view.now, view.capacity, active, progress, released_at, demand)
    assert got == expected  # same jobs, same order, same floats


def test_ties_in_yield_go_by_index() -> None:
    # equal yields 0.5 and a fresh job (τ = t): the fresh one first, then by index
    progress, released_at, demand = [1.0, 1.0, 0.0, 2.0], [0.0, 0.0, 2.0, -2.0], [0.6] * 4
    got = GreedyYield().allocate_columns(2.0, 1.0, [0, 1, 2, 3], progress, released_at, demand)
    assert got == [(2, 0.6), (0, 0.4)]
