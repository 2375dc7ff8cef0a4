"""BestNextEvent ([BWS] §4.3): hand-computed cases, the choices left open, and properties.

Units are normalised (B = 1, b_i = 1 unless said) and t = 10, τ = 0 throughout,
so y_k(δ) = (P_k + β_k·δ/b_k)/(10 + δ) and C_k(δ) = (P_k + V_k/b_k)/(10 + δ) is
k's yield at t + δ had it completed by then. The arithmetic is in the comments.
"""

from __future__ import annotations

import functools
import math
import random

import pytest
from support import views
from support.sweep import seeds
from support.views import allocation, job

from burstctl.policies import JobView, SystemView, default_registry
from burstctl.policies.best_next_event import BestNextEvent
from burstctl.policies.greedy import GreedyYield, LookAheadGreedyYield

REGISTRY = default_registry()


# B = 1 (b = B) at t = 10
view = functools.partial(views.view, capacity=1.0, now=10.0)


def allocate(v: SystemView) -> dict[str, float]:
    return allocation(BestNextEvent(), v)


def assert_rates(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k] == pytest.approx(w, abs=1e-12), k


def test_registered() -> None:
    assert isinstance(REGISTRY.create("best-next-event"), BestNextEvent)


# --- two jobs ------------------------------------------------------------------------


def two_jobs(horizon: float | None) -> SystemView:
    # a: P 5 (y 0.5), V 10, d_a = 10; b: P 6 (y 0.6), V 1, d_b = 1
    return view(
        job("a", index=0, progress=5.0, remaining=10.0),
        job("b", index=1, progress=6.0, remaining=1.0),
        horizon=horizon,
    )


def test_two_jobs_the_short_io_completes_when_the_yields_meet() -> None:
    # T = 100, so δ ≤ 90.
    # Event b at δ ≥ 1: β_b = 1/δ, a gets 1 − 1/δ (below its cap 10/δ while δ ≤ 11):
    #   y_b = (6 + 1)/(10 + δ) falls, y_a = (5 + δ − 1)/(10 + δ) rises; they meet at
    #   7 = 4 + δ → δ = 3: β_b = 1/3, β_a = 2/3, both yields 7/13 ≈ 0.538.
    # Event a at δ ≥ 10: b gets 1 − 10/δ, capped at 1/δ (done) from δ = 11, so
    #   y_b ≤ 7/21 = 1/3 at best (δ = 11).
    # No event (δ = 90): caps 10/90 and 1/90 leave bandwidth idle; y_b = 7/100.
    # → event b at δ = 3. GreedyYield serves a alone, LookAhead b alone.
    v = two_jobs(horizon=100.0)
    assert_rates(allocate(v), {"a": 2 / 3, "b": 1 / 3})
    assert allocation(GreedyYield(), v) == {"a": 1.0, "b": 0.0}
    assert allocation(LookAheadGreedyYield(), v) == {"a": 0.0, "b": 1.0}


def test_two_jobs_window_end_before_any_completion() -> None:
    # T = 10.5: δ ≤ 0.5 < d_b = 1, so only "no event" at δ = 0.5 is predictable.
    # Caps are b_k (V_k/0.5 ≥ 1). Water level: a alone, (5 + 0.5·β_a)/10.5 with
    # β_a = 1 gives 5.5/10.5 ≈ 0.524 < b's own 6/10.5 ≈ 0.571, so b gets nothing.
    assert_rates(allocate(two_jobs(horizon=10.5)), {"a": 1.0, "b": 0.0})


def test_demand_bounds_the_rate_progress_counts_over_the_cap() -> None:
    # As the first case, but b can use only 0.25 (cap still 1): d_b = 1/0.25 = 4 > 3,
    # so event b's best δ is its earliest, 4: y_b = 7/14 = 0.5, β_a = 0.75,
    # y_a = (5 + 3)/14 ≈ 0.571. Event a still gives at most 1/3.
    v = view(
        job("a", index=0, progress=5.0, remaining=10.0),
        job("b", index=1, progress=6.0, remaining=1.0, demand=0.25),
        horizon=100.0,
    )
    assert_rates(allocate(v), {"a": 0.75, "b": 0.25})


# --- three jobs ----------------------------------------------------------------------


