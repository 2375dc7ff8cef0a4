"""The replicas' global view: Figure 5, epochs and incarnations, expiry, policy versions,
validation, determinism, and equality with one controller on the union of the jobs."""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from typing import Any

import pytest

from burstctl.controller.global_view import (
    Digest,
    DigestError,
    GlobalView,
    JobColumns,
    JobDigest,
    Status,
    validate,
)
from burstctl.policies.registry import default_registry
from burstctl.policies.view import JobView, SystemView

C = 100.0
B_NODE = 1e9  # b: never the binding cap here
BIG = 1e6  # a local demand that never binds
REGISTRY = default_registry()


def job(job_id: str, nodes: int = 8, demand: float = BIG, **kw: Any) -> JobDigest:
    fields: dict[str, Any] = {
        "user": "u",
        "group": "g",
        "priority": 1.0,
        "usage_bytes": 0.0,
        "progress": 0.0,
        "released_at": -10.0,
        "posted_at": -1.0 if demand > 0 else None,
        "remaining": None,
        "open_op": demand > 0,
    }
    fields.update(kw)
    return JobDigest(job_id=job_id, nodes=nodes, demand=demand, **fields)


def digest(rid: str, jobs: tuple[JobDigest, ...] = (), **kw: Any) -> Digest:
    fields: dict[str, Any] = {
        "incarnation": 1,
        "epoch": 1,
        "capacity": C,
        "node_bandwidth": B_NODE,
        "policy": "size-fair",
        "policy_params": {},
        "policy_version": 0,
    }
    fields.update(kw)
    return Digest(replica_id=rid, jobs=jobs, **fields)


