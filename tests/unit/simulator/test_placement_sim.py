"""The [DIST-IO] simulator (docs/simulator.md, "[DIST-IO] placement"): the generator's
bound and invariants, the fluid simulation against the paper's unit-step alternation rule,
conservation and capacity, ρ ≥ 1, and determinism by seed."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from burstctl.policies.placement.model import io_load
from burstctl.simulator.placement import report, runs
from burstctl.simulator.placement.runs import SimApp, simulate
from burstctl.simulator.placement.workloads import (
    C_MAX,
    HORIZON,
    MAX_PHASES,
    MIN_PHASES,
    N_RESOURCES,
    Q_CPU,
    apps_for_load,
    class_sizes,
    generate,
    io_load_one,
    x_bound,
)


def _flat(rng: random.Random) -> tuple[str, list[float]]:
    return "neutral", [1.0] * N_RESOURCES


@pytest.mark.parametrize(("c", "b"), [(0.1, 36.15), (0.25, 9.347), (0.5, 2.513), (0.9, 0.2302)])
def test_x_bound_matches_the_lambert_w_values(c: float, b: float) -> None:
    got = x_bound(c)
    assert got == pytest.approx(b, rel=5e-4)
    assert math.log1p(got) == pytest.approx(c * got, rel=1e-12)


@pytest.mark.parametrize("c", [0.0, 1.0, 1.5, -0.1])
def test_x_bound_refuses_c_outside_0_1(c: float) -> None:
    with pytest.raises(ValueError, match="0 < c < 1"):
        x_bound(c)


@pytest.mark.parametrize("load", [0.05, 0.4, 0.5, 1.0, 1.7, 2.0])
def test_k_keeps_the_bound_defined_and_the_classes_whole(load: float) -> None:
    k = apps_for_load(load)
    assert k % 10 == 0 and k >= 10
    assert load * N_RESOURCES / k <= C_MAX
    assert k == 10 or load * N_RESOURCES / (k - 10) > C_MAX  # the smallest such K
    sizes = class_sizes(k)
    assert len(sizes) == k and min(sizes) >= 1
    large, medium = sizes[: k // 10], sizes[k // 10 : 4 * k // 10]
    assert sum(large) == 360 and sum(medium) == 96
    assert max(large) - min(large) <= 1 and max(medium) - min(medium) <= 1


@pytest.mark.parametrize("load", [0.0, -1.0, 2.01])
def test_load_outside_0_2_is_refused(load: float) -> None:
    with pytest.raises(ValueError, match="load"):
        apps_for_load(load)


def test_generated_apps_follow_the_horizon_and_ranges() -> None:
    rng = random.Random(3)
    for load in (0.3, 1.2):
        apps = generate(load, rng, _flat)
        b = x_bound(load * N_RESOURCES / len(apps))
        assert sum(a.q for a in apps) == Q_CPU
        for a in apps:
            assert MIN_PHASES <= a.phases <= MAX_PHASES
            assert 0.0 <= a.x <= b
            t_cf1 = a.v_io / a.bandwidth[0]
            assert a.t_cpu + t_cf1 == pytest.approx(HORIZON)
            assert a.t_cpu / t_cf1 == pytest.approx(a.x, abs=1e-9)


@pytest.mark.parametrize("load", [0.2, 0.8, 1.5])
def test_mean_io_load_of_pi_1_is_the_target_within_its_standard_error(load: float) -> None:
    """[DIST-IO] §V-C: E[I/O-load(π_1)] = Θ over generated sets."""
    rng = random.Random(f"theta:{load}")
    loads = [io_load_one(generate(load, rng, _flat)) for _ in range(300)]
    mean = statistics.fmean(loads)
    se = statistics.stdev(loads) / math.sqrt(len(loads))
    assert se < 0.02 * load  # tight enough that a wrong bound (c off by 5 %) would fail
    assert abs(mean - load) <= 3 * se


# ------------------------------------------------------------ the simulation


def _unit_step(apps: list[tuple[int, int, int, tuple[int, ...]]], n: int) -> list[int]:
    """The paper's time-based rule ([DIST-IO] §V-B), written independently for the
    comparison: unit steps, each transfer moves 1 unit when it holds its resource, and
    colliding applications take turns one unit each. ``apps`` are (phases, compute
    units per phase, units per transfer, resources). Returns the I/O time of each
    application until every one has done all its phases once."""
    k = len(apps)
    compute = [c for _, c, _, _ in apps]
    rem: list[dict[int, int]] = [{} for _ in apps]
    done = [0] * k
    io_time = [0] * k
    turn = [0] * n  # round-robin pointer per resource
    for j in range(k):
        if compute[j] == 0:
            rem[j] = dict.fromkeys(apps[j][3], apps[j][2])
    while any(done[j] < apps[j][0] for j in range(k)):
        serve: dict[int, int] = {}
        for r in range(n):
            users = [j for j in range(k) if rem[j].get(r, 0) > 0]
            if users:
                pick = min((j for j in users if j >= turn[r]), default=users[0])
                serve[r] = pick
                turn[r] = pick + 1
        for j in range(k):
            if rem[j]:
                io_time[j] += 1
            else:
                compute[j] -= 1
        for r, j in serve.items():
            rem[j][r] -= 1
        for j in range(k):
            if rem[j] and all(v == 0 for v in rem[j].values()):
                rem[j] = {}
                done[j] += 1
                compute[j] = apps[j][1]
            if not rem[j] and compute[j] == 0:
                rem[j] = dict.fromkeys(apps[j][3], apps[j][2])
    return io_time


def test_fluid_simulation_agrees_with_the_unit_step_alternation_rule() -> None:
    rng = random.Random(11)
    n = 4
    spec = []
    for _ in range(5):
        size = rng.randint(1, 3)
        spec.append((rng.randint(2, 4), rng.randint(0, 300), rng.randint(50, 200), size))
    unit_apps = [(p, c, v, tuple(rng.sample(range(n), s))) for p, c, v, s in spec]
    ref = _unit_step(unit_apps, n)
    fluid = simulate(
        [
            SimApp(phases=p, t_cpu=p * c, v_io=p * v * len(rs), bandwidth=len(rs), resources=rs)
            for p, c, v, rs in unit_apps
        ],
        n,
    )
    for j in range(len(unit_apps)):
        assert fluid.io_time[j] == pytest.approx(ref[j], rel=0.01)


def test_alone_an_application_runs_at_its_bandwidth() -> None:
    app = SimApp(phases=4, t_cpu=100.0, v_io=800.0, bandwidth=2.0, resources=(0, 3))
    m = simulate([app], 5)
    assert m.io_time[0] == pytest.approx(400.0)
    assert m.volume[0] == pytest.approx(800.0)
    assert m.t == pytest.approx(500.0)
    assert m.busy[0] == pytest.approx(0.8) and m.busy[1] == 0.0


def _random_apps(rng: random.Random, k: int, n: int) -> list[SimApp]:
    apps = []
    for _ in range(k):
        size = rng.randint(1, n)
        apps.append(
            SimApp(
                phases=rng.randint(2, 20),
                t_cpu=rng.choice([0.0, rng.uniform(10, 5000)]),
                v_io=rng.uniform(10, 5000),
                bandwidth=rng.uniform(0.5, 3.0),
                resources=tuple(rng.sample(range(n), size)),
            )
        )
    return apps


def test_every_byte_moves_no_resource_exceeds_its_capacity_and_rho_is_at_least_1() -> None:
    rng = random.Random(5)
    n = 6
    steps: list[tuple[float, dict[int, float]]] = []

    def record(dt: float, shares: dict[int, float]) -> None:
        steps.append((dt, dict(shares)))

    for _ in range(5):
        apps = _random_apps(rng, 8, n)
        steps.clear()
        m = simulate(apps, n, audit=record)
        for dt, shares in steps:  # capacity: the shares of a busy resource add up to 1
            assert dt >= 0.0
            for share in shares.values():
                assert share == pytest.approx(1.0)
        for r in range(n):
            busy_time = sum(dt for dt, shares in steps if r in shares)
            assert m.busy[r] * m.t == pytest.approx(busy_time)
            assert 0.0 <= m.busy[r] <= 1.0 + 1e-12
        for j, a in enumerate(apps):
            assert m.phases_done[j] >= a.phases  # every application ran all its phases
            per_phase = a.v_io / a.phases
            # whole phases moved their whole volume, the one under way at most its own
            assert m.volume[j] >= m.phases_done[j] * per_phase * (1 - 1e-9)
            assert m.volume[j] <= (m.phases_done[j] + 1) * per_phase * (1 + 1e-9)
            # never faster than alone: ρ = T·b(n_j)/V ≥ 1
            assert m.io_time[j] * a.bandwidth >= m.volume[j] * (1 - 1e-9)


def test_simulate_refuses_bad_applications() -> None:
    with pytest.raises(ValueError, match="distinct"):
        simulate([SimApp(2, 1.0, 1.0, 1.0, (0, 0))], 2)
    with pytest.raises(ValueError, match="outside"):
        simulate([SimApp(2, 1.0, 1.0, 1.0, (2,))], 2)


# ------------------------------------------------------------ sets, runs, sweep


def test_sets_are_reproducible_by_seed_and_differ_across_seeds() -> None:
    a, b = runs.make_set(0.6, 7, 3), runs.make_set(0.6, 7, 3)
    assert a == b
    assert runs.make_set(0.6, 8, 3).apps != a.apps
    assert runs.make_set(0.6, 7, 4).apps != a.apps
    # I/O-load(π_sys) ≤ I/O-load(π_1) ([DIST-IO] §III-B), and the set's load is π_sys's
    pi_1 = [1] * len(a.apps)
    assert a.load_sys <= io_load(a.apps, pi_1, N_RESOURCES) + 1e-12
    assert set(a.shapes) <= {"ascent", "descent", "peak", "neutral"}


def test_rows_are_reproducible_and_slowdowns_consistent() -> None:
    pset = runs.make_set(0.5, 1, 0)
    rows = runs.run_set(pset, runs.ALLOCATOR_NAMES, runs.PLACEMENT_NAMES, 1)
    again = runs.run_set(pset, runs.ALLOCATOR_NAMES, runs.PLACEMENT_NAMES, 1)
    assert rows == again
    assert len(rows) == 18
    for r in rows:
        assert set(r) == set(runs.FIELDS)
        assert r["max_slowdown"] >= r["mean_slowdown"] >= 1.0 - 1e-9  # ρ ≥ 1, measured
        assert r["rho_io"] >= 1.0 - 1e-12
        assert r["mean_slowdown"] == pytest.approx(r["rho_io"] + r["rho_con"])
        assert r["rho_con"] >= -1e-9
        assert 0.0 <= r["io_spread"] <= 1.0 and 0.0 < r["machine_idle_time"] < 1.0
    best = [r for r in rows if r["allocator"] == "best-bdw"]
    assert all(r["rho_io"] == pytest.approx(1.0) for r in best)  # BestBdw: ρ_io ≡ 1


def test_inaccurate_inputs_change_what_the_allocators_see_only() -> None:
    pset = runs.make_set(0.9, 2, 0)
    exact = runs.run_one(pset, "tcpu-allocator", "greedy-non-clairvoyant", 2)
    rough = runs.run_one(pset, "tcpu-allocator", "greedy-non-clairvoyant", 2, True)
    assert rough["inaccurate"] and not exact["inaccurate"]
    assert rough["load"] == exact["load"]  # the set (true b_j) is the same
    assert rough["mean_slowdown"] >= 1.0 - 1e-9
    # GNC and Random ignore b_j: same rows whatever the inputs (by construction, §VI-B)
    for alloc in ("random", "static"):
        a = runs.run_one(pset, alloc, "greedy-non-clairvoyant", 2)
        b = runs.run_one(pset, alloc, "greedy-non-clairvoyant", 2, True)
        assert {k: v for k, v in a.items() if k != "inaccurate"} == {
            k: v for k, v in b.items() if k != "inaccurate"
        }


def test_sweep_rows_are_the_same_whatever_the_worker_count() -> None:
    one = runs.sweep([0.2, 0.4], sets=2, seed=3, workers=1)
    two = runs.sweep([0.2, 0.4], sets=2, seed=3, workers=2)
    assert one == two
    per_set = len(runs.ALLOCATOR_NAMES) * len(runs.PLACEMENT_NAMES) + len(runs.ROBUSTNESS)
    assert len(one) == 4 * per_set
    assert [(r["target"], r["set"]) for r in one[::per_set]] == [
        (0.2, 0),
        (0.2, 1),
        (0.4, 0),
        (0.4, 1),
    ]


def test_csv_round_trip_and_readings(tmp_path: Path) -> None:
    rows = runs.sweep([0.3], sets=3, seed=0)
    path = runs.write_csv(rows, tmp_path / "p.csv")
    back = runs.read_csv(path)
    assert len(back) == len(rows)
    for a, b in zip(rows, back, strict=True):
        for key in runs.FIELDS:
            assert (
                b[key] == pytest.approx(a[key]) if isinstance(a[key], float) else b[key] == a[key]
            )
    text = "\n".join(report.readings(back))
    assert "I/O-spread: GC < GNC < Random" in text and "3 sets" in text


def test_linear_fit_and_ci() -> None:
    slope, icpt, r2 = report.linear_fit([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 7.0])
    assert (slope, icpt, r2) == pytest.approx((2.0, 1.0, 1.0))
    mean, half = report.ci95([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and half == pytest.approx(1.96 * statistics.stdev([1, 2, 3, 4]) / 2)