def test_three_jobs_water_filling_behind_the_event() -> None:
    # T = 60 (δ ≤ 50): a and b (P 5, V 100, d = 100 > 50) cannot complete.
    # Event c (P 8, V 1) at δ: β_c = 1/δ, y_c = 9/(10 + δ). a and b are alike, so
    # the water level splits 1 − 1/δ evenly: y_a = y_b = (5 + (δ − 1)/2)/(10 + δ)
    # = (9 + δ)/(2(10 + δ)), rising. They meet at 18 = 9 + δ → δ = 9, y = 9/19:
    # β_c = 1/9, β_a = β_b = (1 − 1/9)/2 = 4/9.
    # No event (δ = 50): c is capped at 1/50, done with y_c = 9/60 = 0.15.
    v = view(
        job("a", index=0, progress=5.0, remaining=100.0),
        job("b", index=1, progress=5.0, remaining=100.0),
        job("c", index=2, progress=8.0, remaining=1.0),
        horizon=60.0,
    )
    assert_rates(allocate(v), {"a": 4 / 9, "b": 4 / 9, "c": 1 / 9})


def twins(first: str) -> SystemView:
    # x and y are twins: P 9, V 1, demand 0.75 (d = 4/3); z: P 4, V 20 (d = 20 > 10).
    # T = 20 (δ ≤ 10). Event x at δ: β_x = 1/δ, y_x = 10/(10 + δ).
    #   y (yield 9/(10 + δ) without bandwidth) and z (4/(10 + δ)) share 1 − 1/δ:
    #   z alone while its level (4 + δ − 1)/(10 + δ) ≤ 9/(10 + δ), i.e. δ ≤ 6; past 6
    #   both: (δ + 12)/(2(10 + δ)), falling. So the minimum (δ + 3)/(10 + δ) rises
    #   to δ = 6: β_x = 1/6, β_y = 0, β_z = 5/6, yields (9/16, 9/16, 10/16).
    # Event y: the mirror image, the same sorted vector at the same δ: a tie.
    # No event (δ = 10): x and y capped at 1/10 (done, y = 0.5) → minimum 0.5 < 9/16.
    return view(
        job("x", index=0 if first == "x" else 1, progress=9.0, remaining=1.0, demand=0.75),
        job("y", index=1 if first == "x" else 0, progress=9.0, remaining=1.0, demand=0.75),
        job("z", index=2, progress=4.0, remaining=20.0),
        horizon=20.0,
    )


@pytest.mark.parametrize("first", ["x", "y"])
def test_tie_between_events_goes_to_the_lower_index(first: str) -> None:
    other = "y" if first == "x" else "x"
    assert_rates(allocate(twins(first)), {first: 1 / 6, other: 0.0, "z": 5 / 6})


def test_only_work_conserving_allocations_are_candidates() -> None:
    # T = 110. p: P 8, V 4 (d 4); q: P 4, V 100, demand 0.5 (d 200, past the window);
    # r: P 9, V 1, demand 0.25 (d 4).
    # Event p at δ: q at its demand has y_q = (4 + 0.5δ)/(10 + δ), rising; r done has
    #   C_r = 10/(10 + δ), falling; they would meet at δ = 12 (10/22 each), but there
    #   β_p = 4/12, β_q = 0.5 and r's cap 1/12 leave 1/12 of B idle. Work-conserving
    #   needs 4/δ + 0.5 + 1/δ ≥ 1 → δ ≤ 10: the best is δ = 10, with
    #   y_q = 9/20 = 0.45, y_r = 10/20, y_p = 12/20; β_p = 0.4, β_q = 0.5, β_r = 0.1.
    # Event r: the same range and, at δ = 10, the same rates (p capped at 4/10): a tie,
    # and p has the lower index. (The reference would keep δ = 12 and 1/12 idle.)
    v = view(
        job("p", index=0, progress=8.0, remaining=4.0),
        job("q", index=1, progress=4.0, remaining=100.0, demand=0.5),
        job("r", index=2, progress=9.0, remaining=1.0, demand=0.25),
        horizon=110.0,
    )
    assert_rates(allocate(v), {"p": 0.4, "q": 0.5, "r": 0.1})


def test_paper_example_2_first_decision_shares_equally() -> None:
    # [BWS] §5, Example 2 (Figure 1), m = 10, window [0, 1]: at t = 0 all ten jobs are fresh
    # (P = 0, τ = 0) with V = 0.2, so an uncompleted job's yield at δ is just β_k and a
    # completed one's 0.2/δ. Event c at δ ∈ [0.2, 1]: the nine others share 1 − 0.2/δ,
    # so one of them has at most (1 − 0.2/δ)/9 ≤ 0.8/9 < 0.1. No event (δ = 1): caps
    # 0.2/1 each, the equal split gives everyone 0.1 — FairShare's MinYield 1/m, where
    # the serialising strategies get 0.
    jobs = [job(f"a{k}", index=k, progress=0.0, remaining=0.2) for k in range(10)]
    rates = allocate(view(*jobs, now=0.0, horizon=1.0))
    assert_rates(rates, {f"a{k}": 0.1 for k in range(10)})


