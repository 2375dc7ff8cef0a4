"""The updaters of [DPSAC] §4.5: ST, DT and OK, driven through their common interface."""

from __future__ import annotations

import random

import pytest

from burstctl.policies.dpsac.updaters import (
    DT,
    OK,
    ST,
    js_divergence,
    make_updater,
    split_at_largest_gap,
)

BATCH = [("s1", 20.0), ("s2", 25.0), ("s3", 23.0), ("b1", 200.0), ("b2", 234.0), ("b3", 280.0)]


@pytest.mark.parametrize("name", ["st", "dt", "ok"])
def test_common_interface_joins_and_exact_exits(name: str) -> None:
    up = make_updater(name, k_max=5, rng=random.Random(3))
    up.on_batch(BATCH)
    assert up.changed and len(up) == 6
    assert sorted(map(sorted, up.clusters)) == [["b1", "b2", "b3"], ["s1", "s2", "s3"]]
    up.changed = False
    k = up.on_join("s4", 22.0)
    assert "s4" in up.clusters[k] and up.cluster_of("s4") == k
    before = {a: up.cluster_of(a) for a in ["s1", "b1"]}
    up.on_exit("s4")
    assert "s4" not in up and all("s4" not in c for c in up.clusters)
    assert {a: up.cluster_of(a) for a in ["s1", "b1"]} == before
    up.on_exit("nobody")  # unknown ids are ignored
    assert len(up) == 6
    with pytest.raises(ValueError, match="already clustered"):
        up.on_join("s1", 1.0)
    with pytest.raises(ValueError, match="finite"):
        up.on_join("x", -1.0)


def test_st_splits_when_the_drift_passes_the_threshold_and_not_before() -> None:
    up = ST(k_max=2)
    up.on_batch([("a", 10.0), ("b", 12.0), ("c", 14.0)])  # one cluster, c = 12
    assert up.clusters == [["a", "b", "c"]]
    up.changed = False
    # ĉ after a join of 14 with |C| = 3: (12·3 + 14)/4 = 12.5; spread 4 → drift 0.125 ≥ 0.1,
    # but the size test |C| > K_C = 2 holds too → it splits; so first check a drift below
    # the threshold: a join of 13 gives ĉ = 12.25, drift 0.25/4 = 0.0625 < 0.1
    up.on_join("d", 13.0)
    assert not up.changed and len(up.clusters) == 1
    assert up.drift(0) == pytest.approx(0.0625)
    # ĉ = (12.25·4 + 30)/5 = 15.8, spread 20, drift 0.19 ≥ 0.1 with |C| = 4 > 2: split
    k = up.on_join("e", 30.0)
    assert up.changed
    assert up.clusters == [["a", "b", "d", "c"], ["e"]]
    assert k == 1


def test_st_size_guard_blocks_small_clusters() -> None:
    up = ST(k_max=5)
    up.on_batch([("a", 10.0), ("b", 12.0)])
    up.changed = False
    up.on_join("c", 40.0)  # drift large, but |C| = 2 ≤ K_C
    assert up.clusters == [["a", "b", "c"]] and not up.changed


def test_split_at_largest_gap() -> None:
    assert split_at_largest_gap([("a", 1.0), ("b", 1.0)]) is None
    lo, hi = split_at_largest_gap([("x", 9.0), ("a", 1.0), ("b", 2.0), ("c", 5.0)]) or ([], [])
    assert [a for a, _ in lo] == ["a", "b", "c"] and [a for a, _ in hi] == ["x"]


def test_js_divergence() -> None:
    assert js_divergence({}, {}) == 0.0
    assert js_divergence({0: 1.0}, {0: 1.0}) == 0.0
    assert js_divergence({0: 1.0}, {1: 1.0}) == pytest.approx(0.6931471805599453)  # ln 2
    assert js_divergence({0: 0.5, 1: 0.5}, {0: 1.0}) == pytest.approx(
        0.5 * (0.5 * 0.0 + 0.5 * 0.0) + 0.0, abs=0.22
    )


def test_dt_splits_only_after_k_c_changes_and_a_divergence_of_0_1() -> None:
    up = DT(k_max=3)
    up.on_batch([("a", 10.0), ("b", 11.0), ("c", 12.0), ("d", 13.0), ("e", 14.0)])
    assert up.clusters == [["a", "b", "c", "d", "e"]]
    up.changed = False
    # two joins far away: q changed a lot, but fewer than K_C = 3 changes: no check yet
    up.on_join("x", 40.0)
    up.on_join("y", 41.0)
    assert up.checks == 0 and not up.changed
    assert up.divergence() >= 0.1
    up.on_join("z", 42.0)  # the third change: checked, divergent, the cluster splits
    assert up.checks == 1 and up.changed
    assert up.clusters == [["a", "b", "c", "d", "e"], ["x", "y", "z"]]
    assert up.divergence() == 0.0  # p ← q


def test_dt_no_split_below_the_threshold() -> None:
    up = DT(k_max=3)
    up.on_batch([(f"a{i}", 10.0 + i) for i in range(9)])
    for i in range(3):
        up.on_join(f"n{i}", 10.0 + 3 * i)  # same range, similar shape
    assert up.checks == 1 and up.divergence() < 0.1 and len(up.clusters) == 1


def test_ok_keeps_the_number_of_centres_and_is_seeded() -> None:
    def run(seed: int) -> tuple[list[list[str]], int]:
        up = OK(k_max=5, rng=random.Random(seed))
        up.on_batch(BATCH)
        assert len(up.centres) == 2
        rng = random.Random(99)
        for i in range(60):
            up.on_join(f"n{i}", rng.choice([20.0, 120.0, 240.0, 1000.0]) + rng.random())
            assert len(up.centres) == 2 and len(up.clusters) == 2
            if i % 3 == 0:
                up.on_exit(f"n{i}")
        for a, _ in BATCH:
            up.on_exit(a)
        assert len(up.centres) == 2
        assert sum(len(c) for c in up.clusters) == len(up) == 40
        return up.clusters, up.replacements

    first = run(1)
    assert first == run(1)
    assert first[1] > 0  # some far joins replaced a centre


def test_ok_replacement_probability_is_d2_over_f() -> None:
    up = OK(k_max=5, rng=random.Random(0))
    up.on_batch([("a", 0.0), ("a2", 0.5), ("b", 10.0), ("b2", 10.5)])
    assert up.centres == [0.25, 10.25]  # w* = 10²/2 = 50, f = w*/k = 25
    assert up.f == 25.0
    up.on_join("same", 10.25)  # D² = 0: never a new centre
    assert up.replacements == 0 and up.centres == [0.25, 10.25]
    up.changed = False
    up.on_join("far", 100.0)  # D² = 89.75² ≥ f: always
    assert up.replacements == 1 and up.centres == [0.25, 100.0] and up.changed
    # the members of the replaced centre went to the closest remaining centre
    assert sorted(up.clusters[0]) == ["a", "a2", "b", "b2", "same"] and up.clusters[1] == ["far"]
    with pytest.raises(ValueError, match="unknown updater"):
        make_updater("zz")


@pytest.mark.parametrize("name", ["st", "dt", "ok"])
def test_empty_batches_and_everyone_leaving(name: str) -> None:
    up = make_updater(name, k_max=3, rng=random.Random(0))
    up.on_batch([])
    assert up.clusters == [] and len(up) == 0
    up.on_batch(BATCH)
    for a, _ in BATCH:
        up.on_exit(a)
    assert len(up) == 0
    k = up.on_join("again", 50.0)  # with nobody left, an arrival starts afresh
    assert up.clusters[k] == ["again"]
