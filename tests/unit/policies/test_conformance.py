"""Invariants every registered policy must hold (fsspec-style abstract suite).

rates ≥ 0; Σ rates ≤ B; idle jobs get 0; no job above its cap b_i; work-conserving
when demand exceeds B; deterministic for a fixed view and seed; the decision path
(``policies.decision.decide``) never needs to fix what a policy proposes; and where a
policy declares an array entry point, it gives the view path's rates. Random views
are drawn from seeded generators so a failure names its seed.
"""

from __future__ import annotations

import math
import random

import pytest

from burstctl.policies import JobView, SystemView, default_registry, job_cap
from burstctl.policies.base import ArrayView
from burstctl.policies.decision import decide
from burstctl.policies.greedy import GreedyYield

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
    # the engine's enforcement has nothing to fix and keeps the positive rates as they are
    decision = decide(REGISTRY.create(policy_name), view)
    assert not decision.clamped
    assert decision.rates == {j: r for j, r in rates.items() if r > 0.0}


def test_empty_view(policy_name: str) -> None:
    view = SystemView(now=0.0, capacity=MiB, node_bandwidth=MiB)
    assert sum(REGISTRY.create(policy_name).allocate(view).values()) == 0.0


def test_registry_knows_the_core_policies() -> None:
    assert {"fcfs", "fair-share"} <= set(POLICIES)


# ---------------------------------------------------------------------------
# The array entry point (Policy.array_allocator): where a policy declares one, it
# must give the rates of the view path, bit for bit, in the same order.


def arrays_case(seed: int, one_release: bool = False) -> tuple[SystemView, ArrayView]:
    """A view whose jobs are all active and in index order, and the same view as arrays
    (NaN in the rows that are not jobs of the view, so reading one shows); with
    ``one_release``, every job released at the same time (as in synthetic windows)."""
    rng = random.Random(seed)
    now = rng.choice([0.0, 1.0, 1000.0, 1.8e6])
    capacity = rng.choice([1.0, 4.0, 0.3, 1e9])
    horizon = rng.choice([None, now + rng.choice([0.5, 10.0, 1e6])])
    size = rng.randint(0, 40)
    active = sorted(rng.sample(range(size), rng.randint(0, size)))
    progress, released_at, demand, caps, remaining, posted_at, volume, last_work = (
        [math.nan] * size for _ in range(8)
    )
    job_ids = [f"{i:02d}" for i in range(size)]
    jobs = {}
    for i in active:
        cap = capacity * rng.choice([1.0, 1.0, 0.5, rng.uniform(0.01, 1.0)])
        caps[i] = cap
        demand[i] = rng.choice([cap, cap * rng.uniform(0.01, 1.0)])
        # fresh (τ ≥ t) and equal yields (P = 0, or P proportional to the age) for ties
        released_at[i] = rng.choice([now, now + 1.0, now * rng.uniform(0.0, 1.0), 0.0])
        if one_release:
            released_at[i] = 0.0 if now > 0.0 else -1.0
        age = now - released_at[i]
        progress[i] = rng.choice([0.0, age * 0.5, age * rng.uniform(0.0, 1.0)]) if age > 0 else 0.0
        # equal and zero volumes and post times, for ties
        remaining[i] = rng.choice([0.0, cap, cap * rng.uniform(0.0, 100.0)])
        volume[i] = rng.choice([0.0, remaining[i], remaining[i] * rng.uniform(1.0, 2.0)])
        posted_at[i] = rng.choice([now, now - 1.0, now * rng.uniform(0.0, 1.0)])
        last_work[i] = rng.choice([0.0, rng.uniform(0.0, 1e4)])
        jobs[job_ids[i]] = JobView(
            job_ids[i], "u", "g", 1, 1.0, cap, demand[i], posted_at=posted_at[i],
            volume=volume[i], remaining=remaining[i], moved=volume[i] - remaining[i],
            released_at=released_at[i], progress=progress[i], last_work=last_work[i],
            index=i,
        )  # fmt: skip
    view = SystemView(
        now=now, capacity=capacity, node_bandwidth=capacity, jobs=jobs, horizon=horizon
    )
    rows = ArrayView(
        now, capacity, horizon, active, progress, released_at, demand, caps, remaining,
        posted_at, volume, last_work, job_ids,
    )  # fmt: skip
    return view, rows


