"""The global view of several replicas and each replica's share of it: Figure 5,
determinism, equality with one controller on the union of the jobs, metadata
conflicts, and the merge against a job-by-job reference."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
from digests import B_NODE, BIG, C, digest, exchange, job, per_job, per_replica
from support import views

from burstctl.controller.digest import Digest, JobDigest
from burstctl.controller.digest_wire import from_proto, to_proto
from burstctl.controller.membership import Membership
from burstctl.controller.merge import Conflict, merge, split_targets
from burstctl.policies.decision import decide
from burstctl.policies.registry import default_registry
from burstctl.policies.view import JobView

REGISTRY = default_registry()


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
        m = Membership(me.replica_id)
        assert m.receive(peer, now=0.0).accepted
        t, rates = exchange(m, me)
        assert t == pytest.approx({"J1": total / 2, "J2": total / 4, "J3": total / 4})
        assert rates == pytest.approx(expected)
        assert per_job(rates) == pytest.approx({"J1": total / 2, "J2": total / 4, "J3": total / 4})
        cols = per_replica(rates)
        assert cols["R1"] <= c1 + 1e-9
        assert cols["R2"] <= c2 + 1e-9


def test_before_the_first_exchange_each_replica_is_locally_fair() -> None:
    r1, _ = figure5(C, C)
    _, rates = exchange(Membership("R1"), r1)
    assert rates == pytest.approx({("J1", "R1"): 2 * C / 3, ("J2", "R1"): C / 3})


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
            sequence=rng.randint(1, 9),
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
            noise = [dataclasses.replace(d, sequence=d.sequence - 1) for d in peers] + peers
            rng.shuffle(noise)
            m = Membership(me.replica_id)
            for d in noise:  # older sequences before or after: never matters
                m.receive(d, now=0.0)
            _, rates = exchange(m, me)
            results.append(list(rates.items()))
    assert all(r == results[0] for r in results)  # bit for bit, in the same order
    cols = per_replica(dict(results[0]))
    for d in cluster:
        assert cols.get(d.replica_id, 0.0) <= d.capacity * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(30))
def test_global_targets_equal_one_controller_on_the_union(seed: int) -> None:
    rng = random.Random(1000 + seed)
    cluster = random_cluster(rng, "group>user>size")
    me, peers = cluster[0], cluster[1:]
    m = Membership(me.replica_id)
    for d in peers:
        assert m.receive(d, now=0.0).accepted

    # One controller that sees every job with its total demand, capacity Σ B_r.
    capacity = sum(d.capacity for d in cluster)
    union: dict[str, JobView] = {}
    for index, job_id in enumerate(sorted({j.job_id for d in cluster for j in d.jobs})):
        copies = [j for d in cluster for j in d.jobs if j.job_id == job_id]
        demand = min(capacity, sum(j.demand for j in copies))
        if demand > 0:
            union[job_id] = views.job(
                job_id,
                capacity,
                demand,
                user=copies[0].user,
                group=copies[0].group,
                nodes=copies[0].nodes,
                priority=copies[0].priority,
                index=index,
            )
    single = decide(
        REGISTRY.create("group>user>size"),
        views.view(*union.values(), capacity=capacity, node_bandwidth=B_NODE),
    ).rates
    expected = {j: single.get(j, 0.0) for j in union}
    targets, rates = exchange(m, me)
    assert targets == pytest.approx(expected, abs=1e-9)

    cols = per_replica(rates)
    for d in cluster:
        assert cols.get(d.replica_id, 0.0) <= d.capacity * (1 + 1e-9)
    for (j, r), x in rates.items():
        local = next(
            jd.demand for d in cluster if d.replica_id == r for jd in d.jobs if jd.job_id == j
        )
        assert 0.0 <= x <= local * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(30))
def test_each_replicas_share_is_its_part_of_the_matrix(seed: int) -> None:
    rng = random.Random(7000 + seed)
    cluster = random_cluster(rng, rng.choice(["group>user>size", "size-fair", "greedy-yield"]))
    for me in cluster:
        m = Membership(me.replica_id)
        for d in cluster:
            if d is not me:
                assert m.receive(d, now=0.0).accepted
        merged = merge(m.digests(me))
        policy = REGISTRY.create(me.policy)
        x = split_targets(merged, decide(policy, merged.view).rates)
        matrix = merged.by_edge(x)
        assert list(matrix) == sorted(matrix)  # (job, replica) order
        mine = {j: rate for (j, r), rate in matrix.items() if r == me.replica_id}
        assert merged.share(x, me.replica_id) == mine
        assert list(mine) == [j.job_id for j in me.jobs]


# -- the merge -------------------------------------------------------------------------


def test_metadata_conflicts_resolve_to_the_lowest_replica_id_and_are_reported() -> None:
    r1 = digest("R1", (job("J1", nodes=16, user="alice"),))
    r2 = digest("R2", (job("J1", nodes=2, user="mallory"),))
    for me, peer in ((r1, r2), (r2, r1)):
        m = Membership(me.replica_id)
        assert m.receive(peer, 0.0).accepted
        merged = merge(m.digests(me))
        row = merged.view.jobs["J1"]
        assert (row.nodes, row.user) == (16, "alice")
        assert row.demand == pytest.approx(2 * C)  # Σ d_jr, capped at b_i ≤ Σ B_r
        assert merged.conflicts == (
            Conflict("J1", "user", "R2", "mallory", "alice"),
            Conflict("J1", "nodes", "R2", 2, 16),
        )
    assert merge([r1, dataclasses.replace(r2, jobs=r1.jobs)]).conflicts == ()


def test_relative_times_merge_to_the_earliest() -> None:
    r1 = digest("R1", (job("J1", released_at=-30.0, posted_at=-2.0, progress=4.0),))
    r2 = digest("R2", (job("J1", released_at=-31.0, posted_at=-1.0, progress=5.0),))
    m = Membership("R1")
    m.receive(r2, 0.0)
    view = merge(m.digests(r1)).view
    row = view.jobs["J1"]
    assert (row.released_at, row.posted_at, row.progress) == (-31.0, -2.0, 5.0)
    assert row.yield_at(0.0) == pytest.approx(5.0 / 31.0)
    assert view.now == 0.0 and view.observed is False  # offsets and summaries: not observed


def test_times_are_read_against_each_digests_send_instant() -> None:
    # the same offsets as above, as instants on each sender's own clock
    r1 = digest("R1", (job("J1", released_at=70.0, posted_at=98.0),), sent_at=100.0)
    r2 = digest("R2", (job("J1", released_at=969.0, posted_at=999.0),), sent_at=1000.0)
    row = merge([r1, r2]).view.jobs["J1"]
    assert (row.released_at, row.posted_at) == (-31.0, -2.0)


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
    m = Membership("R1")
    assert m.receive(r2, now=0.0).accepted
    merged = merge(m.digests(r1)).view.jobs["J"]
    assert merged.cap == 60.0
    assert merged.progress == pytest.approx(3.0 + 220.0 / 60.0)


def reference_view(digests: list[Digest]) -> dict[str, JobView]:
    """The merge of merge()'s docstring, job by job on rows."""
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


