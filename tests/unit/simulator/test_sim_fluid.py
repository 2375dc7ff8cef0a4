"""The event loop ([BWS-SIM] simu.cc: ``simulate``, v1/v2) and the metrics at T
([BWS] eqs. (8)–(10)).

Hand-computed instances with FCFS and FairShare, the paper's Example 2 ([BWS] §5, Figure 1)
for every strategy that is registered, and the loop's guards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from burstctl.policies import JobId, Policy, SystemView, default_registry
from burstctl.policies.fair_share import FairShare
from burstctl.policies.view import Columns
from burstctl.simulator.bws.columns import MeanVolume
from burstctl.simulator.bws.fluid import SimulationError
from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import Window, parse_instance, prepare_window
from burstctl.simulator.bws.runs import create_policy, simulate

REGISTERED = set(default_registry().names())


def window(text: str, **kwargs: float) -> Window:
    return prepare_window(parse_instance(text), **kwargs)


# ---------------------------------------------------------------------------
# [BWS] §5, Example 2 (Figure 1): m = 10, ε = 1/5, window [0, 1], B = b_i = 1.
# A: I/O 2/m, then work (1 in the paper; 0.8 reaches T = 1, identical in the window).
# B: I/O 2/m, work α = ε/(m/2 − 1) = 0.05, I/O 1.

A_LINE = "A{k} 1 0 0 0 2 0 C 0.2 0.8"
B_LINE = "B{k} 1 0 0 0 3 0 C 0.2 0.05 1"


def example2(first: str) -> Window:
    a = [A_LINE.format(k=k) for k in range(1, 6)]
    b = [B_LINE.format(k=k) for k in range(1, 6)]
    win = window("\n".join(a + b if first == "A" else b + a))
    assert win.horizon == 1.0
    return win


EXAMPLE2 = [
    ("fair-share", "A", (0.1, 0.1, 0.0)),
    ("fair-share", "B", (0.1, 0.1, 0.0)),
    ("fcfs", "A", (0.0, 0.3, 0.2)),
    ("fcfs", "B", (0.0, 0.12, 0.02)),
    # [BWS] §5: with A-first ids these reproduce FCFS's row
    ("greedy-yield", "A", (0.0, 0.3, 0.2)),
    ("greedy-com", "A", (0.0, 0.3, 0.2)),
    ("look-ahead-greedy-yield", "A", (0.0, 0.3, 0.2)),
    ("set-10", "A", (0.0, 0.3, 0.2)),
]


@pytest.mark.parametrize(
    ("policy", "first", "expected"),
    [
        pytest.param(
            p,
            f,
            e,
            id=f"{p}-{f}-first",
            marks=()
            if p in REGISTERED
            else pytest.mark.skip(reason=f"policy {p!r} is not registered yet"),
        )
        for p, f, e in EXAMPLE2
    ],
)
def test_example_2(policy: str, first: str, expected: tuple[float, float, float]) -> None:
    result = simulate(example2(first), policy)
    got = (result.min_yield, result.efficiency, result.utilization)
    assert got == pytest.approx(expected, abs=1e-12)
    # the reference truncates every work credit to an integer: 0 on a [0, 1] window
    assert result.utilization_reference == 0.0


def test_example_2_fcfs_b_first_events() -> None:
    # B_k complete at 0.2k; B_1..B_4's work ends at 0.2k + 0.05: 4 + 4 decisions before T
    assert simulate(example2("B"), "fcfs").events == 9


# ---------------------------------------------------------------------------
# Tiny hand-computed instances

# X: I/O 1 then work 1 (S = 2); Y: I/O 1 then work 2 (S = 3) → T = 2
TWO = "X 1 0 0 0 2 0 C 1 1\nY 1 0 0 0 2 0 C 1 2\n"


def test_fcfs_serves_by_index_on_equal_post_times() -> None:
    r = simulate(window(TWO), "fcfs")
    # X transfers on [0, 1] and works on [1, 2]; Y transfers on [1, 2]
    assert (r.min_yield, r.efficiency, r.utilization) == pytest.approx((0.5, 0.75, 0.25))
    assert r.events == 2 and r.horizon == 2.0 and r.pressure == pytest.approx(1.0)
    # the reference credits X's work from the start of its last step: trunc(1 − t_c) = 1
    assert r.utilization_reference == pytest.approx(0.25)


def test_fair_share_splits_and_completes_together() -> None:
    r = simulate(window(TWO), "fair-share")
    assert (r.min_yield, r.efficiency, r.utilization, r.events) == pytest.approx((0.5, 0.5, 0, 1))


def test_fair_share_scales_caps_below_b() -> None:
    # three caps of 5 on B = 10 (b_i = 0.5): α = min(1, 1/1.5), β = 1/3 each;
    # volume 5 (0.5 normalised) ends at 1.5, then work until T = 2
    text = "".join(f"a{k} 5 0 0 0 2 0 C 5 1\n" for k in range(3))
    r = simulate(window(text, bandwidth=10), "fair-share")
    assert (r.min_yield, r.efficiency, r.utilization) == pytest.approx((0.75, 0.75, 0.25))


def test_age_and_progress_count_in_yield_and_efficiency() -> None:
    # released 4 s before 0 with 1 s of progress; works [0, 2], transfers [2, 4]
    r = simulate(window("a 1 4 1 0 2 0 W 2 2\n"), "fcfs")
    assert r.min_yield == pytest.approx((1 + 4) / (4 + 4))  # eq. (8): P(T)/(T − τ)
    assert r.efficiency == pytest.approx((5 - 1) / 4)  # (Σ b P(T) − E₀)/(T Σ b)
    assert r.utilization == pytest.approx(2 / 4)  # eq. (9)
    assert r.utilization_reference == 0.0  # the work ends in the first step: no credit


def test_v2_runs_fair_share_first_then_the_policy() -> None:
    r = simulate(window(TWO), "fcfs", windows="v2")
    # [0, 1): FairShare, both at 0.5; forced event at t_c = 1; then FCFS: X ends at 1.5
    assert r.events == 3
    assert r.min_yield == pytest.approx(0.5)  # whole history
    assert r.efficiency == pytest.approx((2.5 - 1.0) / (1 * 2))  # over [s, T] = [1, 2]
    assert r.utilization == pytest.approx(0.5 / (1 * 2))


class _Ticking(FairShare):
    name = "ticking"

    def period(self, view: SystemView) -> float | None:
        return 0.25


class _Greedy(Policy):
    name = "too-greedy"

    def allocate(self, view: SystemView) -> Mapping[JobId, float]:
        return {j: 2 * v.cap for j, v in view.jobs.items()}


class _Idle(Policy):
    name = "idle"

    def allocate(self, view: SystemView) -> Mapping[JobId, float]:
        return {}


def test_period_adds_decisions() -> None:
    r = simulate(window(TWO), _Ticking())
    assert r.events == 8  # t = 0, 0.25, …, 1.75
    assert (r.min_yield, r.efficiency) == pytest.approx((0.5, 0.5))


def test_rate_above_cap_is_an_error() -> None:
    with pytest.raises(SimulationError, match="outside"):
        simulate(window(TWO), _Greedy())


def test_no_rates_runs_to_t() -> None:
    r = simulate(window(TWO), _Idle())
    assert (r.min_yield, r.efficiency, r.events) == (0.0, 0.0, 1)


def test_delta_parameter_comes_from_the_window() -> None:
    if "periodic-greedy-yield" not in REGISTERED:
        pytest.skip("periodic-greedy-yield is not registered yet")
    win = window(TWO)
    policy = create_policy("periodic-greedy-yield", win)
    assert policy.params.delta == win.delta  # type: ignore[attr-defined]
    r = simulate(win, "periodic-greedy-yield")
    assert r.events >= 2


def test_bad_windows_value() -> None:
    with pytest.raises(ValueError, match="windows"):
        simulate(window(TWO), "fcfs", windows="v3")  # type: ignore[arg-type]


def test_an_application_that_runs_out_of_phases_before_t_computes_until_t() -> None:
    """Kept phases reach T only up to rounding; one that ends a hair early must not
    stall the loop on zero-length phases (seen on a generated W = 0.5 instance)."""
    win = window("a 1 0 0 0 2 0 W 1 1\nb 1 0 0 0 1 0 W 2\n")
    short = dataclasses.replace(
        win.apps[0],
        phases=(
            win.apps[0].phases[0],
            dataclasses.replace(win.apps[0].phases[1], value=1.0 - 1e-9),
        ),
    )
    win = dataclasses.replace(win, apps=(short, win.apps[1]))
    r = simulate(win, "greedy-com")
    assert r.horizon == 2.0
    assert r.min_yield == pytest.approx(1.0)  # a: 1 of work, 1 − 1e-9 of I/O at full speed


class _Checking(FairShare):
    """Fair share that reads its jobs as ``JobView`` rows, twice per decision, and checks
    each against the row built afresh from the columns (the run keeps built rows)."""

    name = "checking"
    checked = 0

    def allocate(self, view: SystemView) -> Mapping[JobId, float]:
        columns = view.columns
        for job in (*view.active_jobs(), *view.jobs.values()):
            assert job == Columns.job(columns, job.index)
            self.checked += 1
        return super().allocate(view)


def test_the_jobview_rows_a_policy_reads_are_those_of_the_columns_now() -> None:
    """Rows built once are kept until the application is served or a phase ends;
    one kept past a change would differ from the columns. The mean past volume is
    the mean of the completed I/O phases."""
    win = prepare_window(generate(GeneratorParams(pressure=1.1), 3), window=0.02)
    policy = _Checking()
    ours = simulate(win, policy)
    theirs = simulate(win, "fair-share")
    assert (ours.min_yield, ours.efficiency, ours.utilization, ours.events) == (
        theirs.min_yield,
        theirs.efficiency,
        theirs.utilization,
        theirs.events,
    )
    assert policy.checked > 1000


def test_the_mean_past_volume_is_that_of_the_completed_io_phases() -> None:
    # a: I/O first (1, 2, 4 at phases 0, 2, 4); b: work first (1, 3 at phases 1, 3)
    phase = [0, 0]
    mean = MeanVolume([[1.0, 5.0, 2.0, 5.0, 4.0], [5.0, 1.0, 5.0, 3.0]], phase, [True, False])
    seen = []
    for k in range(5):
        phase[:] = [k, k]
        seen.append((mean[0], mean[1]))
    assert seen == [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (1.5, 1.0), (1.5, 2.0)]
