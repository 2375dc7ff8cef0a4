"""The live policy ``persched`` on views: the pattern becomes one Schedule per
periodic job, the others share the reserve, and a recomputation runs off the decision path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import views
from support.views import job

from burstctl.policies import SystemView, default_registry, job_cap
from burstctl.policies.decision import decide
from burstctl.policies.persched import App, Platform, jupiter_set, persched, validate
from burstctl.policies.persched.live import (
    GB,
    Key,
    PerSchedLive,
    compute,
    live_tmin,
    windows_of,
)
from burstctl.policies.schedule import Schedule
from burstctl.policies.view import Periodic

MiB = float(1 << 20)
B, b = 40 * MiB, 8 * MiB


def view(
    active: dict[str, int], periodic: dict[str, tuple[int, float, float]], now: float = 10.0
) -> SystemView:
    """Jobs in I/O (id → nodes), the jobs that declared a period (id → (nodes, w, vol_io))."""
    jobs = [job(j, job_cap(n, b, B), nodes=n, index=i) for i, (j, n) in enumerate(active.items())]
    declared = {j: Periodic(n, w, v) for j, (n, w, v) in periodic.items()}
    return views.view(*jobs, capacity=B, node_bandwidth=b, now=now, periodic=declared)


PERIODIC = {"p1": (2, 0.2, 3 * MiB), "p2": (2, 0.3, 4 * MiB), "p3": (1, 0.25, 1 * MiB)}
ALL = {"p1": 2, "p2": 2, "p3": 1, "np": 1}


class Deferred:
    """An offload that runs the work when the test says so."""

    def __init__(self) -> None:
        self.queued: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    def __call__(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.queued.append((work, done))

    def run(self) -> None:
        work, done = self.queued.pop(0)
        done(work())


def test_registered_with_bounded_parameters() -> None:
    registry = default_registry()
    assert registry.get("persched") is PerSchedLive
    with pytest.raises(ValueError, match="reserve"):
        registry.create("persched", {"reserve": 0.95})
    with pytest.raises(ValueError, match="kprime"):
        registry.create("persched", {"kprime": 0.5})


def test_periodic_jobs_get_the_patterns_windows_and_the_others_the_reserve() -> None:
    policy = PerSchedLive(PerSchedLive.Params(kprime=2))
    v = view(ALL, PERIODIC)
    decision = decide(policy, v)
    assert not decision.clamped
    assert set(decision.schedules) == {"p1", "p2", "p3"}
    installed = policy.installed
    assert installed is not None and installed.computed.result is not None
    result = installed.computed.result
    platform = Platform(B=0.9 * B / GB, b=b / GB)
    assert validate(result.pattern, platform, sys_eff=result.sys_eff) == []
    for job_id, schedule in decision.schedules.items():
        assert schedule.origin == v.now
        assert schedule.period == pytest.approx(result.period)
        assert schedule.problem() is None
        # every instance moves at least vol_io (the headroom)
        n = installed.computed.instances(job_id)
        assert schedule.mean_rate() * schedule.period >= n * PERIODIC[job_id][2]
        assert decision.rates[job_id] == pytest.approx(schedule.mean_rate())
    assert decision.rates["np"] == pytest.approx(0.1 * B)
    # Σ of the windows' rates at every instant stays within B less the reserve
    for t in [i * result.period / 500 for i in range(500)]:
        total = sum(
            w.rate
            for s in decision.schedules.values()
            for w in s.windows
            if w.start <= t < w.end or w.start <= t + s.period < w.end
        )
        assert total <= 0.9 * B * (1 + 1e-9)


def test_the_origin_stays_while_the_pattern_does() -> None:
    policy = PerSchedLive(PerSchedLive.Params(kprime=2))
    first = decide(policy, view(ALL, PERIODIC, now=10.0)).schedules
    later = decide(policy, view({"p1": 2, "np": 1}, PERIODIC, now=12.5)).schedules
    assert later["p1"] == first["p1"]
    assert policy.recomputations == 1


def test_without_periodic_jobs_it_is_fair_share_on_all_of_b() -> None:
    policy = PerSchedLive()
    decision = decide(policy, view({"a": 1, "b": 4}, {}))
    assert decision.schedules == {}
    fair = decide(default_registry().create("fair-share"), view({"a": 1, "b": 4}, {}))
    assert decision.rates == fair.rates


def test_off_the_decision_path_the_old_pattern_holds_and_newcomers_share_the_reserve() -> None:
    policy = PerSchedLive(PerSchedLive.Params(kprime=2))
    offload = Deferred()
    policy.use_offload(offload)
    two = {k: PERIODIC[k] for k in ("p1", "p2")}
    # The first pattern is computing: everybody shares the reserve meanwhile.
    d = decide(policy, view({"p1": 2, "p2": 2}, two))
    assert d.schedules == {} and len(offload.queued) == 1
    assert sum(d.rates.values()) == pytest.approx(0.1 * B)
    offload.run()
    d = decide(policy, view({"p1": 2, "p2": 2}, two, now=11.0))
    assert set(d.schedules) == {"p1", "p2"}
    old = dict(d.schedules)
    # p3 arrives: a recomputation starts; p1 and p2 keep their windows, p3 gets the reserve.
    d = decide(policy, view(ALL, PERIODIC, now=12.0))
    assert len(offload.queued) == 1
    assert d.schedules == old
    assert d.rates["p3"] + d.rates["np"] == pytest.approx(0.1 * B)
    # Another decision while it computes starts nothing more.
    decide(policy, view(ALL, PERIODIC, now=12.1))
    assert len(offload.queued) == 1
    offload.run()
    d = decide(policy, view(ALL, PERIODIC, now=13.0))
    assert set(d.schedules) == {"p1", "p2", "p3"}
    assert all(s.origin == 13.0 for s in d.schedules.values())


def test_a_result_for_a_set_that_changed_meanwhile_is_dropped_and_recomputed() -> None:
    policy = PerSchedLive(PerSchedLive.Params(kprime=2))
    offload = Deferred()
    policy.use_offload(offload)
    decide(policy, view(ALL, PERIODIC))
    gone = {k: PERIODIC[k] for k in ("p1", "p3")}  # p2 left while the pattern was computed
    offload.run()
    d = decide(policy, view({"p1": 2, "p3": 1}, gone, now=11.0))
    assert d.schedules == {} and policy.installed is None
    assert len(offload.queued) == 1  # the recomputation for {p1, p3}
    offload.run()
    d = decide(policy, view({"p1": 2, "p3": 1}, gone, now=12.0))
    assert set(d.schedules) == {"p1", "p3"}


def test_a_transfer_below_a_patterns_resolution_is_left_to_the_reserve() -> None:
    key = ((("tiny", 1, 0.1, 1000.0), ("p1", 2, 0.2, 3 * MiB)), B, b)
    computed = compute(key, PerSchedLive.Params(kprime=2))
    assert computed.error is None
    assert set(computed.schedules) == {"p1"}


def test_windows_are_well_formed_after_wrapping_and_float_residue() -> None:
    period = 1.0
    windows = windows_of([(0.9, 1.2, 1e-3), (1.2 - 1e-15, 1.5, 2e-3), (0.5, 0.7, 1e-3)], period)
    spans = [(w.start, w.end, w.rate) for w in windows]
    from burstctl.common.limits import windows_problem

    assert windows_problem(period, spans) is None
    assert sum((e - s) * r for s, e, r in spans) == pytest.approx(
        (0.3e-3 + 0.3e-3 * 2 + 0.2e-3) * GB
    )


def jupiter_key(n: int, reserve: float) -> Key:
    """Jupiter set ``n`` as the live policy's periodic jobs: β nodes of b = the set's b, and
    B = the set's B once the reserve is set aside."""
    app_set = jupiter_set(n)
    platform = app_set.platform
    jobs = tuple(sorted((a.name, int(a.beta), a.w, a.vol_io * GB) for a in app_set.apps))
    return jobs, platform.B * GB / (1.0 - reserve), platform.b * GB


