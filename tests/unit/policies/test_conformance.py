"""Invariants every registered policy must hold (fsspec-style abstract suite).

rates ≥ 0; Σ rates ≤ B; idle jobs get 0; no job above its cap b_i; work-conserving
when demand exceeds B; deterministic for a fixed view and seed; the decision path
(``policies.decision.decide``) never needs to fix what a policy proposes; the same rates,
bit for bit, whatever the order the view lists its jobs in and whether it was built from
``JobView`` rows or over columns; and one decision entry point per policy. Random views
are drawn from seeded generators so a failure names its seed; the first seeds run in
``make test``, the rest behind the ``sweep`` marker.
"""

from __future__ import annotations

import ast
import inspect
import math
import random
from pathlib import Path

import pytest
from support import views
from support.sweep import seeds
from support.views import Table, rates_of

import burstctl.policies
import burstctl.simulator
from burstctl.policies import SystemView, default_registry, job_cap
from burstctl.policies.base import Policy
from burstctl.policies.decision import decide

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
        jobs[f"j{i}"] = views.job(
            f"j{i}",
            cap,
            demand,
            user=f"u{rng.randint(0, 3)}",
            group=f"g{rng.randint(0, 1)}",
            nodes=nodes,
            priority=rng.choice([1.0, 2.0, 0.5]),
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


@pytest.mark.parametrize("seed", seeds(20, 200))
def test_invariants(policy_name: str, seed: int) -> None:
    view = random_view(seed)
    policy = REGISTRY.create(policy_name)
    rates = rates_of(view, policy.allocate(view))
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
    assert rates_of(view, REGISTRY.create(policy_name).allocate(view)) == rates
    assert rates_of(view, policy.allocate(view)) == rates
    # the enforcement has nothing to fix and keeps the positive rates as they are
    decision = decide(REGISTRY.create(policy_name), view)
    assert not decision.clamped
    assert decision.rates == {j: r for j, r in rates.items() if r > 0.0}


def test_empty_view(policy_name: str) -> None:
    view = SystemView(now=0.0, capacity=MiB, node_bandwidth=MiB)
    assert sum(rates_of(view, REGISTRY.create(policy_name).allocate(view)).values()) == 0.0


def test_registry_knows_the_core_policies() -> None:
    assert {"fcfs", "fair-share"} <= set(POLICIES)


@pytest.mark.parametrize("seed", seeds(10, 100))
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


@pytest.mark.parametrize("seed", seeds(8, 60))
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


# ---------------------------------------------------------------------------
# One path: a view over columns (the simulator's) and views built from the same rows in
# any order (the controller's) decide alike, decision after decision, for policies that
# learn from the views they are shown as for the others. Where every demand is B (the
# synthetic windows) the greedy policies take their shortcuts; jobs post, leave, come back
# and change rows, so Set-10's by-row memory is put to the test.


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("seed", seeds(3, 30))
def test_a_view_over_columns_decides_as_views_of_rows_in_any_order(
    policy_name: str, full: bool, seed: int
) -> None:
    rng = random.Random(seed)
    table = Table(rng, rng.randint(2, 30), rng.choice([1.0, 4.0, 0.3]), full=full)
    on_columns, on_rows = REGISTRY.create(policy_name), REGISTRY.create(policy_name)
    mixed = REGISTRY.create(policy_name)  # one policy shown both kinds of view, in turn
    served = 0
    for _ in range(60):
        table.step()
        expected = decide(on_rows, table.rows_view(shuffle=rng)).rates
        served += len(expected)
        assert decide(on_columns, table.columns_view()).rates == expected
        either = table.rows_view(shuffle=rng) if rng.random() < 0.3 else table.columns_view()
        assert decide(mixed, either).rates == expected
    assert served > 0  # the comparison says something
    if hasattr(on_rows, "omega"):
        for job_id in set(table.ids):
            assert on_columns.omega(job_id) == on_rows.omega(job_id) == mixed.omega(job_id)


# ---------------------------------------------------------------------------
# One decision entry point per policy: ``allocate``.

POLICY_CLASSES = sorted({type(REGISTRY.create(name)) for name in POLICIES}, key=str)
ENTRY_POINT = set(vars(Policy)) - {"__init__", "__repr__", "__init_subclass__"}
# Public methods that return a float per job and are not rates (so not a way to decide)
NOT_RATES = {"shares": "ThemisIO's token shares (eq. 1, Σ = 1), what its rates are made of"}


@pytest.mark.parametrize("cls", POLICY_CLASSES, ids=lambda c: c.__name__)
def test_no_policy_class_has_two_decision_entry_points(cls: type[Policy]) -> None:
    """Only ``allocate`` returns rates: every other public method of a policy class is
    part of the ``Policy`` interface (schedules, period, offload) or an accessor of what
    it learned, and none returns rates by row or by job id."""
    for klass in cls.__mro__:
        if klass is Policy or not issubclass(klass, Policy):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in ENTRY_POINT or not inspect.isfunction(member):
                continue
            returns = str(inspect.signature(member).return_annotation)
            assert "RowRates" not in returns and "tuple[int, float]" not in returns, (klass, name)
            if name not in NOT_RATES:
                assert "float]" not in returns, (klass, name, returns)


def test_no_second_decision_path_is_left_in_the_code() -> None:
    for package in (burstctl.policies, burstctl.simulator):
        for path in Path(package.__path__[0]).rglob("*.py"):
            names = {
                node.id if isinstance(node, ast.Name) else node.attr
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Name | ast.Attribute)
            }
            found = names & {"allocate_arrays", "array_allocator", "ArrayView", "enforce_rows"}
            assert not found, (path, found)
