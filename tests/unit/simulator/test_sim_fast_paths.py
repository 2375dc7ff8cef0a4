"""The fluid loop's fast paths keep the reference's arithmetic bit for bit.

The loop moves only what can change at each step (served I/O applications,
work phases in closed form, the reference's per-step update otherwise), so these tests pin
it to the literal, step-by-step oracle ``tests/reference/simu.py`` with *exact*
equality where the two do the same float operations, and check the arithmetic
claims of ``_closed_form_is_exact`` directly. And the views it decides on are what a
policy expects, read as columns or as ``JobView`` rows.
"""

from __future__ import annotations

import math
import random
from typing import Any, Literal

import pytest
from reference import simu
from test_reference_agreement import POLICIES, heterogeneous

from burstctl.policies import JobId, SystemView
from burstctl.policies.base import Policy
from burstctl.policies.greedy import GreedyYield
from burstctl.policies.view import RowRates
from burstctl.simulator.bws.fluid import _closed_form_is_exact, _next_power_of_two
from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import format_instance, parse_instance, prepare_window
from burstctl.simulator.bws.runs import SimResult, simulate

# Set10Learn's running mean of ω is summed in another order by the oracle, so its
# metrics agree to ~1e-15 only (test_reference_agreement covers it).
SAME_ARITHMETIC = [h for h in POLICIES if h != "Set10Learn"]


@pytest.mark.parametrize("heuristic", SAME_ARITHMETIC)
@pytest.mark.parametrize("seed", range(4))
def test_synthetic_runs_match_the_step_by_step_oracle_exactly(heuristic: str, seed: int) -> None:
    # h = 2,000–20,000: hundreds of phases per application, so most work phases go
    # through the closed form, its rebasing at powers of two, and late promotion
    pressure = (0.5, 0.8, 1.1, 1.1)[seed]
    horizon = (2_000.0, 20_000.0)[seed % 2]
    text = format_instance(generate(GeneratorParams(pressure=pressure, horizon=horizon), seed))
    for v2 in (False, True):
        ref = simu.simulate(text, heuristic, v2=v2)
        ours = simulate(
            prepare_window(parse_instance(text)),
            POLICIES[heuristic],
            windows="v2" if v2 else "v1",
        )
        assert ours.events == ref.events
        assert ours.min_yield == ref.min_yield  # same floats, not merely close
        # the oracle sums Σ b·P plainly, the loop with fsum
        assert ours.efficiency == pytest.approx(ref.efficiency, rel=1e-14, abs=1e-15)


@pytest.mark.parametrize("heuristic", SAME_ARITHMETIC)
def test_heterogeneous_runs_match_the_step_by_step_oracle_exactly(heuristic: str) -> None:
    # pre-window age and progress (P above t), b_i ≠ B, I/O-first phases, cut windows
    for seed in range(8):
        rng = random.Random(seed)
        window = rng.choice([1.0, 0.6, 0.3])
        text = heterogeneous(seed, m=rng.randint(2, 10))
        for v2 in (False, True):
            ref = simu.simulate(text, heuristic, win_len=window, B=4.0, v2=v2)
            ours = simulate(
                prepare_window(parse_instance(text), window=window, bandwidth=4.0),
                POLICIES[heuristic],
                windows="v2" if v2 else "v1",
            )
            assert ours.events == ref.events
            assert ours.min_yield == ref.min_yield


def _steps(rng: random.Random, start: float, end: float) -> list[float]:
    """Increasing event times in (start, end], ending at end, as the loop takes them."""
    times = sorted(rng.uniform(start, end) for _ in range(rng.randint(0, 40)))
    return [*times, end]