@pytest.mark.parametrize("kprime", [2.0, 10.0])
def test_every_job_of_jupiter_set_1_gets_a_window_every_period(kprime: float) -> None:
    params = PerSchedLive.Params(kprime=kprime, headroom=0.0)
    key = jupiter_key(1, params.reserve)
    app_set = jupiter_set(1)
    # From the paper's T_min, max_k (w + time_io), one application gets no instance.
    paper = persched(app_set.apps, app_set.platform, kprime=kprime)
    assert min(paper.pattern.counts()) == 0
    computed = compute(key, params)
    assert computed.error is None and computed.result is not None
    assert computed.result.t_min == pytest.approx(
        sum(a.vol_io for a in app_set.apps) / app_set.platform.B
    )
    assert set(computed.schedules) == {a.name for a in app_set.apps}
    for job_id, schedule in computed.schedules.items():
        assert computed.instances(job_id) >= 1
        assert schedule.problem() is None and schedule.windows
    assert (
        validate(computed.result.pattern, app_set.platform, sys_eff=computed.result.sys_eff) == []
    )


def test_a_pattern_that_leaves_a_job_out_is_searched_again_from_a_longer_t_min() -> None:
    # From the first T_min with K' = 1, p2 gets no instance (found by a search over random
    # sets); the search from a longer T_min gives every job one.
    apps = [App("p1", 1.7, 1.4, 1.0), App("p2", 1.1, 1.9, 1.0), App("p3", 1.1, 0.7, 1.0)]
    platform = Platform(B=1.0, b=1.0)
    first = persched(apps, platform, kprime=1.0, tmin=live_tmin(apps, platform))
    assert first.pattern.counts() == [1, 0, 2]
    params = PerSchedLive.Params(kprime=1.0, headroom=0.0)
    key = (tuple((a.name, 1, a.w, a.vol_io * GB) for a in apps), GB / 0.9, GB)
    computed = compute(key, params)
    assert computed.result is not None and computed.result.t_min > first.t_min
    assert all(computed.instances(a.name) >= 1 for a in apps)