# --- zero volume, small cases --------------------------------------------------------


def test_zero_volume_operation_takes_the_short_io_shortcut() -> None:
    # z's operation has nothing left (V = 0 < 1e-3 s at its demand): it gets its demand
    # 0.5 and the others share the other 0.5 in proportion to demand (1 : 0.5); the
    # job at index 0 included (the reference's loop skips it).
    v = view(
        job("a", index=0, progress=5.0, remaining=10.0),
        job("z", index=1, progress=5.0, remaining=0.0, demand=0.5),
        job("c", index=2, progress=5.0, remaining=10.0, demand=0.5),
        horizon=100.0,
    )
    assert_rates(allocate(v), {"a": 1 / 3, "z": 0.5, "c": 1 / 6})


def test_tiny_remaining_volume_also_takes_the_shortcut() -> None:
    v = view(
        job("a", index=0, progress=9.0, remaining=10.0),
        job("b", index=1, progress=1.0, remaining=5e-4),
        horizon=100.0,
    )
    assert_rates(allocate(v), {"a": 0.0, "b": 1.0})


def test_enough_bandwidth_for_everyone_and_a_single_job() -> None:
    v = view(
        job("a", index=0, progress=5.0, remaining=10.0, demand=0.5),
        job("b", index=1, progress=6.0, remaining=1.0, demand=0.5),
        horizon=100.0,
    )
    assert allocate(v) == {"a": 0.5, "b": 0.5}
    assert allocate(
        view(job("a", index=0, progress=5.0, remaining=10.0, cap=4.0), capacity=2.0)
    ) == {"a": 2.0}
    assert allocate(view()) == {}


# --- live: no window end, unknown volumes --------------------------------------------


def test_live_horizon_is_the_total_volume_at_full_capacity() -> None:
    # Live: horizon max(Σ V/B, max d) = max(11, 10) = 11. Event b at δ = 3 as above;
    # event a at δ ∈ [10, 11] ≤ 1/3; no event at 11: caps 10/11 and 1/11 fill B exactly,
    # both done, y_b = 7/21 = 1/3. Same choice as with a window.
    assert_rates(allocate(two_jobs(horizon=None)), {"a": 2 / 3, "b": 1 / 3})


def test_live_unknown_volume_is_estimated_from_past_operations() -> None:
    # a posted volume 0: its mean past volume 12 minus the 2 already moved → V_a = 10,
    # the two-job case again.
    v = view(
        job("a", index=0, progress=5.0, remaining=None, mean_volume=12.0, moved=2.0),
        job("b", index=1, progress=6.0, remaining=1.0),
    )
    assert_rates(allocate(v), {"a": 2 / 3, "b": 1 / 3})


def test_live_unknown_volume_defines_no_event() -> None:
    # a: no volume, no history. Horizon = V_b/B = 1. Event b at δ = 1 takes all of B:
    # y_b = 7/11, y_a = 5/11. No event at δ = 1: a (uncapped) alone reaches
    # (5 + 1)/11 = 6/11 = b's yield without bandwidth → (6/11, 6/11) wins.
    v = view(
        job("a", index=0, progress=5.0, remaining=None),
        job("b", index=1, progress=6.0, remaining=1.0),
    )
    assert_rates(allocate(v), {"a": 1.0, "b": 0.0})


def test_live_overdue_estimate_is_unknown_not_zero() -> None:
    # a's estimate is used up (mean 5, moved 7): unknown, not a zero-volume operation
    # (which would get all of B by the shortcut). Horizon V_b = 1: event b at δ = 1
    # gives (6/11, 6/11); no event at δ = 1 gives b everything too (b's 5/11 is lower):
    # the same vector at the same δ, and the event wins the tie.
    v = view(
        job("a", index=0, progress=6.0, remaining=None, mean_volume=5.0, moved=7.0),
        job("b", index=1, progress=5.0, remaining=1.0),
    )
    assert_rates(allocate(v), {"a": 0.0, "b": 1.0})


def test_live_without_any_volume_is_greedy_yield() -> None:
    v = view(
        job("a", index=0, progress=6.0, remaining=None),
        job("b", index=1, progress=5.0, remaining=None),
    )
    assert allocate(v) == allocation(GreedyYield(), v) == {"b": 1.0, "a": 0.0}


# --- properties ----------------------------------------------------------------------


