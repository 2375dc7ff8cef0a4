"""DeficitCom: GREEDY_FILL by V_i/b_i − λ·D_i, D_i = (t − τ_i) − P_i (docs/policies.md).

Hand-made views with B = 10 and b_i = 10 (one job takes everything, so the order
is the decision) and λ = 0.2 unless a case says otherwise; the keys are in the
comments.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import random
from typing import Any

import pytest
from click.testing import CliRunner
from support import views
from support.sweep import seeds
from support.views import allocation, job

from burstctl.cli import main
from burstctl.controller.jobs import JobMeta, JobTable, OpKind
from burstctl.policies import JobView, SystemView, default_registry
from burstctl.policies.decision import decide
from burstctl.policies.deficit_com import MAX_WEIGHT, DeficitCom, DeficitComParams
from burstctl.policies.greedy import GreedyCom, GreedyYield
from burstctl.policies.registry import PolicyParamsError
from burstctl.simulator.bws.fluid import app_ids
from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import Window, prepare_window
from burstctl.simulator.bws.runs import simulate

REGISTRY = default_registry()


# B = 10 = b_i at t = 1000 unless a case says otherwise
view = functools.partial(views.view, capacity=10.0, now=1000.0)


def waiting(remaining: float | None, progress: float) -> dict[str, Any]:
    """A job's pending operation (V_i; its volume, 0 when unknown) and its progress P_i,
    as ``job`` keywords."""
    volume = 0.0 if remaining is None else remaining
    return {"remaining": remaining, "volume": volume, "progress": progress}


def policy(weight: float | None = None) -> DeficitCom:
    params = {} if weight is None else {"weight": weight}
    policy = REGISTRY.create("deficit-com", params)
    assert isinstance(policy, DeficitCom)
    return policy


def test_registered_with_its_defaults() -> None:
    assert "deficit-com" in REGISTRY.names()
    assert (policy().params.weight, policy().params.budget) == (1.0, 0.025)


def test_equal_deficits_shortest_transfer_first() -> None:
    # D = 1000 − 900 = 100 for both; keys 50/10 − 20 = −15 and 10/10 − 20 = −19: b first
    a = job("a", 10.0, index=0, **waiting(50.0, 900.0))
    b = job("b", 10.0, index=1, **waiting(10.0, 900.0))
    assert allocation(policy(0.2), view(a, b)) == {"a": 0.0, "b": 10.0}


def test_a_job_far_behind_goes_before_a_shorter_transfer() -> None:
    # a: V/b = 5, D = 100, key 5 − 0.2·100 = −15; b: V/b = 1, D = 0, key 1: a first,
    # where GreedyCom (shortest transfer) would serve b
    a = job("a", 10.0, index=0, **waiting(50.0, 900.0))
    b = job("b", 10.0, index=1, **waiting(10.0, 1000.0))
    v = view(a, b)
    assert allocation(policy(0.2), v) == {"a": 10.0, "b": 0.0}
    assert allocation(GreedyCom(), v)["b"] == 10.0


def test_a_small_lag_does_not_outweigh_a_much_shorter_transfer() -> None:
    # a: D = 10, key 5 − 2 = 3; b: D = 0, key 1: b first, where GreedyYield
    # (lowest yield, a's 0.99 < b's 1.0) would serve a
    a = job("a", 10.0, index=0, **waiting(50.0, 990.0))
    b = job("b", 10.0, index=1, **waiting(10.0, 1000.0))
    v = view(a, b)
    assert allocation(policy(0.2), v) == {"a": 0.0, "b": 10.0}
    assert allocation(GreedyYield(), v)["a"] == 10.0
    # λ = 1: key a 5 − 10 = −5 < 1: the lag now decides
    assert allocation(policy(1.0), v) == {"a": 10.0, "b": 0.0}


def test_equal_keys_by_index() -> None:
    # a: 5 − 0.2·20 = 1, b: 1 − 0 = 1: a tie, the lower index first
    a = job("a", 10.0, index=1, **waiting(50.0, 980.0))
    b = job("b", 10.0, index=0, **waiting(10.0, 1000.0))
    assert allocation(policy(0.2), view(a, b)) == {"a": 0.0, "b": 10.0}


def test_unknown_volume_is_ordered_by_deficit_alone() -> None:
    # u: no volume, no history: V = 0, key −0.2·5 = −1; k: V/b = 0.1, D = 5, key −0.9:
    # u first (a job that never says its volume is not starved behind those that do)
    u = job("u", 10.0, index=1, **waiting(None, 995.0))
    k = job("k", 10.0, index=0, **waiting(1.0, 995.0))
    assert allocation(policy(0.2), view(u, k)) == {"u": 10.0, "k": 0.0}
    # with a history its estimate counts: mean 30, V/b = 3, key 2 > −0.9
    h = job("u", 10.0, index=1, **waiting(None, 995.0), mean_volume=30.0)
    assert allocation(policy(0.2), view(h, k)) == {"u": 0.0, "k": 10.0}


def test_the_deficit_counts_from_the_release() -> None:
    # same P, released later: smaller deficit. a: τ = 0, D = 1000 − 600 = 400;
    # b: τ = 300, D = 700 − 600 = 100. Transfers equal: a first
    a = job("a", 10.0, index=1, **waiting(10.0, 600.0))
    b = job("b", 10.0, index=0, **waiting(10.0, 600.0), released_at=300.0)
    assert allocation(policy(0.2), view(a, b)) == {"a": 10.0, "b": 0.0}


def test_greedy_fill_leftover_flows_on_and_no_job_above_its_demand() -> None:
    # B = 10, caps 4: order b (key 1/4·... shortest), c, a; c wants only 3
    a = job("a", 4.0, index=0, **waiting(40.0, 1000.0))
    b = job("b", 4.0, index=1, **waiting(4.0, 1000.0))
    c = job("c", 4.0, 3.0, index=2, **waiting(8.0, 1000.0))
    assert allocation(policy(0.2), view(a, b, c)) == {"b": 4.0, "c": 3.0, "a": 3.0}


@pytest.mark.parametrize("seed", seeds(10, 50))
def test_weight_zero_is_greedy_com(seed: int) -> None:
    # (with every volume known: GreedyCom serves unknown ones last, DeficitCom by deficit)
    v = random_view(seed, known=True)
    assert allocation(policy(0.0), v) == allocation(GreedyCom(), v)


@pytest.mark.parametrize("seed", seeds(10, 50))
def test_a_large_weight_is_greedy_yield_when_releases_are_equal(seed: int) -> None:
    # τ all 0 and distinct yields: largest deficit first = lowest yield first
    v = random_view(seed, released_at=0.0)
    assert allocation(policy(MAX_WEIGHT), v) == allocation(GreedyYield(), v)


@pytest.mark.parametrize("seed", seeds(15, 100))
def test_weight_one_is_the_pairwise_min_max_order(seed: int) -> None:
    # two jobs, b_i = B: the first served delays the other by its V/b. λ = 1 picks the
    # order whose larger deficit, once both are done, is the smaller one
    rng = random.Random(seed)
    jobs = [
        job(n, 10.0, index=i, **waiting(rng.uniform(1, 500), rng.uniform(0, 1000)))
        for i, n in enumerate("ab")
    ]
    v = view(*jobs)
    first = max(allocation(policy(1.0), v).items(), key=lambda kv: kv[1])[0]

    def worst(order: tuple[JobView, JobView]) -> float:
        x, y = order
        return max(1000.0 - x.progress, 1000.0 - y.progress + x.remaining / x.cap)  # type: ignore[operator]

    chosen = worst(tuple(j for j in sorted(jobs, key=lambda j: j.job_id != first)))  # type: ignore[arg-type]
    assert chosen <= min(worst(o) for o in itertools.permutations(jobs)) + 1e-9  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-0.1, MAX_WEIGHT * 2, float("nan"), float("inf")])
def test_weight_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(PolicyParamsError, match="weight"):
        REGISTRY.validate("deficit-com", {"weight": bad})


def test_decide_has_nothing_to_fix() -> None:
    for seed in range(50):
        d = decide(DeficitCom(DeficitComParams(weight=0.5)), random_view(seed))
        assert not d.fixes and not d.scaled


def random_view(seed: int, released_at: float | None = None, known: bool = False) -> SystemView:
    rng = random.Random(seed)
    jobs = []
    for i in range(rng.randint(1, 8)):
        cap = rng.choice([2.0, 5.0, 10.0])
        tau = rng.uniform(0, 500) if released_at is None else released_at
        jobs.append(
            job(
                f"j{i}",
                cap,
                rng.choice([cap, rng.uniform(0.1, cap)]),
                index=i,
                released_at=tau,
                **waiting(
                    rng.choice([rng.uniform(0.1, 100), None if not known else 1.0]),
                    rng.uniform(0, 1000 - tau),
                ),
            )
        )
    return view(*jobs)


# --- In the simulator -----------------------------------------------------------------


def small_window(pressure: float, seed: int) -> Window:
    return prepare_window(generate(GeneratorParams(pressure=pressure, horizon=20_000), seed))


@pytest.mark.parametrize("seed", range(3))
def test_in_the_simulator_weight_zero_runs_exactly_as_greedy_com(seed: int) -> None:
    # every volume is known in the simulator, so λ = 0 (and no protected class) is
    # GreedyCom decision by decision
    win = small_window(1.1, seed)
    ours = simulate(win, DeficitCom(DeficitComParams(weight=0.0, budget=0.0)))
    theirs = simulate(win, GreedyCom())
    assert (ours.min_yield, ours.efficiency, ours.events) == (
        theirs.min_yield,
        theirs.efficiency,
        theirs.events,
    )


def test_sim_sweep_runs_it_by_name() -> None:
    result = CliRunner().invoke(
        main,
        ["sim", "sweep", "--policy", "deficit-com", "--policy", "greedy-com", "--pressure",
         "1.1", "--seeds", "2", "--horizon", "20000", "--workers", "1", "--format", "csv"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["policy"] for r in rows] == ["deficit-com", "greedy-com"] * 2
    assert all(r["error"] == "" and 0.0 < float(r["min_yield"]) <= 1.0 for r in rows)
    # the default (λ = 1, β = 0.025) is not GreedyCom: it keeps the worst yield higher
    assert float(rows[0]["min_yield"]) > float(rows[1]["min_yield"])


# --- The protected class (budget β) ---------------------------------------------------


def posted(
    job_id: str,
    index: int,
    *,
    at: float,
    work: float,
    volume: float,
    progress: float = 0.0,
    cap: float = 10.0,
) -> JobView:
    """A job of S(t) whose operation of ``volume`` was posted at ``at`` after ``work`` s."""
    return job(job_id, cap, index=index, posted_at=at, **waiting(volume, progress), last_work=work)


def protecting(budget: float, weight: float = 0.3) -> DeficitCom:
    return DeficitCom(DeficitComParams(weight=weight, budget=budget))


def learn(p: DeficitCom, *rounds: list[JobView], start: float = 0.0) -> None:
    """Shows ``p`` one view per round (now = start, start + 1, …)."""
    for k, jobs in enumerate(rounds):
        allocation(p, view(*jobs, now=start + k))


def test_a_cheap_job_goes_first_within_the_budget() -> None:
    # c: 99 s of work per 1 s of transfer, φ̂ = 0.01; d: 10 s per 10 s, φ̂ = 0.5
    p = protecting(0.05)
    first = [posted("c", 0, at=0.0, work=5.0, volume=10.0)]
    first.append(posted("d", 1, at=0.0, work=5.0, volume=100.0))
    second = [posted("c", 0, at=1.0, work=99.0, volume=10.0)]
    second.append(posted("d", 1, at=1.0, work=10.0, volume=100.0))
    learn(p, first, second)
    assert p.fraction("c") == pytest.approx(0.01)
    assert p.fraction("d") == pytest.approx(0.5)
    assert p.protected == {"c"}
    # now d has the shorter transfer (1 s against 5 s) and the larger deficit, so the key
    # alone (β = 0) serves d; c is protected and goes first
    c = posted("c", 0, at=1.0, work=99.0, volume=50.0, progress=990.0)
    d = posted("d", 1, at=1.0, work=10.0, volume=10.0, progress=900.0)
    assert allocation(p, view(c, d)) == {"c": 10.0, "d": 0.0}
    assert allocation(protecting(0.0), view(c, d)) == {"c": 0.0, "d": 10.0}


def test_the_protected_load_is_at_most_the_budget_s_share_of_the_learned_load() -> None:
    # φ̂ = 0.01, 0.02, 0.04, 0.08 (one counted operation each), b_i = 10: loads φ̂·b_i
    # 0.1, 0.2, 0.4, 0.8, in all 1.5. β = 0.25 (0.375) protects the two smallest (0.3),
    # not the third (0.7); β = 0.05 (0.075) none; β = 0.5 (0.75) three
    works = {"a": 99.0, "b": 49.0, "c": 24.0, "d": 11.5}
    first = [posted(j, i, at=0.0, work=1.0, volume=10.0) for i, j in enumerate(works)]
    second = [posted(j, i, at=1.0, work=w, volume=10.0) for i, (j, w) in enumerate(works.items())]
    for budget, expected in [(0.25, {"a", "b"}), (0.05, set()), (0.5, {"a", "b", "c"})]:
        p = protecting(budget)
        learn(p, first, second)
        assert p.protected == expected, budget
        load = {j: (p.fraction(j) or 0.0) * 10.0 for j in works}
        assert sum(load[j] for j in p.protected) <= budget * sum(load.values())


def test_each_operation_counts_once_and_the_first_not_at_all() -> None:
    p = protecting(1.0)  # a job alone is protected only with all the load
    # the first operation (after a start-up phase of 1 s): not counted
    learn(p, [posted("a", 0, at=0.0, work=1.0, volume=10.0)])
    assert p.fraction("a") is None and p.protected == frozenset()
    # the second, shown three times: counted once (work 9, transfer 1: φ̂ = 0.1)
    op = posted("a", 0, at=5.0, work=9.0, volume=10.0)
    learn(p, [op], [op], [op], start=5.0)
    assert p.fraction("a") == pytest.approx(0.1)
    # the third (work 29, transfer 1): running sums, φ̂ = 2/40
    learn(p, [posted("a", 0, at=50.0, work=29.0, volume=10.0)], start=50.0)
    assert p.fraction("a") == pytest.approx(2.0 / 40.0)
    assert p.protected == {"a"}


def test_a_view_not_observed_here_teaches_nothing() -> None:
    p = protecting(0.5)
    for k, work in enumerate([1.0, 9.0]):
        a = posted("a", 0, at=float(k), work=work, volume=10.0)
        allocation(p, view(a, now=float(k), observed=False))
    assert p.fraction("a") is None


def test_a_job_gone_for_ten_iterations_is_forgotten() -> None:
    # a: iteration 9 + 1 = 10 s, last seen at t = 1; b and h keep posting. Loads: a and b
    # 1 each (φ̂ = 0.1), h 5 (φ̂ = 0.5); β = 0.2 of 7 fits a (ties by job id), not b.
    # At t = 100 a is not yet 10 iterations away (99 s), at t = 102 it is: forgotten,
    # and b fits in 0.2 of the 6 left
    p = protecting(0.2)

    def b_and_h(at: float, work: float) -> list[JobView]:  # h: 1 s of work per 1 s of I/O
        b = posted("b", 1, at=at, work=work, volume=10.0)
        return [b, posted("h", 2, at=at, work=1.0, volume=10.0)]

    learn(
        p,
        [posted("a", 0, at=0.0, work=1.0, volume=10.0), *b_and_h(0.0, 1.0)],
        [posted("a", 0, at=1.0, work=9.0, volume=10.0), *b_and_h(1.0, 9.0)],
    )
    assert p.fraction("h") == pytest.approx(0.5)
    assert p.protected == {"a"}
    learn(p, b_and_h(100.0, 9.0), start=100.0)
    assert p.protected == {"a"} and p.fraction("a") is not None
    learn(p, b_and_h(102.0, 9.0), start=102.0)
    assert p.fraction("a") is None
    assert p.protected == {"b"}


def test_a_job_seen_once_is_kept_for_ten_of_its_own_iterations_whatever_the_others() -> None:
    # a's first operation came after 1000 s of work: it is kept while b's short iterations
    # (2 s) sweep the stale jobs (the longest iteration learned is b's, 2 s), and its
    # next operation, 5000 s later, is counted
    p = protecting(0.5)
    learn(p, [posted("a", 0, at=0.0, work=1000.0, volume=10.0)])
    for k in range(1, 50):  # b: a counted operation every 100 s, a sweep every other one
        learn(p, [posted("b", 1, at=100.0 * k, work=1.0, volume=10.0)], start=100.0 * k)
    learn(p, [posted("a", 0, at=5000.0, work=1000.0, volume=10.0)], start=5000.0)
    assert p.fraction("a") == pytest.approx(1 / 1001)
    # c's first came after 1 s of work (iteration 2 s): gone for 60 s, through at least
    # one sweep after it was 20 s away, it is forgotten, so its next operation is a first
    # again (not counted), and the one after is
    learn(p, [posted("c", 2, at=6000.0, work=1.0, volume=10.0)], start=6000.0)
    for k in range(1, 11):  # b: 10 operations, 6005 … 6050 s; a sweep every 3
        t = 6000.0 + 5 * k
        learn(p, [posted("b", 1, at=t, work=1.0, volume=10.0)], start=t)
    learn(p, [posted("c", 2, at=6060.0, work=9.0, volume=10.0)], start=6060.0)
    assert p.fraction("c") is None
    learn(p, [posted("c", 2, at=6080.0, work=9.0, volume=10.0)], start=6080.0)
    assert p.fraction("c") == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [-0.01, 1.01, float("nan"), float("inf")])
def test_budget_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(PolicyParamsError, match="budget"):
        REGISTRY.validate("deficit-com", {"budget": bad})


@pytest.mark.parametrize("seed", range(3))
def test_in_the_simulator_the_protected_jobs_are_the_cheapest(seed: int) -> None:
    # on a [BWS] §6.2 instance: the jobs served first are those of smallest learned I/O
    # fraction, within the budget
    win = small_window(1.1, seed)
    p = protecting(0.05, weight=0.5)
    simulate(win, p)
    assert p.protected, "nothing protected"
    phi = {j: p.fraction(j) for j in app_ids(len(win.apps))}
    learned = sorted(f for f in phi.values() if f is not None)
    chosen = sorted(phi[j] for j in p.protected)  # type: ignore[type-var]
    assert chosen == learned[: len(chosen)]
    assert sum(chosen) <= 0.05 * sum(learned)  # type: ignore[arg-type]  # b_i = B = 1


def test_the_controller_s_job_table_teaches_it_the_fractions() -> None:
    # live, ``last_work`` and the volumes come from the controller's own accounting. Every
    # 99 s: c and h post together, c moves 1 MiB (1 s at B = b_i = 1 MiB/s) and h 10 MiB
    # after it, so c learns φ̂ = 1/99 and h 10/98, and h waits 1 s each time (its deficit).
    now = [0.0]
    table = JobTable(lambda: now[0], heartbeat_timeout=1e9, job_retention=1e9, demand_headroom=1.5)
    mib = float(1 << 20)
    c = table.open_session(JobMeta("c", "u", "g", 1, 1.0), "client-c", "h")
    h = table.open_session(JobMeta("h", "u", "g", 1, 1.0), "client-h", "h")
    p = protecting(0.2)
    op = {"c": 0, "h": 0}

    def io(session: Any, job_id: str, volume: float) -> None:
        op[job_id] += 1
        table.post(session, op[job_id], OpKind.WRITE, int(volume))

    for _ in range(3):
        io(c, "c", mib)
        io(h, "h", 10 * mib)
        assert allocation(p, table.view(mib, mib)) == {"c": mib, "h": 0.0}
        now[0] += 1.0
        table.complete(c, op["c"])
        allocation(p, table.view(mib, mib))
        now[0] += 10.0
        table.complete(h, op["h"])
        now[0] += 88.0
    assert p.fraction("c") == pytest.approx(1 / 99)
    assert p.fraction("h") == pytest.approx(10 / 98)
    assert p.protected == {"c"}  # loads 1/99 and 10/98 MiB/s: c's is 9 % of them, both 100 %
    # now h posts 1 MiB and c 1 MiB a second later: the same transfer, and h is behind,
    # so the key alone serves h; c is protected and goes first
    io(h, "h", mib)
    now[0] += 1.0
    io(c, "c", mib)
    assert allocation(protecting(0.0), table.view(mib, mib)) == {"c": 0.0, "h": mib}
    assert allocation(p, table.view(mib, mib)) == {"c": mib, "h": 0.0}
