"""FCFS, FairShare, the sharing helpers and the registry: exact expected values."""

from __future__ import annotations

import functools

import pytest
from support import views
from support.views import allocation, job

from burstctl.policies import PolicyRegistry, default_registry, job_cap
from burstctl.policies.fair_share import FairShare
from burstctl.policies.fcfs import Fcfs
from burstctl.policies.sharing import greedy_fill, water_fill, water_levels

MiB = float(1 << 20)


B = 40 * MiB
view = functools.partial(views.view, capacity=B, node_bandwidth=8 * MiB, now=10.0)


def on(nodes: int, b: float = 8 * MiB) -> dict[str, object]:
    """A job's nodes p_i and cap b_i = min(p_i·b, B) (eq. 1), as ``job`` keywords."""
    return {"nodes": nodes, "cap": job_cap(nodes, b, B)}


def test_fair_share_is_proportional_to_b_i() -> None:
    # eq. (1): b_i = 32 and 8 MiB/s; Σ = B so α = 1: each gets b_i, 4:1.
    rates = allocation(FairShare(), view(job("a", **on(4)), job("b", **on(1))))
    assert rates == {"a": 32 * MiB, "b": 8 * MiB}


def test_fair_share_with_every_b_i_equal_to_B_splits_evenly() -> None:
    b = 1024 * MiB  # every b_i = min(p_i·b, B) = B
    v = view(job("a", **on(4, b)), job("b", **on(1, b)), node_bandwidth=b)
    assert allocation(FairShare(), v) == {"a": 20 * MiB, "b": 20 * MiB}


def test_fair_share_alpha_below_one() -> None:
    # b_i = 40 and 8, Σ = 48: α = 40/48, rates 33.33 and 6.67 MiB/s.
    rates = allocation(FairShare(), view(job("a", **on(5)), job("b", **on(1))))
    assert rates["a"] == pytest.approx(40 * MiB * 40 / 48)
    assert rates["b"] == pytest.approx(8 * MiB * 40 / 48)


def test_fair_share_hands_unused_share_to_others() -> None:
    # The 1-node job only wants 5 MiB/s: it gets 5, the 5-node job the other 35.
    v = view(job("big", **on(5)), job("small", **on(1), demand=5 * MiB))
    rates = allocation(FairShare(), v)
    assert rates["small"] == pytest.approx(5 * MiB)
    assert rates["big"] == pytest.approx(35 * MiB)


def test_fair_share_ignores_idle_jobs() -> None:
    v = view(job("a", **on(1)), job("idle", **on(4), demand=0.0))
    rates = allocation(FairShare(), v)
    assert rates["a"] == 8 * MiB and rates.get("idle", 0.0) == 0.0


def test_fcfs_serves_oldest_post_first() -> None:
    b = 1024 * MiB
    v = view(
        job("late", **on(1, b), posted_at=5.0),
        job("early", **on(1, b), posted_at=1.0),
        node_bandwidth=b,
    )
    assert allocation(Fcfs(), v) == {"early": 40 * MiB, "late": 0.0}


def test_fcfs_gives_the_rest_down_the_queue() -> None:
    # first job can use only its b_i = 8 (and wants 6): the rest flows on.
    v = view(
        job("first", **on(1), demand=6 * MiB, posted_at=1.0),
        job("second", **on(4), posted_at=2.0),
        job("third", **on(4), posted_at=3.0),
    )
    assert allocation(Fcfs(), v) == {"first": 6 * MiB, "second": 32 * MiB, "third": 2 * MiB}


def test_fcfs_ties_in_the_stable_order() -> None:
    # equal post times: the job first seen (index) first, then by job id
    b = 1024 * MiB
    v = view(job("a", **on(1, b), index=1), job("b", **on(1, b), index=0), node_bandwidth=b)
    assert allocation(Fcfs(), v) == {"b": 40 * MiB, "a": 0.0}
    v = view(job("b", **on(1, b)), job("a", **on(1, b)), node_bandwidth=b)  # same index
    assert allocation(Fcfs(), v) == {"a": 40 * MiB, "b": 0.0}