ARRAY_POLICIES = [p for p in POLICIES if REGISTRY.create(p).array_allocator() is not None]


def test_greedy_yield_declares_an_array_entry_point() -> None:
    assert {"greedy-yield", "fair-share"} <= set(ARRAY_POLICIES)  # the suite checks something
    assert "periodic-greedy-yield" in ARRAY_POLICIES  # a fixed period


@pytest.mark.parametrize("name", ARRAY_POLICIES)
@pytest.mark.parametrize("seed", range(300))
def test_array_entry_point_is_the_view_path(name: str, seed: int) -> None:
    view, rows = arrays_case(seed)
    policy = REGISTRY.create(name)
    arrays = policy.array_allocator()
    assert arrays is not None
    decision = decide(REGISTRY.create(name), view)
    assert decision.period == policy.fixed_period()  # the simulator has no view to ask
    expected = [(view.jobs[j].index, rate) for j, rate in decision.rates.items()]
    got = arrays(rows)
    assert got == expected  # same jobs, same order, same floats


@pytest.mark.parametrize("name", ARRAY_POLICIES)
@pytest.mark.parametrize("seed", range(100))
def test_array_entry_point_is_the_view_path_with_one_release_time(name: str, seed: int) -> None:
    view, rows = arrays_case(seed, one_release=True)
    arrays = REGISTRY.create(name).array_allocator()
    assert arrays is not None
    expected = [
        (view.jobs[j].index, r) for j, r in decide(REGISTRY.create(name), view).rates.items()
    ]
    assert arrays(rows) == expected


def test_greedy_yield_arrays_break_yield_ties_by_index() -> None:
    # equal yields 0.5 and a fresh job (τ = t): the fresh one first, then by index
    progress, released_at, demand = [1.0, 1.0, 0.0, 2.0], [0.0, 0.0, 2.0, -2.0], [0.6] * 4
    rows = ArrayView(
        2.0, 1.0, None, [0, 1, 2, 3], progress, released_at, demand, demand, [], [], [], [], []
    )
    got = GreedyYield().allocate_arrays(rows)
    assert got == [(2, 0.6), (0, 0.4)]


@pytest.mark.parametrize("seed", range(100))
def test_rates_do_not_depend_on_the_order_the_view_lists_its_jobs(
    policy_name: str, seed: int
) -> None:
    """Builders list jobs in different orders (the controller's table in the order its
    rows were rebuilt, the simulator in index order): the same jobs must give the same
    rates, bit for bit, or a replayed decision would differ from the live one."""
    view = random_view(seed)
    rng = random.Random(seed)
    shuffled = list(view.jobs.items())
    rng.shuffle(shuffled)
    other = SystemView(view.now, view.capacity, view.node_bandwidth, dict(shuffled), view.seed)
    expected = decide(REGISTRY.create(policy_name), view).rates
    assert decide(REGISTRY.create(policy_name), other).rates == expected


@pytest.mark.parametrize("seed", range(60))
def test_the_blend_with_a_split_does_not_depend_on_the_views_order(
    policy_name: str, seed: int
) -> None:
    view = random_view(seed)
    rng = random.Random(seed)
    targets = {j: rng.uniform(0, 2) * v.cap for j, v in view.jobs.items() if rng.random() < 0.6}
    shuffled = list(view.jobs.items())
    rng.shuffle(shuffled)
    other = SystemView(view.now, view.capacity, view.node_bandwidth, dict(shuffled), view.seed)
    expected = decide(REGISTRY.create(policy_name), view, targets)
    assert decide(REGISTRY.create(policy_name), other, targets).rates == expected.rates
    assert sum(expected.rates.values()) <= view.capacity * (1 + 1e-9)
