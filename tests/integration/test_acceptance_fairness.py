"""Statistical-token fair sharing, live: ThemisIO's experiments at small scale.

A real controller process (B = 50 MiB/s, caps that never bind) and real client
sessions on loopback, each job's threads acquiring flat out; the scenarios and
the sampler are ``bench/fairness.py``'s, so the benchmark and these tests
measure the same thing. Targets are the paper's exact shares, written out in
the scenarios, not computed by the policy under test. Run with ``-s`` to see
the measured figures.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from fairness import SCENARIOS, Run, controller_args, run_scenario

WITHIN = 0.03


def run(controller_factory, name: str) -> Run:  # type: ignore[no-untyped-def]
    scenario = SCENARIOS[name]
    ctl = controller_factory(*controller_args(scenario.policy))
    result = run_scenario(scenario, ctl.address)
    print(json.dumps(result.summary()))
    assert result.errors == {}, "acquire raised into the application"
    return result


def steady_shares(result: Run) -> dict[str, float]:
    start, end = result.scenario.contention
    return result.shares(start + 1.0, end - 0.05)


def assert_targets(result: Run) -> dict[str, float]:
    shares = steady_shares(result)
    for job, target in result.scenario.targets.items():
        assert shares[job] == pytest.approx(float(target), rel=WITHIN), job
    return shares


def per_user(result: Run, shares: dict[str, float]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for spec in result.scenario.jobs:
        totals[spec.user] += shares[spec.job_id]
    return totals


@pytest.mark.parametrize("name", ["size-fair-4v1", "job-fair-4v1"])
def test_4v1_shares_during_contention_and_alone(controller_factory, name: str) -> None:
    result = run(controller_factory, name)
    shares = assert_targets(result)  # size-fair 4:1, job-fair 1:1
    ratio = shares["A"] / shares["B"]
    assert ratio == pytest.approx(4.0 if name.startswith("size") else 1.0, rel=WITHIN)
    # A alone (before B joins, and after B leaves) gets the whole burst buffer
    assert result.rates(0.5, 1.5)["A"] >= 0.97 * 50 * 2**20
    assert result.rates(5.0, 5.95)["A"] >= 0.97 * 50 * 2**20


def test_user_fair_user_totals_equal_and_jobs_equal_within_user(controller_factory) -> None:
    result = run(controller_factory, "user-fair")
    shares = assert_targets(result)
    users = per_user(result, shares)
    assert users["u1"] == pytest.approx(users["u2"], rel=WITHIN)
    assert shares["u1a"] == pytest.approx(shares["u1b"], rel=WITHIN)


def test_user_then_size_fair_figure_9(controller_factory) -> None:
    result = run(controller_factory, "user-size-fair")
    shares = assert_targets(result)
    users = per_user(result, shares)
    assert users["ua"] == pytest.approx(users["ub"], rel=WITHIN)
    assert shares["a2"] / shares["a1"] == pytest.approx(2.0, rel=WITHIN)  # sizes 2 : 1
    assert shares["b6"] / shares["b4"] == pytest.approx(1.5, rel=WITHIN)  # sizes 6 : 4


def test_group_user_size_fair_figure_11(controller_factory) -> None:
    result = run(controller_factory, "group-user-size-fair")
    shares = steady_shares(result)
    for job, target in result.scenario.targets.items():
        assert shares[job] == pytest.approx(float(target), rel=WITHIN), job
        assert abs(shares[job] - float(target)) <= 0.01, job
    groups: dict[str, float] = defaultdict(float)
    for spec in result.scenario.jobs:
        groups[spec.group] += shares[spec.job_id]
    assert groups["g1"] == pytest.approx(0.5, abs=0.01)  # the paper measured 46/54