def test_greedy_fill_partial_last() -> None:
    demand = dict.fromkeys("abc", 32 * MiB)
    assert greedy_fill("abc", demand, 40 * MiB) == [("a", 32 * MiB), ("b", 8 * MiB)]
    assert greedy_fill([], demand, 40 * MiB) == [] == greedy_fill("abc", demand, 0.0)


@pytest.mark.parametrize(
    ("ceilings", "weights", "capacity", "expected"),
    [
        ({"a": 10, "b": 10}, {"a": 1, "b": 1}, 10, {"a": 5, "b": 5}),
        ({"a": 2, "b": 10}, {"a": 1, "b": 1}, 10, {"a": 2, "b": 8}),
        ({"a": 10, "b": 10}, {"a": 3, "b": 1}, 8, {"a": 6, "b": 2}),
        ({"a": 1, "b": 1}, {"a": 3, "b": 1}, 8, {"a": 1, "b": 1}),
        ({"a": 0, "b": 5}, {"a": 1, "b": 1}, 8, {"a": 0, "b": 5}),
        ({"a": 9, "b": 9, "c": 1}, {"a": 1, "b": 2, "c": 4}, 10, {"a": 3, "b": 6, "c": 1}),
    ],
)
def test_water_fill(ceilings, weights, capacity, expected) -> None:
    rates = water_fill(ceilings, weights, capacity)
    assert rates == pytest.approx(expected) and list(rates) == list(ceilings)
    # over keys: (key, rate) for those that can take something, in the keys' order
    live = {k: expected[k] for k in ceilings if ceilings[k] > 0 and weights[k] > 0}
    levels = water_levels(list(ceilings), ceilings, weights, capacity)
    assert [k for k, _ in levels] == list(live) and dict(levels) == pytest.approx(live)


def test_water_fill_without_a_weight_gives_nothing() -> None:
    assert water_fill({"a": 5.0, "b": 5.0}, {"b": 1.0}, 4.0) == {"a": 0.0, "b": 4.0}


def test_yield_eq6() -> None:
    # y = (W_done + V_transferred / b_i) / (t − τ_i) = P / (t − τ_i) = 9 / 10
    j = job("a", **on(1), released_at=0.0, progress=9.0)
    assert j.yield_at(10.0) == pytest.approx(0.9)
    assert j.yield_at(0.0) == 0.0  # fresh job: the named constant FRESH_YIELD


def test_remaining_estimate_from_past_operations() -> None:
    known = job("a", **on(1), volume=100.0, remaining=30.0, mean_volume=500.0)
    assert known.remaining_estimate() == 30.0
    unknown = job("b", **on(1), moved=200.0, mean_volume=500.0)
    assert unknown.remaining_estimate() == 300.0
    assert job("c", **on(1), moved=900.0, mean_volume=500.0).remaining_estimate() == 0


def test_registry_rejects_overwrite_and_bad_names() -> None:
    reg = PolicyRegistry()
    with pytest.raises(ValueError, match="already registered"):
        reg.register("fcfs", Fcfs)
    reg.register("fcfs", Fcfs, replace=True)
    with pytest.raises(ValueError, match="kebab-case"):
        reg.register("Fair_Share", FairShare)


def test_registry_unknown_name_and_import_path() -> None:
    reg = default_registry()
    # the known names, sorted (whatever else is registered: best-next-event comes first)
    with pytest.raises(KeyError, match=r"unknown policy 'nope'; known: (\S+, )*fair-share, fcfs"):
        reg.get("nope")
    # an import path is no name (tests/unit/policies/test_policy_names.py)
    with pytest.raises(KeyError, match="import paths are not policy names"):
        reg.get("burstctl.policies.fcfs:Fcfs")


def test_registry_rejects_unknown_params() -> None:
    with pytest.raises(ValueError, match="bad parameters for policy 'fcfs': bogus"):
        default_registry().create("fcfs", {"bogus": 1})