def rate_at(schedule: Schedule, t: float) -> float:
    phase = (t - schedule.origin) % schedule.period
    return sum(
        w.rate
        for w in schedule.windows
        if w.start <= phase < w.end or w.start <= phase + schedule.period < w.end
    )


def test_a_window_its_job_leaves_unused_is_lent_to_the_reserve_until_its_end() -> None:
    policy = PerSchedLive(PerSchedLive.Params(kprime=2))
    base = decide(policy, view(ALL, PERIODIC, now=10.0)).schedules
    assert policy.installed is not None
    lender = base["p2"]
    window = lender.windows[0]
    opened = 10.0 + lender.period + window.start  # its window in the next period
    now = opened + 0.08
    # p2 computes through its window (no operation open); np (4 nodes) is in I/O
    v = view({"p1": 2, "p3": 1, "np": 4}, PERIODIC, now=now)
    d = decide(policy, v)
    assert not d.clamped
    borrowed = d.schedules["np"]
    kept = policy.between(v)["p2"]
    assert policy.between(v)["p1"] == base["p1"]
    end = opened + (window.end - window.start)
    assert d.period == pytest.approx(end - now)  # the loan's end
    # np gets the reserve and p2's window rate until the window's end, then the reserve
    assert rate_at(borrowed, now) == pytest.approx(0.1 * B + window.rate)
    assert rate_at(borrowed, end - 1e-6) == pytest.approx(0.1 * B + window.rate)
    assert rate_at(borrowed, end + 1e-6) == pytest.approx(0.1 * B)
    assert rate_at(kept, now) == 0.0 and rate_at(kept, opened + 1e-3) == window.rate
    # Σ of the rates every session may pace at, at every instant of two periods: within B
    held = {"p1": d.schedules["p1"], "p2": kept, "p3": d.schedules["p3"], "np": borrowed}
    for i in range(2000):
        t = now + i * 2 * lender.period / 2000
        assert sum(rate_at(s, t) for s in held.values()) <= B * (1 + 1e-9), t
    # At the window's end the loan is over: np back to a plain rate, p2 holds its pattern.
    after = view({"p1": 2, "p3": 1, "np": 4}, PERIODIC, now=end + 1e-6)
    d = decide(policy, after)
    assert "np" not in d.schedules and d.rates["np"] == pytest.approx(0.1 * B)
    assert policy.between(after)["p2"] == base["p2"]
    # A lender back in I/O within its window gets it back at once: no loan.
    back = view(ALL, PERIODIC, now=now)
    d = decide(policy, back)
    assert d.schedules["p2"] == base["p2"] and "np" not in d.schedules


def test_nothing_is_lent_without_a_job_to_lend_to_nor_before_the_grace() -> None:
    policy = PerSchedLive(PerSchedLive.Params(kprime=2, lend_grace=0.02))
    base = decide(policy, view(ALL, PERIODIC, now=10.0)).schedules
    window = base["p2"].windows[0]
    opened = 10.0 + base["p2"].period + window.start
    alone = view({"p1": 2, "p3": 1}, PERIODIC, now=opened + 0.05)
    d = decide(policy, alone)
    assert policy.between(alone)["p2"] == base["p2"] and d.period is None
    early = view({"p1": 2, "p3": 1, "np": 1}, PERIODIC, now=opened + 0.01)
    d = decide(policy, early)
    assert "np" not in d.schedules and policy.between(early)["p2"] == base["p2"]
    assert d.period is not None and d.period <= 0.01 + 1e-9  # decides again at the grace
    off = PerSchedLive(PerSchedLive.Params(kprime=2, lend=False))
    decide(off, view(ALL, PERIODIC, now=10.0))
    late = view({"p1": 2, "p3": 1, "np": 1}, PERIODIC, now=opened + 0.05)
    assert "np" not in decide(off, late).schedules


def test_nothing_is_lent_on_a_merged_view_of_several_replicas() -> None:
    """A merged view's now is its exchange, not a time the windows run by: the reserve's jobs
    get the reserve there, loans or not (they are each replica's own decisions')."""

    def merged(active: dict[str, int], now: float) -> SystemView:
        own = view(active, PERIODIC, now=now)
        return views.view(
            *own.jobs.values(), capacity=B, node_bandwidth=b, now=now,
            periodic=own.periodic, observed=False,
        )  # fmt: skip

    for make in (lambda a, t: view(a, PERIODIC, now=t), merged):
        policy = PerSchedLive(PerSchedLive.Params(kprime=2))
        base = decide(policy, make(ALL, 10.0)).schedules
        window = base["p2"].windows[0]
        now = 10.0 + base["p2"].period + window.start + 0.08  # as in the loan test above
        d = decide(policy, make({"p1": 2, "p3": 1, "np": 4}, now))
        lent = "np" in d.schedules
        assert lent is (make is not merged)
        if not lent:
            assert d.rates["np"] == pytest.approx(0.1 * B)