def random_view(rng: random.Random, n: int, live: bool) -> SystemView:
    now = rng.uniform(10.0, 1000.0)
    jobs = []
    for i in range(n):
        cap = rng.choice([1.0, 1.0, 0.5, 0.3])
        released = rng.uniform(0.0, now)
        remaining: float | None = rng.choice([0.05, 1.0, 20.0, 300.0]) * rng.uniform(0.5, 2.0)
        if live and rng.random() < 0.3:
            remaining = None
        jobs.append(
            job(
                f"j{i}",
                index=i,
                progress=rng.uniform(0.3, 1.0) * (now - released),
                remaining=remaining,
                cap=cap,
                demand=cap * rng.choice([1.0, 1.0, 0.6]),
                released_at=released,
                mean_volume=rng.choice([0.0, 50.0]),
            )
        )
    horizon = None if live else now + rng.choice([5.0, 100.0, 1000.0, 1e5])
    return view(*jobs, horizon=horizon, now=now)


def next_event_min_yield(v: SystemView, rates: dict[str, float], span: float) -> float:
    """Minimum yield at the next predictable event the allocation implies."""
    delta = span
    for j in v.jobs.values():
        if rates[j.job_id] > 0.0 and j.remaining is not None:
            delta = min(delta, j.remaining / rates[j.job_id])
    return min(
        (j.progress + min(rates[j.job_id] * delta, j.remaining or math.inf) / j.cap)
        / (v.now + delta - j.released_at)
        for j in v.jobs.values()
    )


def brute_force_min_yield(v: SystemView, span: float, steps: int = 150) -> float:
    """max over events c and a grid of δ of the minimum yield, by bisection on the level,
    over work-conserving allocations."""
    jobs = list(v.jobs.values())
    best = -math.inf
    events: list[JobView | None] = [None, *jobs]
    for c in events:
        if c is None:
            grid = [span]
        else:
            assert c.remaining is not None
            lo = c.remaining / c.demand
            if lo > span:
                continue
            grid = [lo * (span / lo) ** (i / steps) for i in range(steps + 1)]
        for delta in grid:
            budget = 1.0 - (0.0 if c is None else c.remaining / delta)  # type: ignore[operator]
            others = [j for j in jobs if j is not c]
            if sum(min(j.demand, (j.remaining or math.inf) / delta) for j in others) < budget:
                continue  # bandwidth would stay idle: not a candidate

            def rate(j: JobView, y: float, delta: float = delta) -> float:
                top = min(j.demand, (j.remaining or math.inf) / delta)
                need = j.cap * (y * (v.now + delta - j.released_at) - j.progress) / delta
                return min(top, max(0.0, need))

            lo_y, hi_y = 0.0, 10.0
            for _ in range(50):
                mid = (lo_y + hi_y) / 2
                if sum(rate(j, mid) for j in others) <= budget:
                    lo_y = mid
                else:
                    hi_y = mid
            ys = [
                (j.progress + rate(j, lo_y) * delta / j.cap) / (v.now + delta - j.released_at)
                for j in others
            ]
            if c is not None:
                assert c.remaining is not None
                ys.append((c.progress + c.remaining / c.cap) / (v.now + delta - c.released_at))
            best = max(best, min(ys))
    return best


@pytest.mark.parametrize("seed", seeds(8, 30))
def test_no_event_on_a_grid_beats_the_chosen_one(seed: int) -> None:
    # Black box: the minimum yield at the allocation's own next event is at least the
    # best any (event, δ on a fine grid) reaches with a capped water-filling.
    rng = random.Random(seed)
    while True:  # draw until the view is contended and has no short-I/O shortcut
        v = random_view(rng, rng.randint(2, 5), live=False)
        jobs = list(v.jobs.values())
        if (
            sum(j.demand for j in jobs) > 1.0
            and min((j.remaining or 0.0) / j.demand for j in jobs) >= 1e-3
        ):
            break
    assert v.horizon is not None
    span = v.horizon - v.now
    rates = allocate(v)
    assert next_event_min_yield(v, rates, span) >= brute_force_min_yield(v, span) - 1e-9


@pytest.mark.parametrize("seed", seeds(15, 100))
@pytest.mark.parametrize("live", [False, True])
def test_rates_are_bounded_work_conserving_and_deterministic(seed: int, live: bool) -> None:
    rng = random.Random(seed)
    v = random_view(rng, rng.randint(1, 12), live=live)
    rates = allocate(v)
    assert set(rates) == set(v.jobs)
    for j in v.jobs.values():
        assert 0.0 <= rates[j.job_id] <= j.demand + 1e-12
    assert sum(rates.values()) == pytest.approx(min(1.0, sum(j.demand for j in v.jobs.values())))
    assert allocate(v) == rates
