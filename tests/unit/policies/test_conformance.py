"""Invariants every registered policy must hold (fsspec-style abstract suite).

rates ≥ 0; Σ rates ≤ B; idle jobs get 0; no job above its cap b_i; work-conserving
when demand exceeds B; deterministic for a fixed view and seed. Random views are
drawn from seeded generators so a failure names its seed.
"""

from __future__ import annotations

import math
import random

import pytest

from burstctl.policies import JobView, SystemView, default_registry, job_cap

REGISTRY = default_registry()
# Registered names, plus ThemisIO sharing specs that resolve without being listed
# (orders and leaves the named statistical-token policies do not cover).
SPECS = ["user>group>size", "group>user>priority", "user>priority", "group>user>job"]
POLICIES = REGISTRY.names() + SPECS
MiB = float(1 << 20)


def random_view(seed: int, n_jobs: int | None = None) -> SystemView:
    rng = random.Random(seed)
    capacity = rng.choice([10, 40, 400, 4096]) * MiB
    b = rng.choice([1, 8, 64, 1024]) * MiB
    now = 1000.0
    jobs = {}
    for i in range(n_jobs if n_jobs is not None else rng.randint(0, 12)):
        nodes = rng.choice([1, 1, 2, 4, 16, 128])
        cap = job_cap(nodes, b, capacity)
        state = rng.random()
        demand = 0.0 if state < 0.2 else cap if state < 0.7 else rng.uniform(0.01, 1.0) * cap
        volume = float(rng.choice([0, rng.randint(1, 1 << 34)]))
        released = rng.uniform(0, now - 1)
        jobs[f"j{i}"] = JobView(
            job_id=f"j{i}",
            user=f"u{rng.randint(0, 3)}",
            group=f"g{rng.randint(0, 1)}",
            nodes=nodes,
            priority=rng.choice([1.0, 2.0, 0.5]),
            cap=cap,
            demand=demand,
            posted_at=rng.uniform(released, now) if demand else None,
            volume=volume,
            remaining=rng.uniform(0, volume) if volume else None,
            released_at=released,
            progress=rng.uniform(0, now - released),
            last_work=rng.uniform(0, 100),
            mean_volume=rng.choice([0.0, rng.uniform(1, 1 << 34)]),
            moved=rng.uniform(0, 1 << 30),
            index=i,
        )
    return SystemView(now=now, capacity=capacity, node_bandwidth=b, jobs=jobs, seed=seed)


@pytest.fixture(params=POLICIES)
def policy_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("seed", range(200))
def test_invariants(policy_name: str, seed: int) -> None:
    view = random_view(seed)
    policy = REGISTRY.create(policy_name)
    rates = dict(policy.allocate(view))
    tol = 1e-9 * view.capacity
    assert set(rates) <= set(view.jobs), "rates for unknown jobs"
    for job in view.jobs.values():
        rate = rates.get(job.job_id, 0.0)
        assert math.isfinite(rate) and rate >= 0.0, (job.job_id, rate)
        assert rate <= job.cap + tol, f"{job.job_id} above b_i"
        if not job.active:
            assert rate == 0.0, f"idle {job.job_id} got {rate}"
    total = sum(rates.values())
    assert total <= view.capacity + tol
    demand = sum(j.demand for j in view.jobs.values())
    # work-conserving: Σ rates = min(B, Σ demand)
    assert total == pytest.approx(min(view.capacity, demand), rel=1e-9, abs=tol)
    # opportunity fairness: nobody above what it can use
    for job in view.jobs.values():
        assert rates.get(job.job_id, 0.0) <= job.demand + tol
    # deterministic: a fresh instance and the same instance agree
    assert dict(REGISTRY.create(policy_name).allocate(view)) == rates
    assert dict(policy.allocate(view)) == rates


def test_empty_view(policy_name: str) -> None:
    view = SystemView(now=0.0, capacity=MiB, node_bandwidth=MiB)
    assert sum(REGISTRY.create(policy_name).allocate(view).values()) == 0.0


def test_registry_knows_the_core_policies() -> None:
    assert {"fcfs", "fair-share"} <= set(POLICIES)