@pytest.mark.parametrize("seed", range(10))
def test_closed_form_is_the_per_step_arithmetic(seed: int) -> None:
    """Where ``_closed_form_is_exact(s, q, p)`` holds, Q − (t − s) and P + (t − s) equal
    the reference's Q −= Δ, P += Δ at every step; past the step that takes P to its
    next power of two, only if the closed form is restarted there (``_rebase``)."""
    rng = random.Random(seed)
    checked = crossed = 0
    while checked < 300:
        s = 10.0 ** rng.uniform(-2.0, 7.0)
        q = s * rng.choice([rng.uniform(0.0, 1.0), rng.uniform(0.999, 1.0), 1e-12])
        p = rng.choice([0.0, rng.uniform(0.0, s), s * rng.uniform(0.9, 1.0)])
        if not _closed_form_is_exact(s, q, p):
            continue
        checked += 1
        q_step, p_step = q, p  # the reference
        base, q_base, p_base = s, q, p  # the closed form, rebased at the crossing
        t = s
        for now in _steps(rng, s, s + q):
            dt = now - t
            q_step -= dt
            p_step += dt
            assert q_base - (now - base) == q_step
            assert p_base + (now - base) == p_step
            if p_base + (now - base) >= _next_power_of_two(p_base):  # the crossing step
                p_base += now - base
                q_base -= now - base
                base = now
                crossed += 1
            t = now
    assert crossed > 0  # the rebasing was exercised


def test_closed_form_test_rejects_what_it_cannot_prove() -> None:
    assert not _closed_form_is_exact(0.0, 1.0, 0.0)  # t = 0: steps do not stay exact
    assert not _closed_form_is_exact(10.0, 10.5, 0.0)  # longer than the time elapsed
    assert not _closed_form_is_exact(1e6, 1e-12, 0.0)  # below ulp(s): residue unrepresentable
    assert not _closed_form_is_exact(1.0, 0.5, 4.0)  # P on a coarser grid than t
    assert _closed_form_is_exact(10.0, 10.0, 9.0)
    assert not _closed_form_is_exact(10.0, math.inf, 0.0)  # computing until T


class _Checking(GreedyYield):
    """GreedyYield, checking each view the loop builds."""

    name = "checking"

    def allocate(self, view: SystemView) -> RowRates:
        assert view.observed and view.horizon is not None
        # the loop lists A in index order, every job active: the stable order
        assert view.active_jobs() == list(view.jobs.values())
        assert list(view.active) == list(view.rows) == [j.index for j in view.active_jobs()]
        return super().allocate(view)


class _ByRows(Policy):
    """GreedyYield written over the ``JobView`` rows, as a policy that reads objects is:
    the rows the loop builds from its columns must give it GreedyYield's decisions."""

    name = "by-rows"

    def allocate(self, view: SystemView) -> dict[JobId, float]:
        order = sorted(view.active_jobs(), key=lambda j: (j.yield_at(view.now), j.index))
        rates, left = {}, view.capacity
        for job in order:
            if not left > 0.0:
                break
            rates[job.job_id] = give = min(job.demand, left)
            left -= give
        return rates


def _same_run(one: SimResult, other: SimResult) -> None:
    """Every metric equal, not merely close (the wall time aside)."""
    ours = one.as_dict() | {"policy": None, "wall_seconds": None}
    assert ours == other.as_dict() | {"policy": None, "wall_seconds": None}


def _windows() -> list[Any]:
    synthetic = [
        prepare_window(generate(GeneratorParams(pressure=pressure, horizon=horizon), seed))
        for seed, (pressure, horizon) in enumerate([(0.5, 2_000.0), (1.1, 20_000.0), (1.4, 1e5)])
    ]
    # b_i ≠ B (some above B, clipped), pre-window age and progress, I/O-first, cut windows
    heterogeneous_ = [
        prepare_window(parse_instance(heterogeneous(seed, m=2 + seed)), window=cut, bandwidth=4.0)
        for seed, cut in enumerate([1.0, 0.6, 0.3, 1.0, 0.6, 0.3, 1.0, 0.6])
    ]
    return synthetic + heterogeneous_


@pytest.mark.parametrize("windows", ["v1", "v2"])
def test_the_loops_views_are_what_the_policies_expect(windows: Literal["v1", "v2"]) -> None:
    for window in _windows():
        expected = simulate(window, "greedy-yield", windows=windows)
        _same_run(simulate(window, _Checking(), windows=windows), expected)
        # the JobView rows the loop builds from its columns, read as objects
        _same_run(simulate(window, _ByRows(), windows=windows), expected)
