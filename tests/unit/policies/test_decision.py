"""``policies.decision``: what ``decide`` enforces on a policy's proposal."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from support.views import job

from burstctl.policies import JobId, Policy, SystemView
from burstctl.policies.decision import decide
from burstctl.policies.view import RowRates

VIEW = SystemView(
    now=0.0,
    capacity=100.0,
    node_bandwidth=50.0,
    jobs={"a": job("a", 50.0), "b": job("b", 50.0, index=1), "idle": job("idle", 50.0, 0.0)},
)


class _Proposing(Policy):
    """Proposes what it was given, by job id or by row."""

    name = "proposing"

    def __init__(self, proposal: Mapping[JobId, float] | RowRates) -> None:
        super().__init__()
        self.proposal = proposal

    def allocate(self, view: SystemView) -> Mapping[JobId, float] | RowRates:
        return self.proposal


def enforce(
    view: SystemView, proposal: Mapping[JobId, float] | RowRates
) -> tuple[dict[JobId, float], tuple[tuple[JobId, float], ...], bool]:
    """What ``decide`` makes of ``proposal``: the rates, the fixes, whether it scaled."""
    decision = decide(_Proposing(proposal), view)
    return decision.rates, decision.fixes, decision.scaled


def test_feasible_proposals_pass_unchanged_in_their_order() -> None:
    rates, fixes, scaled = enforce(VIEW, {"b": 30.0, "a": 50.0, "idle": 0.0})
    assert list(rates.items()) == [("b", 30.0), ("a", 50.0)]  # zeros are not listed
    assert fixes == () and not scaled


def test_proposals_by_row_are_those_of_the_views_rows() -> None:
    rows = VIEW.row_of
    decision = decide(_Proposing([(rows["b"], 30.0), (rows["a"], 50.0)]), VIEW)
    assert decision.served == [(rows["b"], 30.0), (rows["a"], 50.0)]
    assert decision.rates == {"b": 30.0, "a": 50.0} and not decision.clamped
    # the same bounds as by job id
    decision = decide(_Proposing([(rows["idle"], 10.0), (rows["a"], 80.0)]), VIEW)
    assert decision.rates == {"a": 50.0} and decision.fixes == (("idle", 10.0), ("a", 80.0))


@pytest.mark.parametrize(
    ("proposed", "rate"),
    [(-1.0, None), (math.nan, None), (math.inf, 50.0), (80.0, 50.0), (50.000001, 50.0)],
)
def test_a_rate_out_of_bounds_is_fixed_and_reported(proposed: float, rate: float | None) -> None:
    rates, fixes, scaled = enforce(VIEW, {"a": proposed})
    assert rates.get("a") == rate
    assert len(fixes) == 1 and fixes[0][0] == "a"
    assert fixes[0][1] == proposed or (math.isnan(fixes[0][1]) and math.isnan(proposed))
    assert not scaled


def test_a_job_without_demand_gets_nothing_and_unknown_jobs_are_ignored() -> None:
    rates, fixes, _ = enforce(VIEW, {"idle": 10.0, "ghost": 10.0, "a": 10.0})
    assert rates == {"a": 10.0}
    assert fixes == (("idle", 10.0),)


def test_a_sum_above_capacity_is_scaled_down() -> None:
    rates, fixes, scaled = enforce(VIEW, {"a": 50.0, "b": 50.0 + 1e-6})  # b above its cap
    assert scaled is False and rates["b"] == 50.0 and fixes == (("b", 50.0 + 1e-6),)
    crowded = SystemView(0.0, 60.0, 50.0, {"a": job("a", 50.0), "b": job("b", 50.0, index=1)})
    rates, fixes, scaled = enforce(crowded, {"a": 50.0, "b": 40.0})
    assert scaled and fixes == ()
    assert sum(rates.values()) == pytest.approx(60.0)
    assert rates["a"] / rates["b"] == pytest.approx(50.0 / 40.0)
    # within rounding of B: left alone
    _, _, scaled = enforce(crowded, {"a": 30.0, "b": 30.0 * (1 + 1e-12)})
    assert not scaled


class _Unruly(Policy):
    name = "unruly"

    def allocate(self, view: SystemView) -> Mapping[JobId, float]:
        return {j: 2 * v.cap for j, v in view.jobs.items()}

    def period(self, view: SystemView) -> float | None:
        return 0.5


def test_decide_enforces_and_carries_the_period() -> None:
    decision = decide(_Unruly(), VIEW)
    assert decision.rates == {"a": 50.0, "b": 50.0}
    assert decision.clamped and {j for j, _ in decision.fixes} == {"a", "b", "idle"}
    assert decision.period == 0.5
    assert "rates={'a': 50.0, 'b': 50.0}" in repr(decision)


def test_decide_with_targets_blends_and_still_enforces() -> None:
    # the split's targets cover a and b; a target above b_i is fixed by the blend itself
    decision = decide(_Unruly(), VIEW, {"a": 70.0, "b": 20.0})
    assert decision.rates == {"a": 50.0, "b": 50.0}  # capacity left goes to b's unmet demand
    assert sum(decision.rates.values()) <= VIEW.capacity
