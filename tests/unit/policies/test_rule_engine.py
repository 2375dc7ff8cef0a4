"""Operator rules inside a policy (policies/rules.py): reservations first, the policy shares
the rest, weights scale the shares, limits clamp; nothing unused is withheld."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.views import job, view

from burstctl.policies.decision import blend, decide
from burstctl.policies.fair_share import FairShare
from burstctl.policies.fcfs import Fcfs
from burstctl.policies.rules import Bindings, Terms, budgets
from burstctl.policies.statistical_tokens import SizeFair


def bind(rule_of: dict[str, Terms], budgets: dict[str, float] | None = None) -> Bindings:
    return Bindings(rule_of, {t.name: t for t in rule_of.values()}, budgets or {})


def greedy(n: int, cap: float = 100.0, **kw: float) -> list:
    return [job(f"j{i}", cap, index=i, **kw) for i in range(n)]


def rates(policy, v, rules) -> dict[str, float]:
    return decide(policy, v, rules=rules).rates


def test_a_reservation_gets_its_amount_and_the_others_share_the_rest() -> None:
    v = view(*greedy(5), capacity=60.0)
    r = rates(FairShare(), v, bind({"j0": Terms("R", reservation=30.0)}))
    assert r["j0"] == pytest.approx(30.0)
    assert [r[f"j{i}"] for i in range(1, 5)] == pytest.approx([7.5] * 4)


def test_a_reservation_below_the_share_changes_nothing() -> None:
    v = view(*greedy(5), capacity=60.0)
    plain = rates(FairShare(), v, None)
    assert rates(FairShare(), v, bind({"j0": Terms("R", reservation=5.0)})) == plain


def test_a_reservation_is_held_to_its_demand_and_the_rest_is_not_withheld() -> None:
    jobs = [job("j0", 100.0, 4.0, index=0), *greedy(3)[1:]]
    r = rates(FairShare(), view(*jobs, capacity=60.0), bind({"j0": Terms("R", reservation=30.0)}))
    assert r["j0"] == pytest.approx(4.0)
    assert r["j1"] + r["j2"] == pytest.approx(56.0)


def test_a_limit_caps_the_set_and_frees_capacity_for_the_others() -> None:
    u = Terms("u-cap", limit=10.0)
    v = view(*greedy(4), capacity=60.0)
    r = rates(FairShare(), v, bind({"j0": u, "j1": u}))
    assert r["j0"] + r["j1"] == pytest.approx(10.0)
    assert r["j2"] == r["j3"] == pytest.approx(25.0)


def test_a_limit_under_fcfs_frees_what_it_holds_back_for_later_jobs() -> None:
    v = view(*greedy(3), capacity=60.0)
    assert rates(Fcfs(), v, None) == {"j0": 60.0}
    r = rates(Fcfs(), v, bind({"j0": Terms("first", limit=20.0)}))
    assert r["j0"] == pytest.approx(20.0) and r["j1"] == pytest.approx(40.0)


def test_weights_scale_the_policys_shares() -> None:
    v = view(*greedy(3), capacity=60.0)
    r = rates(FairShare(), v, bind({"j0": Terms("heavy", weight=2.0)}))
    assert r["j0"] == pytest.approx(30.0) and r["j1"] == r["j2"] == pytest.approx(15.0)
    # a weighted job that wants less leaves the rest to the others
    jobs = [job("j0", 100.0, 10.0, index=0), *greedy(3)[1:]]
    r = rates(FairShare(), view(*jobs, capacity=60.0), bind({"j0": Terms("h", weight=4.0)}))
    assert r["j0"] == pytest.approx(10.0) and r["j1"] == r["j2"] == pytest.approx(25.0)


def test_reservations_above_capacity_are_scaled_down_to_it() -> None:
    a, b = Terms("a", reservation=50.0), Terms("b", reservation=50.0)
    bindings = bind({"j0": a, "j1": b})
    v = view(*greedy(3), capacity=60.0)
    assert bindings.overcommitted(v) == pytest.approx(100.0)
    r = rates(FairShare(), v, bindings)
    assert r["j0"] == r["j1"] == pytest.approx(30.0) and r.get("j2", 0.0) == 0.0
    assert sum(r.values()) <= 60.0 * (1 + 1e-9)


def test_a_reservation_and_a_limit_together() -> None:
    reserved, limited = Terms("R", reservation=30.0), Terms("L", limit=2.0)
    v = view(*greedy(5), capacity=60.0)
    r = rates(FairShare(), v, bind({"j0": reserved, "j1": limited}))
    assert r["j0"] == pytest.approx(30.0) and r["j1"] == pytest.approx(2.0)
    assert [r["j2"], r["j3"], r["j4"]] == pytest.approx([28.0 / 3] * 3)


def test_a_reservation_pin_is_released_when_a_limit_frees_enough() -> None:
    # R's reservation (15) is above its fair share of 5 jobs (12) but below its share once
    # the limited three are held to 1 each (28.5): it gets the share, not the reservation.
    lim = Terms("L", limit=3.0)
    bindings = bind({"j0": Terms("R", reservation=15.0), "j1": lim, "j2": lim, "j3": lim})
    r = rates(FairShare(), view(*greedy(5), capacity=60.0), bindings)
    assert r["j1"] + r["j2"] + r["j3"] == pytest.approx(3.0)
    assert r["j0"] == pytest.approx(28.5) and r["j4"] == pytest.approx(28.5)


def test_rules_apply_inside_a_statistical_token_policy() -> None:
    jobs = [job(f"j{i}", 100.0, index=i, nodes=n) for i, n in enumerate((3, 1, 1))]
    v = view(*jobs, capacity=60.0, node_bandwidth=100.0)
    r = rates(SizeFair(), v, bind({"j0": Terms("big", limit=12.0)}))
    assert r["j0"] == pytest.approx(12.0) and r["j1"] == r["j2"] == pytest.approx(24.0)


def test_blend_clamps_a_rule_to_its_budget_on_this_replica() -> None:
    u = Terms("u", limit=10.0)
    v = view(*greedy(3), capacity=60.0)
    bindings = bind({"j0": u, "j1": u}, budgets={"u": 4.0})
    got = blend(FairShare(), v, {"j0": 20.0, "j1": 20.0, "j2": 20.0}, bindings)
    assert got["j0"] + got["j1"] == pytest.approx(4.0) and got["j2"] == pytest.approx(20.0)


@given(
    caps=st.lists(st.floats(1.0, 100.0), min_size=1, max_size=7),
    demands=st.lists(st.floats(0.0, 120.0), min_size=7, max_size=7),
    rule_of=st.lists(st.sampled_from(["", "a", "b"]), min_size=7, max_size=7),
    limit=st.floats(0.5, 80.0),
    reservation=st.floats(0.0, 90.0),
    weight=st.floats(0.25, 4.0),
    capacity=st.floats(10.0, 150.0),
)
def test_bounds_hold_for_any_rules(caps, demands, rule_of, limit, reservation, weight, capacity):
    jobs = [job(f"j{i}", c, demands[i], index=i) for i, c in enumerate(caps)]
    terms = {"a": Terms("a", limit=limit, weight=weight), "b": Terms("b", reservation=reservation)}
    bindings = bind({f"j{i}": terms[n] for i, n in enumerate(rule_of[: len(caps)]) if n})
    v = view(*jobs, capacity=capacity, node_bandwidth=100.0)
    r = rates(FairShare(), v, bindings)
    assert sum(r.values()) <= capacity * (1 + 1e-9)
    for j in jobs:
        assert r.get(j.job_id, 0.0) <= min(j.cap, j.demand) * (1 + 1e-9)
    in_a = [j.job_id for j in jobs if bindings.rule_of.get(j.job_id, Terms("")).name == "a"]
    assert sum(r.get(j, 0.0) for j in in_a) <= limit * (1 + 1e-6)
    in_b = [j for j in jobs if bindings.rule_of.get(j.job_id, Terms("")).name == "b"]
    want_b = min(reservation, sum(min(j.cap, j.demand) for j in in_b), capacity)
    assert sum(r.get(j.job_id, 0.0) for j in in_b) >= want_b * (1 - 1e-6)
    # work-conserving except what the limit holds back
    wanted = sum(min(j.cap, j.demand) for j in jobs)
    held = max(0.0, sum(min(j.cap, j.demand) for j in jobs if j.job_id in in_a) - limit)
    assert sum(r.values()) >= min(capacity, wanted - held) * (1 - 1e-6)


def test_the_budgets_of_all_replicas_sum_to_the_limit() -> None:
    u = Terms("u", limit=10.0)
    bindings = bind({"a": u, "b": u})
    rates = {"a": 6.0, "c": 30.0}  # the global decision: u's set uses 6 of its 10
    r1 = budgets(bindings, rates, {"a": 4.0, "c": 30.0}, 40.0, 60.0)
    r2 = budgets(bindings, rates, {"a": 2.0}, 20.0, 60.0)
    assert r1["u"] == pytest.approx(4.0 + 4.0 * 40 / 60)
    assert r1["u"] + r2["u"] == pytest.approx(10.0)
