"""The array entry points' shortcuts for the simulator's case, against the view path.

The conformance suite (test_conformance.py) draws views where b_i = B is rare
for more than a few jobs; the array paths take shortcuts exactly there (every
demand at B: Set-10 gives each set's share to its FCFS-first job, LookAhead
serves each candidate alone). And Set-10 learns across decisions and keeps
what it learned by row: a single call cannot show that. Here: views where
every demand is B, and runs of many decisions where jobs post, leave, come
back and change rows, with the view path and the array path (and one policy
switching between the two) deciding side by side.
"""

from __future__ import annotations

import math
import random

import pytest

from burstctl.policies import JobView, SystemView, default_registry
from burstctl.policies.base import ArrayView, Policy
from burstctl.policies.decision import decide
from burstctl.policies.io_sets import Set10

REGISTRY = default_registry()
ARRAY_POLICIES = [n for n in REGISTRY.names() if REGISTRY.create(n).array_allocator() is not None]


class Rows:
    """m jobs' state as the simulator keeps it (lists by index), and its two views."""

    def __init__(self, rng: random.Random, m: int, capacity: float, full: bool) -> None:
        self.rng = rng
        self.capacity = capacity
        self.now = 1000.0
        nan = math.nan
        self.ids = [f"{i:02d}" for i in range(m)]
        # full: every b_i and demand is B (the synthetic windows); else some below
        self.cap = [capacity if full else capacity * rng.choice([1.0, 0.5, 0.1]) for _ in range(m)]
        self.demand = list(self.cap)
        self.progress = [nan] * m
        self.released_at = [0.0] * m  # one release time, as in synthetic windows
        self.remaining = [nan] * m
        self.volume = [nan] * m
        self.posted_at = [nan] * m
        self.last_work = [nan] * m
        self.active: list[int] = []
        self.renamed = 0
        self.posts: list[list[float]] = [[] for _ in range(m)]  # each row's posts so far

    def post(self, i: int) -> None:
        """Row i begins an operation now (a new post)."""
        rng = self.rng
        self.volume[i] = rng.choice([self.cap[i], self.cap[i] * rng.uniform(1.0, 50.0)])
        self.remaining[i] = self.volume[i] * rng.choice([1.0, rng.uniform(0.0, 1.0)])
        self.posted_at[i] = self.now
        self.posts[i].append(self.now)
        self.last_work[i] = rng.choice([0.0, 0.5, rng.uniform(1.0, 1e4)])
        self.progress[i] = rng.choice([0.0, self.now * 0.5, self.now * rng.uniform(0.0, 1.0)])
        if i not in self.active:
            self.active.append(i)
            self.active.sort()

    def step(self) -> None:
        """Time moves on: a job leaves, a job posts (possibly the one that left: a new
        operation at the same row), sometimes a row gets another job or shows an
        older post again."""
        rng = self.rng
        self.now += rng.choice([0.0, 1.0, rng.uniform(0.0, 100.0)])
        if self.active and rng.random() < 0.5:
            self.active.remove(rng.choice(self.active))
        if rng.random() < 0.7:
            self.post(rng.randrange(len(self.ids)))
        if rng.random() < 0.05:  # a row shows an older post again (never in a run)
            i = rng.randrange(len(self.ids))
            if self.posts[i]:
                self.posted_at[i] = rng.choice(self.posts[i])
                if i not in self.active:
                    self.active.append(i)
                    self.active.sort()
        if rng.random() < 0.05:  # another job at a row (its id still sorts by index)
            i = rng.randrange(len(self.ids))
            self.renamed += 1
            self.ids[i] = f"{i:02d}-{self.renamed}"
            self.post(i)

    def view(self) -> SystemView:
        jobs = {}
        for i in self.active:
            jobs[self.ids[i]] = JobView(
                self.ids[i], "u", "g", 1, 1.0, self.cap[i], self.demand[i],
                posted_at=self.posted_at[i], volume=self.volume[i],
                remaining=self.remaining[i], moved=self.volume[i] - self.remaining[i],
                released_at=self.released_at[i], progress=self.progress[i],
                last_work=self.last_work[i], index=i,
            )  # fmt: skip
        return SystemView(
            now=self.now, capacity=self.capacity, node_bandwidth=self.capacity, jobs=jobs,
            horizon=self.now + 1e6,
        )  # fmt: skip

    def arrays(self, copies: bool) -> ArrayView:
        """The rows; ``copies``: fresh lists (a caller that does not keep its lists)."""
        c = list if copies else (lambda x: x)
        return ArrayView(
            self.now, self.capacity, self.now + 1e6, c(self.active), c(self.progress),
            c(self.released_at), c(self.demand), c(self.cap), c(self.remaining),
            c(self.posted_at), c(self.volume), c(self.last_work), c(self.ids),
        )  # fmt: skip


def rates_of(view: SystemView, policy: Policy) -> list[tuple[int, float]]:
    decision = decide(policy, view)
    return [(view.jobs[j].index, r) for j, r in decision.rates.items()]


@pytest.mark.parametrize("name", ARRAY_POLICIES)
@pytest.mark.parametrize("seed", range(150))
def test_array_path_with_every_demand_at_b(name: str, seed: int) -> None:
    rng = random.Random(seed)
    state = Rows(rng, rng.randint(2, 40), rng.choice([1.0, 4.0, 0.3]), full=True)
    for i in sorted(rng.sample(range(len(state.ids)), rng.randint(1, len(state.ids)))):
        state.post(i)
    view_policy, array_policy = REGISTRY.create(name), REGISTRY.create(name)
    arrays = array_policy.array_allocator()
    assert arrays is not None
    expected = rates_of(state.view(), view_policy)
    assert expected  # someone is served: the comparison says something
    assert arrays(state.arrays(copies=False)) == expected


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_set10_learns_on_arrays_as_on_views_over_many_decisions(full: bool, seed: int) -> None:
    rng = random.Random(seed)
    state = Rows(rng, rng.randint(2, 20), rng.choice([1.0, 4.0]), full=full)
    by_view, by_arrays, mixed = Set10(), Set10(), Set10()
    mixed_arrays = mixed.array_allocator()
    arrays = by_arrays.array_allocator()
    assert arrays is not None and mixed_arrays is not None
    served = 0
    for _ in range(150):
        state.step()
        view = state.view()
        expected = rates_of(view, by_view)
        served += len(expected)
        assert arrays(state.arrays(copies=rng.random() < 0.2)) == expected
        # one policy object deciding on both paths, as it may: each path sees what the
        # other learned
        if rng.random() < 0.3:
            assert rates_of(view, mixed) == expected
        else:
            assert mixed_arrays(state.arrays(copies=False)) == expected
    assert served > 0
    for job_id in set(state.ids):
        assert by_arrays.omega(job_id) == by_view.omega(job_id)
        assert mixed.omega(job_id) == by_view.omega(job_id)
