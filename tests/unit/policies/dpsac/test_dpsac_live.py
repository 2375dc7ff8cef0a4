"""The live policy ``dpsac`` (policies/dpsac/live.py) on views with and without a buffer."""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest
from support import views
from support.sweep import seeds
from support.views import job

from burstctl.policies import JobView, SystemView, default_registry
from burstctl.policies.decision import decide
from burstctl.policies.dpsac.live import DpsacParams, DpsacPolicy, job_model
from burstctl.policies.registry import PolicyParamsError
from burstctl.policies.view import BufferView, Periodic

MiB = float(1 << 20)


def app(i: int, cap: float, *, work: float = 10.0, volume: float = 0.0, **fields: Any) -> JobView:
    """Job ``j{i}`` after a work phase of ``work`` s, its past operations ``volume`` bytes
    on average (what DPSAC learns a job's period from)."""
    return job(f"j{i}", cap, index=i, last_work=work, mean_volume=volume, **fields)


view = functools.partial(views.view, capacity=1000 * MiB, node_bandwidth=100 * MiB, now=100.0)


def test_registered_switchable_and_params_checked() -> None:
    registry = default_registry()
    assert "dpsac" in registry.names()
    policy = registry.create("dpsac", {"updater": "st", "priority": "max-sys-eff", "k_max": 3})
    assert isinstance(policy, DpsacPolicy)
    for bad in ({"k_max": 0}, {"gamma": 2.0}, {"updater": "xx"}, {"time_unit": 0}, {"seed": 1}):
        with pytest.raises(PolicyParamsError):
            registry.validate("dpsac", bad)


def test_job_model_declared_learned_and_unknown() -> None:
    j = app(0, 100.0, work=30.0, volume=1000.0)
    declared = job_model(j, Periodic(nodes=1, w=90.0, vol_io=1000.0), 2.0)
    assert (declared.length, declared.p, declared.rate) == (10.0, 0.1, 200.0)
    learned = job_model(j, None, 2.0)
    assert (learned.length, learned.p) == (10.0, 0.25)  # 10 / (30 + 10)
    unknown = job_model(app(1, 100.0), None, 2.0)
    assert (unknown.length, unknown.p) == (2.0, 1.0)


def test_without_a_buffer_it_is_bios_greedy_in_priority_order() -> None:
    # MinMax-0.5: j1 is slowed down (yield 0.1 < 0.5 of ρ = 0.9) so it goes first
    jobs = [
        app(0, 600 * MiB, volume=10.0, progress=90.0),  # yield 0.9
        app(1, 600 * MiB, volume=10.0, progress=10.0),  # yield 0.1
    ]
    rates = decide(DpsacPolicy(), view(*jobs, buffer=None)).rates
    assert rates == {"j1": 600 * MiB, "j0": 400 * MiB}


def buffer(size: float, drain: float, resident: dict[str, float] | None = None) -> BufferView:
    resident = resident or {}
    return BufferView(size, sum(resident.values()), drain, resident)


def test_within_the_pfs_share_everyone_gets_b_i() -> None:
    jobs = [app(i, 10 * MiB, volume=100 * MiB) for i in range(4)]
    policy = DpsacPolicy()
    rates = decide(policy, view(*jobs, buffer=buffer(1000 * MiB, 100 * MiB))).rates
    assert rates == {f"j{i}": 10 * MiB for i in range(4)}


def test_the_buffer_takes_the_m_th_job_unless_its_partition_would_overflow() -> None:
    # one cluster (equal lengths, P_i = 1/11); Σ B_i = 400 MiB/s over B = 150 MiB/s: j0 fits
    # the PFS share, j1 is the m-th (100 + 100 ≥ 150)
    jobs = [app(i, 100 * MiB, volume=100 * MiB, work=10.0) for i in range(4)]
    # an empty buffer: P_full = Pr(X ≥ 1000 + 150) = 0, so j1 is selected (and j2, j3 with
    # probability 0^1, 0^2): 50 MiB of the burst go to the buffer
    empty = buffer(1000 * MiB, 150 * MiB)
    assert decide(DpsacPolicy(), view(*jobs, buffer=empty)).rates == {
        "j0": 100 * MiB,
        "j1": 100 * MiB,
    }
    # a nearly full partition: buffering j1's excess would overflow it (line 15), so the PFS
    # share alone is used: j1 gets the rest of it, or nothing if its draw failed
    full = buffer(1000 * MiB, 150 * MiB, {"j0": 999 * MiB})
    for seed in range(10):
        rates = decide(DpsacPolicy(), view(*jobs, buffer=full, seed=seed)).rates
        assert rates["j0"] == 100 * MiB and rates.get("j1", 50 * MiB) == 50 * MiB
        assert set(rates) <= {"j0", "j1"}


def test_deterministic_for_a_view_and_the_decision_path_has_nothing_to_fix() -> None:
    jobs = [app(i, (10 + i) * MiB, volume=(1 + i % 3) * 100 * MiB, work=5.0 * (i % 4))
            for i in range(30)]  # fmt: skip
    v = view(*jobs, buffer=buffer(300 * MiB, 50 * MiB, {"j3": 100 * MiB}), capacity=200 * MiB)
    policy = DpsacPolicy()
    first = decide(policy, v).rates
    assert decide(policy, v).rates == first
    assert decide(DpsacPolicy(), v).rates == first
    assert sum(first.values()) <= 200 * MiB * (1 + 1e-12)
    decision = decide(DpsacPolicy(), v)
    assert not decision.clamped and decision.rates == first


