"""The batch rule (merge.py), the partitioner and the priority orders of [DPSAC]."""

from __future__ import annotations

import pytest

from burstctl.policies.dpsac.merge import add_batch, centroid, closest, merge_clusters
from burstctl.policies.dpsac.model import App
from burstctl.policies.dpsac.partition import partition, teio
from burstctl.policies.dpsac.priorities import (
    Efficiency,
    by_name,
    max_sys_eff,
    min_dilation,
    minmax,
)


def ids(clusters: list[list[tuple[str, float]]]) -> list[list[str]]:
    return [sorted(a for a, _ in c) for c in clusters]


def test_small_batch_is_inserted_member_by_member() -> None:
    existing = [[("a", 10.0), ("b", 12.0)], [("c", 100.0), ("d", 110.0)]]
    # 2 ≤ the average size 2: inserted, no new cluster even for a far value
    result = add_batch(existing, [("x", 11.0), ("y", 400.0)])
    assert ids(result) == [["a", "b", "x"], ["c", "d", "y"]]


def test_large_batch_is_clustered_then_merged() -> None:
    existing = [[("a", 10.0)], [("c", 100.0)], [("e", 300.0)]]
    # 4 > 1: clustered into 2 groups (around 20 and 290); 2 < 3: each new joins its closest
    batch = [("w", 19.0), ("x", 21.0), ("y", 290.0), ("z", 291.0)]
    result = add_batch(existing, batch)
    assert ids(result) == [["a", "w", "x"], ["c"], ["e", "y", "z"]]
    # more new clusters than existing ones: each existing joins its closest new one
    merged = merge_clusters([[("a", 50.0)]], [[("b", 10.0)], [("c", 60.0)]])
    assert ids(merged) == [["b"], ["a", "c"]]
    assert add_batch([], [("p", 1.0), ("q", 1.1), ("r", 50.0)]) != []
    assert centroid(merged[1]) == pytest.approx(55.0)
    assert closest([1.0, 3.0], 2.0) == 0  # ties to the lower index


def test_partition_shares_and_quotas() -> None:
    apps = {
        "a": App("a", rate=10.0, p=0.5, length=1.0),  # P·B = 5
        "b": App("b", rate=20.0, p=0.25, length=1.0),  # 5
        "c": App("c", rate=40.0, p=0.25, length=9.0),  # 10
    }
    parts = partition([["a", "b"], ["c"]], apps, S=300.0, B=100.0)
    assert teio([["a", "b"], ["c"]], apps) == 20.0
    assert [p.eio for p in parts] == [10.0, 10.0]
    assert [p.share for p in parts] == [0.5, 0.5]
    assert [p.quota for p in parts] == [150.0, 150.0]
    assert [p.pfs for p in parts] == [50.0, 50.0]
    idle = {k: App(k, v.rate, 0.0, v.length) for k, v in apps.items()}
    assert [p.share for p in partition([["a"], ["b"], ["c"]], idle, 3.0, 6.0)] == [
        pytest.approx(1 / 3)
    ] * 3
    assert partition([], apps, 1.0, 1.0) == []
    with pytest.raises(ValueError, match="S and B"):
        partition([["a"]], apps, -1.0, 1.0)


def test_priority_orders() -> None:
    apps = [
        Efficiency("slow-small", rho_tilde=0.2, rho=0.8, beta=1),  # ratio 0.25
        Efficiency("fast-big", rho_tilde=0.9, rho=1.0, beta=100),  # 0.9, β·r = 90
        Efficiency("mid-big", rho_tilde=0.3, rho=0.5, beta=200),  # 0.6, β·r = 120
        Efficiency("slower", rho_tilde=0.1, rho=1.0, beta=5),  # 0.1
        Efficiency("no-compute", rho_tilde=0.0, rho=0.0, beta=2),  # ratio 1 by convention
    ]
    order = lambda f: [a.app_id for a in f(apps)]  # noqa: E731
    assert order(min_dilation) == ["slower", "slow-small", "mid-big", "fast-big", "no-compute"]
    assert order(max_sys_eff) == ["mid-big", "fast-big", "no-compute", "slower", "slow-small"]
    assert order(minmax) == ["slower", "slow-small", "mid-big", "fast-big", "no-compute"]
    assert order(lambda a: minmax(a, 0.0)) == order(max_sys_eff)
    assert order(lambda a: minmax(a, 1.1)) == order(min_dilation)
    assert order(by_name("max-sys-eff")) == order(max_sys_eff)
    with pytest.raises(ValueError, match="unknown priority"):
        by_name("fifo")