def per_job(rates: dict[tuple[str, str], float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (j, _), x in rates.items():
        out[j] = out.get(j, 0.0) + x
    return out


def per_replica(rates: dict[tuple[str, str], float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (_, r), x in rates.items():
        out[r] = out.get(r, 0.0) + x
    return out


def figure5(c1: float, c2: float) -> tuple[Digest, Digest]:
    r1 = digest("R1", (job("J1", nodes=16), job("J2", nodes=8)), capacity=c1)
    r2 = digest("R2", (job("J1", nodes=16), job("J3", nodes=8)), capacity=c2)
    return r1, r2


# -- Figure 5 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("c1", "c2", "expected"),
    [
        (C, C, {("J1", "R1"): 50.0, ("J2", "R1"): 50.0, ("J1", "R2"): 50.0, ("J3", "R2"): 50.0}),
        (
            2 * C,
            C,
            {("J1", "R1"): 125.0, ("J2", "R1"): 75.0, ("J1", "R2"): 25.0, ("J3", "R2"): 75.0},
        ),
    ],
    ids=["equal", "unequal"],
)
def test_figure5_size_fair_is_globally_fair(
    c1: float, c2: float, expected: dict[tuple[str, str], float]
) -> None:
    r1, r2 = figure5(c1, c2)
    total = c1 + c2
    for me, peer in ((r1, r2), (r2, r1)):  # both replicas compute the same matrix
        gv = GlobalView(me.replica_id)
        assert gv.receive(peer, now=0.0).accepted
        t = gv.global_targets(me, REGISTRY)
        assert t == pytest.approx({"J1": total / 2, "J2": total / 4, "J3": total / 4})
        rates = gv.targets(me, REGISTRY)
        assert rates == pytest.approx(expected)
        assert per_job(rates) == pytest.approx({"J1": total / 2, "J2": total / 4, "J3": total / 4})
        cols = per_replica(rates)
        assert cols["R1"] <= c1 + 1e-9
        assert cols["R2"] <= c2 + 1e-9


def test_before_the_first_exchange_each_replica_is_locally_fair() -> None:
    r1, _ = figure5(C, C)
    rates = GlobalView("R1").targets(r1, REGISTRY)
    assert rates == pytest.approx({("J1", "R1"): 2 * C / 3, ("J2", "R1"): C / 3})


# -- epochs and incarnations ----------------------------------------------------


def test_stale_and_duplicate_epochs_are_ignored() -> None:
    gv = GlobalView("R1")
    assert gv.receive(digest("R2", epoch=5, capacity=10.0), 0.0).status is Status.ACCEPTED
    assert gv.receive(digest("R2", epoch=5, capacity=10.0), 1.0).status is Status.DUPLICATE
    assert gv.receive(digest("R2", epoch=4, capacity=99.0), 1.0).status is Status.STALE
    conflicting = gv.receive(digest("R2", epoch=5, capacity=99.0), 1.0)
    assert conflicting.status is Status.REJECTED and conflicting.field == "epoch"
    (held,) = gv.digests()
    assert held.epoch == 5 and held.capacity == 10.0
    assert gv.receive(digest("R2", epoch=6, capacity=20.0), 2.0).accepted
    assert gv.digests()[0].capacity == 20.0


def test_restart_with_a_new_incarnation_is_accepted_despite_epoch_reset() -> None:
    gv = GlobalView("R1")
    assert gv.receive(digest("R2", incarnation=100, epoch=900), 0.0).accepted
    assert gv.receive(digest("R2", incarnation=200, epoch=0, capacity=7.0), 1.0).accepted
    assert gv.digests()[0].capacity == 7.0
    # the old run's late digests are now stale history, not news
    late = gv.receive(digest("R2", incarnation=100, epoch=901), 2.0)
    assert late.status is Status.REJECTED and late.field == "incarnation"


def test_impostor_with_a_lower_incarnation_is_rejected_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gv = GlobalView("R1")
    assert gv.receive(digest("R2", incarnation=50, epoch=3), 0.0).accepted
    with caplog.at_level(logging.WARNING):
        out = gv.receive(digest("R2", incarnation=49, epoch=1000, capacity=1e12), 1.0)
    assert out.status is Status.REJECTED and out.field == "incarnation"
    assert "impostor" in out.reason and "R2" in caplog.text
    assert gv.digests()[0].capacity == C


def test_a_peer_cannot_claim_this_replicas_id_or_an_unconfigured_one() -> None:
    gv = GlobalView("R1", peers=["R2"])
    assert gv.receive(digest("R1"), 0.0).status is Status.REJECTED
    assert gv.receive(digest("R3"), 0.0).status is Status.REJECTED
    assert gv.receive(digest("R2"), 0.0).accepted
    assert gv.live_peers() == ["R2"]


def test_a_policy_the_registry_cannot_build_is_rejected_at_the_door() -> None:
    gv = GlobalView("R1", registry=REGISTRY)
    out = gv.receive(digest("R2", policy="no-such-policy", policy_version=99), 0.0)
    assert out.status is Status.REJECTED and out.field == "policy"
    out = gv.receive(digest("R2", policy="size-fair", policy_params={"bogus": 1}), 0.0)
    assert out.status is Status.REJECTED and out.field == "policy"
    assert gv.live_peers() == []


# -- expiry and rejoin -----------------------------------------------------------


def test_a_peer_missing_k_exchanges_leaves_and_rejoins() -> None:
    lam, k = 0.5, 3
    r1, r2 = figure5(C, C)
    gv = GlobalView("R1")
    assert gv.receive(r2, now=0.0).accepted
    assert gv.expire(now=k * lam, interval=lam, missed=k) == []  # exactly k·λ: still live
    assert gv.live_peers() == ["R2"]
    assert gv.expire(now=k * lam + 0.01, interval=lam, missed=k) == ["R2"]
    assert gv.live_peers() == []
    # R1 falls back to its local decision: 2/3 vs 1/3 of its own capacity
    assert gv.targets(r1, REGISTRY) == pytest.approx({("J1", "R1"): 2 * C / 3, ("J2", "R1"): C / 3})
    # the same old digest again does not revive it; a newer one does
    assert gv.receive(r2, now=2.0).status is Status.DUPLICATE
    assert gv.live_peers() == []
    assert gv.receive(dataclasses.replace(r2, epoch=2), now=2.0).accepted
    assert gv.live_peers() == ["R2"]
    assert per_job(gv.targets(r1, REGISTRY)) == pytest.approx({"J1": C, "J2": C / 2, "J3": C / 2})
    assert gv.expire(now=2.0 + k * lam, interval=lam, missed=k) == []


def test_expire_checks_its_parameters() -> None:
    gv = GlobalView("R1")
    with pytest.raises(ValueError, match="interval"):
        gv.expire(0.0, 0.0, 3)
    with pytest.raises(ValueError, match="missed"):
        gv.expire(0.0, 1.0, 0)


# -- policy versions -------------------------------------------------------------


def test_highest_policy_version_wins_ties_by_replica_id() -> None:
    me = digest("R2", policy="job-fair", policy_version=3)
    gv = GlobalView("R2")
    assert gv.active_policy() is None
    assert gv.active_policy(me).name == "job-fair"  # type: ignore[union-attr]
    gv.receive(digest("R1", policy="size-fair", policy_version=4), 0.0)
    assert gv.active_policy(me).name == "size-fair"  # type: ignore[union-attr]
    gv.receive(digest("R3", policy="user-fair", policy_version=4), 0.0)
    active = gv.active_policy(me)
    assert active is not None
    assert (active.name, active.version, active.replica_id) == ("user-fair", 4, "R3")
    # and the winner drives the targets: job-fair would give 1/2, 1/2
    lone = digest("R2", (job("A", nodes=3), job("B", nodes=1)), policy="job-fair")
    solo = GlobalView("R2")
    solo.receive(digest("R1", policy="size-fair", policy_version=1), 0.0)
    assert solo.global_targets(lone, REGISTRY) == pytest.approx(
        {"A": 2 * C * 0.75, "B": 2 * C * 0.25}
    )


def test_a_switch_reaches_every_replica_with_the_next_exchange() -> None:
    r1, r2 = figure5(C, C)
    v1 = GlobalView("R1")
    v2 = GlobalView("R2")
    r1 = dataclasses.replace(r1, epoch=2, policy="job-fair", policy_version=1)
    v1.receive(r2, 0.0)
    v2.receive(r1, 0.0)
    assert v1.targets(r1, REGISTRY) == v2.targets(r2, REGISTRY)
    assert v1.global_targets(r1, REGISTRY) == pytest.approx(
        {"J1": 2 * C / 3, "J2": 2 * C / 3, "J3": 2 * C / 3}
    )


# -- validation ------------------------------------------------------------------

GOOD = digest("R2", (job("J1"), job("J2", demand=0.0)))

BAD_DIGESTS: list[tuple[str, dict[str, Any]]] = [
    ("replica_id", {"replica_id": ""}),
    ("replica_id", {"replica_id": 7}),
    ("replica_id", {"replica_id": "a\nb"}),
    ("incarnation", {"incarnation": -1}),
    ("incarnation", {"incarnation": 1.5}),
    ("epoch", {"epoch": True}),
    ("epoch", {"epoch": 2**64}),
    ("capacity", {"capacity": math.nan}),
    ("capacity", {"capacity": math.inf}),
    ("capacity", {"capacity": -1.0}),
    ("capacity", {"capacity": 1e30}),
    ("capacity", {"capacity": "100"}),
    ("node_bandwidth", {"node_bandwidth": 0.0}),
    ("policy", {"policy": ""}),
    ("policy", {"policy": None}),
    ("policy_params", {"policy_params": [1, 2]}),
    ("policy_params", {"policy_params": {1: 2}}),
    ("policy_params", {"policy_params": {"x": math.nan}}),
    ("policy_params", {"policy_params": {"x": object()}}),
    ("policy_version", {"policy_version": -3}),
    ("jobs", {"jobs": [job("J1")]}),
    ("jobs[0]", {"jobs": ("J1",)}),
    ("jobs[1].job_id", {"jobs": (job("J1"), job("J1"))}),
]

BAD_JOBS: list[tuple[str, dict[str, Any]]] = [
    ("job_id", {"job_id": ""}),
    ("user", {"user": None}),
    ("group", {"group": 3}),
    ("nodes", {"nodes": 0}),
    ("nodes", {"nodes": 2.0}),
    ("nodes", {"nodes": True}),
    ("nodes", {"nodes": 10**9}),
    ("priority", {"priority": 0.0}),
    ("priority", {"priority": -1.0}),
    ("priority", {"priority": math.nan}),
    ("demand", {"demand": -1.0}),
    ("demand", {"demand": math.inf}),
    ("demand", {"demand": 1e30}),
    ("demand", {"demand": 5.0, "open_op": False}),
    ("usage_bytes", {"usage_bytes": -1.0}),
    ("usage_bytes", {"usage_bytes": math.nan}),
    ("progress", {"progress": -0.5}),
    ("released_at", {"released_at": 3.0}),
    ("released_at", {"released_at": -math.inf}),
    ("posted_at", {"posted_at": 1.0}),
    ("remaining", {"remaining": -1.0}),
    ("open_op", {"open_op": 1}),
]


@pytest.mark.parametrize(("field", "change"), BAD_DIGESTS, ids=[f for f, _ in BAD_DIGESTS])
def test_every_bad_digest_field_is_named(field: str, change: dict[str, Any]) -> None:
    bad = dataclasses.replace(GOOD, **change)
    with pytest.raises(DigestError) as exc:
        validate(bad)
    assert exc.value.field == field
    assert str(exc.value).startswith(f"{field}: ")
    gv = GlobalView("R1")
    out = gv.receive(bad, 0.0)
    assert out.status is Status.REJECTED and out.field == field
    assert gv.live_peers() == []


@pytest.mark.parametrize(("field", "change"), BAD_JOBS, ids=[f for f, _ in BAD_JOBS])
def test_every_bad_job_field_is_named(field: str, change: dict[str, Any]) -> None:
    bad = dataclasses.replace(
        GOOD, jobs=(GOOD.jobs[0], dataclasses.replace(GOOD.jobs[1], **change))
    )
    with pytest.raises(DigestError) as exc:
        validate(bad)
    assert exc.value.field == f"jobs[1].{field}"
    gv = GlobalView("R1")
    assert gv.receive(GOOD, 0.0).accepted
    out = gv.receive(dataclasses.replace(bad, epoch=2), 1.0)
    assert out.status is Status.REJECTED and out.field == f"jobs[1].{field}"
    assert gv.digests() == [GOOD]  # no effect on the global view


def test_not_a_digest_is_rejected() -> None:
    out = GlobalView("R1").receive("R2", 0.0)  # type: ignore[arg-type]
    assert out.status is Status.REJECTED and out.field == "digest"


def test_good_digest_validates() -> None:
    validate(GOOD)


# -- determinism and equality with one controller -------------------------------------


def random_cluster(rng: random.Random, policy: str) -> list[Digest]:
    replicas = [f"r{i}" for i in range(rng.randint(2, 5))]
    users = {f"u{i}": f"g{i % 2}" for i in range(rng.randint(1, 4))}
    placed: dict[str, list[JobDigest]] = {r: [] for r in replicas}
    for i in range(rng.randint(1, 9)):
        user = rng.choice(sorted(users))
        nodes = rng.randint(1, 32)
        prio = float(rng.randint(1, 4))
        for r in rng.sample(replicas, rng.randint(1, len(replicas))):
            demand = rng.choice([0.0, rng.uniform(1.0, 80.0), BIG])
            placed[r].append(
                job(
                    f"j{i}",
                    nodes=nodes,
                    demand=demand,
                    user=user,
                    group=users[user],
                    priority=prio,
                    progress=rng.uniform(0.0, 5.0),
                    released_at=-rng.uniform(5.0, 50.0),
                )
            )
    return [
        digest(
            r,
            tuple(placed[r]),
            capacity=float(rng.randint(20, 200)),
            epoch=rng.randint(1, 9),
            policy=policy,
        )
        for r in replicas
    ]


@pytest.mark.parametrize("seed", range(30))
def test_every_replica_and_every_receive_order_give_the_same_matrix(seed: int) -> None:
    rng = random.Random(seed)
    cluster = random_cluster(rng, "group>user>size")
    results = []
    for me in cluster:
        peers = [d for d in cluster if d is not me]
        for _ in range(3):
            noise = [dataclasses.replace(d, epoch=d.epoch - 1) for d in peers] + peers
            rng.shuffle(noise)
            gv = GlobalView(me.replica_id)
            for d in noise:  # older epochs before or after: never matters
                gv.receive(d, now=0.0)
            rates = gv.targets(me, REGISTRY)
            results.append(list(rates.items()))
    assert all(r == results[0] for r in results)
    cols = per_replica(dict(results[0]))
    for d in cluster:
        assert cols.get(d.replica_id, 0.0) <= d.capacity * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(30))
def test_global_targets_equal_one_controller_on_the_union(seed: int) -> None:
    rng = random.Random(1000 + seed)
    cluster = random_cluster(rng, "group>user>size")
    me, peers = cluster[0], cluster[1:]
    gv = GlobalView(me.replica_id)
    for d in peers:
        assert gv.receive(d, now=0.0).accepted

    # One controller that sees every job with its total demand, capacity Σ B_r.
    capacity = sum(d.capacity for d in cluster)
    union: dict[str, JobView] = {}
    for index, job_id in enumerate(sorted({j.job_id for d in cluster for j in d.jobs})):
        copies = [j for d in cluster for j in d.jobs if j.job_id == job_id]
        demand = min(capacity, sum(j.demand for j in copies))
        if demand > 0:
            union[job_id] = JobView(
                job_id=job_id,
                user=copies[0].user,
                group=copies[0].group,
                nodes=copies[0].nodes,
                priority=copies[0].priority,
                cap=capacity,
                demand=demand,
                index=index,
            )
    single = REGISTRY.create("group>user>size").allocate(
        SystemView(now=0.0, capacity=capacity, node_bandwidth=B_NODE, jobs=union)
    )
    expected = {j: single.get(j, 0.0) for j in union}
    assert gv.global_targets(me, REGISTRY) == pytest.approx(expected, abs=1e-9)

    rates = gv.targets(me, REGISTRY)
    cols = per_replica(rates)
    for d in cluster:
        assert cols.get(d.replica_id, 0.0) <= d.capacity * (1 + 1e-9)
    for (j, r), x in rates.items():
        local = next(
            jd.demand for d in cluster if d.replica_id == r for jd in d.jobs if jd.job_id == j
        )
        assert 0.0 <= x <= local * (1 + 1e-9)


def test_metadata_conflicts_resolve_to_the_lowest_replica_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r1 = digest("R1", (job("J1", nodes=16, user="alice"),))
    r2 = digest("R2", (job("J1", nodes=2, user="mallory"),))
    with caplog.at_level(logging.WARNING):
        for me, peer in ((r1, r2), (r2, r1)):
            gv = GlobalView(me.replica_id)
            gv.receive(peer, 0.0)
            row = gv.system_view(me).jobs["J1"]
            assert (row.nodes, row.user) == (16, "alice")
            assert row.demand == pytest.approx(2 * C)  # Σ d_jr, capped at b_i ≤ Σ B_r
    assert "mallory" in caplog.text


def test_relative_times_merge_to_the_earliest() -> None:
    r1 = digest("R1", (job("J1", released_at=-30.0, posted_at=-2.0, progress=4.0),))
    r2 = digest("R2", (job("J1", released_at=-31.0, posted_at=-1.0, progress=5.0),))
    gv = GlobalView("R1")
    gv.receive(r2, 0.0)
    row = gv.system_view(r1).jobs["J1"]
    assert (row.released_at, row.posted_at, row.progress) == (-31.0, -2.0, 5.0)
    assert row.yield_at(0.0) == pytest.approx(5.0 / 31.0)


def test_progress_sums_bytes_over_replicas_and_keeps_the_largest_work_time() -> None:
    # J on R1 (B = 100, b_i = min(2·30, 100) = 60): 2 s of work + 120 B -> P = 4;
    # on R2 (B = 50, b_i = 50): 3 s of work + 100 B -> P = 5. Globally b_i = 60
    # (B = 150): P = max(2, 3) + (120 + 100) / 60.
    r1 = digest("R1", (job("J", nodes=2, progress=4.0, transferred=120.0),), node_bandwidth=30.0)
    r2 = digest(
        "R2",
        (job("J", nodes=2, progress=5.0, transferred=100.0),),
        capacity=50.0,
        node_bandwidth=30.0,
    )
    view = GlobalView("R1")
    assert view.receive(r2, now=0.0).accepted
    merged = view.system_view(r1).jobs["J"]
    assert merged.cap == 60.0
    assert merged.progress == pytest.approx(3.0 + 220.0 / 60.0)


def test_negative_transferred_is_rejected_by_name() -> None:
    bad = digest("R2", (job("J", transferred=-1.0),))
    with pytest.raises(DigestError) as err:
        validate(bad)
    assert err.value.field == "jobs[0].transferred"


BAD_VALUES: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    -1.0,
    0.0,
    1e30,
    True,
    "1",
    None,
    2**70,
    3,
    1.5,
    -0.5,
]


@pytest.mark.parametrize("seed", range(40))
def test_fast_job_check_agrees_with_the_field_by_field_one(seed: int) -> None:
    # _valid_job (the shortcut) must accept exactly what _validate_job accepts.
    from burstctl.controller.global_view import _valid_job, _validate_job

    rng = random.Random(seed)
    fields = [f.name for f in dataclasses.fields(JobDigest)]
    for _ in range(200):
        base = job("J", nodes=rng.choice([1, 8]), demand=rng.choice([0.0, 5.0]))
        changes = {
            name: rng.choice([*BAD_VALUES, "", "x" * 300, "ok", "a\x00b", False])
            for name in rng.sample(fields, rng.randint(0, 2))
        }
        candidate = dataclasses.replace(base, **changes)
        try:
            _validate_job("jobs[0]", candidate)
            slow = True
        except DigestError:
            slow = False
        assert _valid_job(candidate) == slow, changes


# -- columns ------------------------------------------------------------------------

# Values each field can hold as a column (what can come off the wire): numbers of
# any sign and size, NaN and infinities, odd strings. posted_at and remaining have
# no NaN here: as a column NaN is their "absent" (None in a row).
COLUMN_VALUES: dict[str, list[Any]] = {
    "job_id": ["", "x" * 300, "ok", "a\x00b", "J0", "J3"],
    "user": ["", "x" * 257, "bob", "a\nb"],
    "group": ["", "g2", "\x7f"],
    "nodes": [0, 1, 8, -3, 10**9, 2**40],
    "open_op": [True, False],
    **{
        name: [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e30, 1.5, -0.5, 3.0]
        for name in ("priority", "demand", "usage_bytes", "progress", "transferred")
    },
    "released_at": [math.nan, math.inf, -math.inf, -1.0, 0.0, 2.0],
    "posted_at": [None, math.inf, -math.inf, -1.0, 0.0, 2.0],
    "remaining": [None, math.inf, -math.inf, -1.0, 0.0, 7.0],
}


def error_of(d: Digest) -> str | None:
    try:
        validate(d)
    except DigestError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("seed", range(40))
def test_the_column_check_gives_the_row_checks_verdict_and_message(seed: int) -> None:
    # The array check of a JobColumns digest must accept exactly what the row-by-row
    # check accepts and name the same first bad job and field.
    rng = random.Random(seed)
    failed = 0
    for _ in range(100):
        rows = [
            job(f"J{i}", nodes=rng.choice([1, 8]), demand=rng.choice([0.0, 5.0])) for i in range(5)
        ]
        for _ in range(rng.randint(0, 3)):
            i, name = rng.randrange(5), rng.choice(sorted(COLUMN_VALUES))
            rows[i] = dataclasses.replace(rows[i], **{name: rng.choice(COLUMN_VALUES[name])})
        as_rows = digest("R2", tuple(rows))
        as_columns = digest("R2", JobColumns.from_rows(rows))
        assert error_of(as_columns) == error_of(as_rows), rows
        failed += error_of(as_rows) is not None
    assert 10 < failed < 100  # both verdicts were exercised


def test_columns_of_different_lengths_are_rejected_by_name() -> None:
    good = JobColumns.from_rows([job("J1"), job("J2")])
    fields = {name: getattr(good, name) for name in JobColumns.__slots__}
    bad = digest("R2", JobColumns(**{**fields, "remaining": good.remaining[:1]}))
    with pytest.raises(DigestError) as err:
        validate(bad)
    assert err.value.field == "jobs.remaining"
    gv = GlobalView("R1")
    assert gv.receive(bad, 0.0).status is Status.REJECTED
    assert gv.live_peers() == []


def test_columns_and_rows_of_one_digest_are_equal_and_read_only() -> None:
    rows = (job("J1", remaining=5.0), job("J2", demand=0.0, transferred=3.0))
    cols = JobColumns.from_rows(rows)
    assert digest("R2", cols) == digest("R2", rows) and cols == rows
    assert tuple(cols) == rows and cols[1] == rows[1] and len(cols) == 2
    assert cols != JobColumns.from_rows((rows[0], job("J2", demand=0.0)))
    with pytest.raises(ValueError, match="read-only"):
        cols.demand[0] = 1.0
    with pytest.raises(AttributeError):
        cols.demand = cols.progress  # type: ignore[misc]


def reference_view(digests: list[Digest]) -> dict[str, JobView]:
    """The merge of GlobalView.system_view's docstring, job by job on rows (what
    system_view computed before it worked on columns)."""
    capacity = math.fsum(d.capacity for d in digests)
    b = min(d.node_bandwidth for d in digests)
    names = sorted({j.job_id for d in digests for j in d.jobs})
    out = {}
    for index, job_id in enumerate(names):
        seen = [(d, j) for d in digests for j in d.jobs if j.job_id == job_id]
        if not any(j.open_op for _, j in seen):
            continue
        first = seen[0][1]
        cap = min(first.nodes * b, capacity)
        posted = [j.posted_at for _, j in seen if j.posted_at is not None]
        open_remaining = [j.remaining for _, j in seen if j.open_op]
        work = 0.0
        for d, j in seen:
            local_cap = min(j.nodes * d.node_bandwidth, d.capacity)
            work = max(work, j.progress - (j.transferred / local_cap if local_cap > 0 else 0.0))
        moved = math.fsum(j.transferred for _, j in seen)
        out[job_id] = JobView(
            job_id,
            first.user,
            first.group,
            first.nodes,
            first.priority,
            cap,
            min(cap, math.fsum(j.demand for _, j in seen)),
            min(posted) if posted else None,
            0.0,
            None if None in open_remaining else math.fsum(open_remaining),
            0.0,
            min(j.released_at for _, j in seen),
            work + (moved / cap if cap > 0 else 0.0),
            0.0,
            0.0,
            index,
        )
    return out


@pytest.mark.parametrize("seed", range(40))
def test_system_view_on_columns_equals_the_job_by_job_merge(seed: int) -> None:
    rng = random.Random(5000 + seed)
    replicas = [f"r{i}" for i in range(rng.randint(1, 5))]
    placed: dict[str, list[JobDigest]] = {r: [] for r in replicas}
    for i in range(rng.randint(0, 30)):
        nodes = rng.choice([1, 2, 8, 64])
        for r in rng.sample(replicas, rng.randint(1, len(replicas))):
            open_op = rng.random() < 0.7
            placed[r].append(
                job(
                    f"j{i:02d}",
                    nodes=nodes if rng.random() < 0.9 else nodes + 1,  # a metadata conflict
                    demand=rng.choice([rng.uniform(1.0, 90.0), BIG]) if open_op else 0.0,
                    open_op=open_op,
                    posted_at=-rng.uniform(0.0, 9.0) if open_op else None,
                    remaining=rng.choice([None, rng.uniform(0.0, 1e4)]) if open_op else None,
                    progress=rng.uniform(0.0, 20.0),
                    transferred=rng.choice([0.0, rng.uniform(0.0, 5e3)]),
                    released_at=-rng.uniform(20.0, 60.0),
                    user=rng.choice(["u1", "u2"]),
                )
            )
    cluster = [
        digest(
            r,
            tuple(placed[r]),
            capacity=rng.choice([0.0, 50.0, 120.0]),
            node_bandwidth=rng.choice([10.0, 40.0]),
        )
        for r in replicas
    ]
    me, peers = cluster[0], cluster[1:]
    gv = GlobalView(me.replica_id)
    for d in peers:
        wire = dataclasses.replace(d, jobs=JobColumns.from_rows(d.jobs))  # as decoded
        assert gv.receive(wire, 0.0).accepted
    got = gv.system_view(me)
    expected = reference_view(cluster)
    assert list(got.jobs) == list(expected)
    assert got.capacity == math.fsum(d.capacity for d in cluster)
    for job_id, want in expected.items():
        row = got.jobs[job_id]
        for name in ("job_id", "user", "group", "nodes", "priority", "cap", "index"):
            assert getattr(row, name) == getattr(want, name), (job_id, name)
        for name in ("demand", "posted_at", "remaining", "released_at", "progress"):
            a, b = getattr(row, name), getattr(want, name)
            assert (a is None) == (b is None), (job_id, name)
            if a is not None:
                assert a == pytest.approx(b, rel=1e-12, abs=1e-12), (job_id, name)
        assert type(row.nodes) is int and type(row.demand) is float


@pytest.mark.parametrize("seed", range(30))
def test_each_replicas_column_is_its_part_of_the_matrix(seed: int) -> None:
    rng = random.Random(7000 + seed)
    cluster = random_cluster(rng, rng.choice(["group>user>size", "size-fair", "greedy-yield"]))
    for me in cluster:
        gv = GlobalView(me.replica_id)
        for d in cluster:
            if d is not me:
                assert gv.receive(d, now=0.0).accepted
        matrix = gv.targets(me, REGISTRY)
        assert list(matrix) == sorted(matrix)  # (job, replica) order
        mine = {j: x for (j, r), x in matrix.items() if r == me.replica_id}
        assert gv.column(me, REGISTRY) == mine
        assert list(mine) == [j.job_id for j in me.jobs]