def test_joins_and_exits_update_the_dists_incrementally() -> None:
    policy = DpsacPolicy(DpsacParams(updater="st"))
    small = [app(i, 10 * MiB, volume=10 * MiB, work=10.0) for i in range(6)]  # l = 1 s
    big = [app(10 + i, 10 * MiB, volume=1000 * MiB, work=10.0) for i in range(6)]  # l = 100 s
    buf = buffer(1000 * MiB, 100 * MiB)
    decide(policy, view(*small, *big, buffer=buf))
    assert policy.clustering == [[f"j{i}" for i in range(6)], [f"j{i}" for i in range(10, 16)]]
    rebuilds = policy.rebuilds
    k = next(i for i, c in enumerate(policy.clustering) if "j0" in c)
    before = policy.distribution(k).pmf
    decide(policy, view(*small, app(6, 10 * MiB, volume=10 * MiB), *big, buffer=buf))
    assert policy.rebuilds == rebuilds  # a single join: one Algorithm 2 pass, no rebuild
    assert policy.distribution(k).count == 7
    decide(policy, view(*small, *big, buffer=buf))  # j6 left again
    assert policy.rebuilds == rebuilds
    assert policy.distribution(k).pmf == pytest.approx(before, abs=1e-12)


def test_the_rng_comes_from_the_view_seed() -> None:
    # P_i = 1/1.5: P_full = Pr(X ≥ 1000 + 100 − 400 MiB) = Pr(≥ 7 of 12 in I/O) ≈ 0.63
    jobs = [app(i, 100 * MiB, volume=100 * MiB, work=0.5) for i in range(12)]
    b = buffer(1000 * MiB, 100 * MiB, {"j0": 400 * MiB})
    outcomes = {
        tuple(sorted(decide(DpsacPolicy(), view(*jobs, buffer=b, seed=s)).rates)) for s in range(20)
    }
    assert len(outcomes) > 1  # line 14's draws differ between seeds


@pytest.mark.parametrize("seed", seeds(15, 60))
def test_invariants_on_random_views_with_a_buffer(seed: int) -> None:
    """The conformance suite's views carry no buffer; these do (with the same bounds,
    except work conservation: DPSAC defers on purpose)."""
    rng = random.Random(seed)
    base = random_view(rng)
    resident = {j: rng.uniform(0, 64 * MiB) for j in base.jobs if rng.random() < 0.5}
    size = rng.choice([64, 300, 4096]) * MiB
    buf = BufferView(size, min(size, sum(resident.values())), rng.choice([0.0, 10 * MiB, 1e9]),
                     resident)  # fmt: skip
    v = SystemView(now=base.now, capacity=base.capacity, node_bandwidth=base.node_bandwidth,
                   jobs=base.jobs, seed=seed, buffer=buf)  # fmt: skip
    name = rng.choice(["st", "dt", "ok"])
    policy = DpsacPolicy(DpsacParams(updater=name))
    rates = decide(policy, v).rates
    for j, rate in rates.items():
        job_ = v.jobs[j]
        assert 0.0 < rate <= job_.demand + 1e-9 * v.capacity and job_.active
    assert sum(rates.values()) <= v.capacity * (1 + 1e-12)
    assert (
        decide(DpsacPolicy(DpsacParams(updater=name)), v).rates == rates == decide(policy, v).rates
    )
    assert not decide(DpsacPolicy(DpsacParams(updater=name)), v).clamped


def random_view(rng: random.Random) -> SystemView:
    capacity = rng.choice([10, 400, 4096]) * MiB
    jobs = []
    for i in range(rng.randint(0, 14)):
        cap = min(rng.choice([1, 2, 16, 128]) * 8 * MiB, capacity)
        state = rng.random()
        demand = 0.0 if state < 0.2 else cap if state < 0.7 else rng.uniform(0.01, 1) * cap
        jobs.append(
            app(i, cap, demand=demand, work=rng.uniform(0, 100), nodes=rng.randint(1, 64),
                volume=rng.choice([0.0, rng.uniform(1, 1 << 34)]), progress=rng.uniform(0, 99))
        )  # fmt: skip
    return view(*jobs, buffer=None, capacity=capacity)


def test_it_asks_to_decide_again_every_time_unit_with_a_buffer_and_io() -> None:
    """Algorithm 3 draws every time unit ([DPSAC] §4.4.3): the controller's scheduler and the
    simulator decide again after ``period`` even when no event comes."""
    policy = DpsacPolicy(DpsacParams(time_unit=2.5))
    busy = [app(0, 100 * MiB), app(1, 50 * MiB)]
    assert policy.period(view(*busy, buffer=buffer(300 * MiB, 100 * MiB))) == 2.5
    assert policy.period(view(*busy, buffer=None)) is None  # BIOS: no draws
    idle = [app(0, 100 * MiB, demand=0.0)]
    assert policy.period(view(*idle, buffer=buffer(300 * MiB, 100 * MiB))) is None
