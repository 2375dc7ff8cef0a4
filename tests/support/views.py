"""Builders of what policies read, for tests: one ``job`` (a ``JobView``), one ``view`` (a
``SystemView`` of jobs); what they decide, ``allocation`` (the decision's rate of every job
of S(t)) and ``rates_of`` (a raw proposal by job id); and ``Table``: jobs kept as the
simulator keeps them, lists by row, with both views of them."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from burstctl.policies.base import Policy
from burstctl.policies.decision import decide
from burstctl.policies.view import Columns, JobId, JobView, RowRates, SystemView


def job(
    job_id: str,
    cap: float = 1.0,
    demand: float | None = None,
    *,
    nodes: int = 1,
    posted_at: float | None = 0.0,
    index: int = 0,
    user: str = "u",
    group: str = "g",
    priority: float = 1.0,
    **fields: Any,
) -> JobView:
    """A job in I/O since t = 0 (``posted_at``) wanting its whole cap b_i (``demand``);
    any other ``JobView`` field by keyword."""
    return JobView(
        job_id=job_id,
        user=user,
        group=group,
        nodes=nodes,
        priority=priority,
        cap=cap,
        demand=cap if demand is None else demand,
        posted_at=posted_at,
        index=index,
        **fields,
    )


def view(
    *jobs: JobView,
    capacity: float = 1.0,
    node_bandwidth: float | None = None,
    now: float = 0.0,
    **fields: Any,
) -> SystemView:
    """The view of ``jobs`` at ``now`` with bandwidth B = ``capacity`` (b = B unless
    given); any other ``SystemView`` field by keyword."""
    return SystemView(
        now=now,
        capacity=capacity,
        node_bandwidth=capacity if node_bandwidth is None else node_bandwidth,
        jobs={j.job_id: j for j in jobs},
        **fields,
    )


def allocation(policy: Policy, view: SystemView) -> dict[JobId, float]:
    """``decide(policy, view)``'s rate of every job of S(t), in the stable order (0: the
    job is not served)."""
    rates = decide(policy, view).rates
    return {job.job_id: rates.get(job.job_id, 0.0) for job in view.active_jobs()}


def rates_of(view: SystemView, proposed: Mapping[JobId, float] | RowRates) -> dict[JobId, float]:
    """A policy's proposal for ``view`` by job id (zeros included), whether it answered by
    job id or by row."""
    if isinstance(proposed, list):
        ids = view.columns.job_id
        return {ids[r]: rate for r, rate in proposed}
    return dict(proposed)


class Table:
    """m jobs' state as the simulator keeps it (lists by row; row i has index i and a job
    id that sorts like i), and its two views: over the lists (``columns_view``, as the
    simulator decides) and built from ``JobView`` rows in any order (``rows_view``, as the
    controller does). ``step`` moves time on as a run does: jobs post, leave, come back,
    and a row now and then gets another job."""

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
        self.moved = [nan] * m
        self.posted_at = [nan] * m
        self.last_work = [nan] * m
        self.active: list[int] = []
        self.renamed = 0
        self.posts: list[list[float]] = [[] for _ in range(m)]  # each row's posts so far
        self.columns = Columns(
            job_id=self.ids, user=["u"] * m, group=["g"] * m, nodes=[1] * m,
            priority=[1.0] * m, cap=self.cap, demand=self.demand, posted_at=self.posted_at,
            volume=self.volume, remaining=self.remaining, moved=self.moved,
            released_at=self.released_at, progress=self.progress, last_work=self.last_work,
            mean_volume=[0.0] * m, index=range(m),
        )  # fmt: skip

    def post(self, i: int) -> None:
        """Row i begins an operation now (a new post)."""
        rng = self.rng
        self.volume[i] = rng.choice([self.cap[i], self.cap[i] * rng.uniform(1.0, 50.0)])
        self.remaining[i] = self.volume[i] * rng.choice([1.0, rng.uniform(0.0, 1.0)])
        self.moved[i] = self.volume[i] - self.remaining[i]
        self.posted_at[i] = self.now
        self.posts[i].append(self.now)
        self.last_work[i] = rng.choice([0.0, 0.5, rng.uniform(1.0, 1e4)])
        self.progress[i] = rng.choice([0.0, self.now * 0.5, self.now * rng.uniform(0.0, 1.0)])
        if i not in self.active:
            self.active.append(i)
            self.active.sort()

    def step(self) -> None:
        """Time moves on: a job leaves, a job posts (possibly the one that left: a new
        operation at the same row), sometimes a row gets another job or shows an older
        post again."""
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

    def columns_view(self) -> SystemView:
        active = list(self.active)
        return SystemView.of_columns(
            self.now, self.capacity, self.capacity, self.columns, active, active,
            horizon=self.now + 1e6,
        )  # fmt: skip

    def rows_view(self, shuffle: random.Random | None = None) -> SystemView:
        """The jobs of S(t) as ``JobView`` rows; ``shuffle``: listed in a random order."""
        rows = [self.columns.job(i) for i in self.active]
        if shuffle is not None:
            shuffle.shuffle(rows)
        return SystemView(
            now=self.now, capacity=self.capacity, node_bandwidth=self.capacity,
            jobs={j.job_id: j for j in rows}, horizon=self.now + 1e6,
        )  # fmt: skip