def reference_conflicts(digests: list[Digest]) -> list[Conflict]:
    """Every entry whose metadata differs from its job's entry on the lowest replica id,
    in replica id order, then digest order, then field order."""
    first: dict[str, JobDigest] = {}
    out = []
    for d in digests:
        for j in d.jobs:
            ref = first.setdefault(j.job_id, j)
            for name in ("user", "group", "nodes", "priority"):
                if getattr(j, name) != getattr(ref, name):
                    out.append(
                        Conflict(j.job_id, name, d.replica_id, getattr(j, name), getattr(ref, name))
                    )
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_merge_equals_the_job_by_job_reference(seed: int) -> None:
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
    m = Membership(me.replica_id)
    for d in peers:
        wire = from_proto(to_proto(d))  # as decoded
        assert m.receive(wire, 0.0).accepted
    merged = merge(m.digests(me))
    got = merged.view
    expected = reference_view(cluster)
    assert list(got.jobs) == list(expected)
    assert got.capacity == math.fsum(d.capacity for d in cluster)
    assert got.node_bandwidth == min(d.node_bandwidth for d in cluster)
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
    assert list(merged.conflicts) == reference_conflicts(cluster)
    # the next merge of digests with the same job ids, users and groups (the same column
    # objects) takes this one's layout, and gives the same bits
    again = merge(m.digests(me), merged.layout)
    assert again.layout is merged.layout or not list(got.jobs)
    assert again.view == merged.view and again.conflicts == merged.conflicts
    for name in ("job_of", "replica_of", "demand", "capacity", "cap"):
        assert np.array_equal(getattr(again, name), getattr(merged, name)), name
    if merged.layout is not None and len(cluster) > 1:  # another digest: a layout of its own
        other = [*m.digests(me)[:-1], digest(cluster[-1].replica_id, (job("zz"),))]
        assert merge(other, merged.layout).layout is not merged.layout
