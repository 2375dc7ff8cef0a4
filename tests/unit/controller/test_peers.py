"""Digests on the wire and from the job table; the scheduler's use of the global column."""

from __future__ import annotations

import pytest

from burstctl.controller.global_view import Digest, DigestError, JobDigest
from burstctl.controller.jobs import JobMeta, JobTable, OpKind
from burstctl.controller.peers import build_digest, digest_from_proto, digest_to_proto
from burstctl.controller.scheduler import Scheduler
from burstctl.policies.registry import default_registry
from burstctl.policies.view import JobView, SystemView
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

DIGEST = Digest(
    replica_id="r1",
    incarnation=7,
    epoch=3,
    capacity=100.0,
    node_bandwidth=10.0,
    policy="size-fair",
    policy_params={"x": [1, 2]},
    policy_version=2,
    jobs=(
        JobDigest("a", "u", "g", 4, 1.5, 40.0, 10.0, 2.0, -3.0, -1.0, 500.0, True),
        JobDigest("b", "u", "g", 1, 1.0, 0.0, 0.0, 0.0, -1.0),
    ),
)


def test_round_trip_keeps_every_field_including_absent_optionals() -> None:
    wire = digest_to_proto(DIGEST).SerializeToString()
    assert digest_from_proto(pb.Digest.FromString(wire)) == DIGEST


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda m: setattr(m.jobs[1], "nodes", 0), "jobs[1].nodes"),
        (lambda m: setattr(m, "capacity", float("nan")), "capacity"),
        (lambda m: setattr(m, "policy_params_json", "{"), "policy_params_json"),
        (lambda m: setattr(m, "policy_params_json", "[1]"), "policy_params_json"),
        (lambda m: setattr(m, "epoch", -1), "epoch"),
        (
            lambda m: setattr(m.jobs[0], "demand", 5.0) or setattr(m.jobs[0], "open_op", False),
            "jobs[0].demand",
        ),
    ],
)
def test_malformed_proto_names_the_field(edit, field: str) -> None:
    msg = digest_to_proto(DIGEST)
    edit(msg)
    with pytest.raises(DigestError) as err:
        digest_from_proto(msg)
    assert err.value.field == field


def test_digest_of_the_job_table() -> None:
    now = [100.0]
    table = JobTable(lambda: now[0], heartbeat_timeout=3, job_retention=10, demand_headroom=1.1)
    s = table.open_session(JobMeta("j", "u", "g", 2, 1.0), "c", "h")
    table.open_session(JobMeta("idle", "u", "g", 1, 1.0), "c", "h")
    now[0] = 101.0
    table.post(s, 1, OpKind.WRITE, 1000)
    table.usage(s, 300, 1, 0.0, 0.25, False)
    now[0] = 102.0
    seen: dict[str, int] = {}
    kwargs = dict(
        replica_id="r1",
        incarnation=1,
        capacity=100.0,
        node_bandwidth=10.0,
        policy="fair-share",
        policy_params={},
        policy_version=0,
        usage_seen=seen,
    )
    d = build_digest(table, epoch=1, now=now[0], **kwargs)  # type: ignore[arg-type]
    idle, j = d.jobs
    assert (j.job_id, j.open_op, j.released_at, j.posted_at, j.remaining) == (
        "j",
        True,
        -2.0,
        -1.0,
        700.0,
    )
    assert j.usage_bytes == 300 and j.demand > 0
    assert (idle.open_op, idle.demand, idle.posted_at) == (False, 0.0, None)
    d2 = build_digest(table, epoch=2, now=now[0], **kwargs)  # type: ignore[arg-type]
    assert d2.jobs[1].usage_bytes == 0  # only what moved since the previous digest


def test_global_column_for_known_jobs_local_policy_for_newer_ones() -> None:
    def row(j: str, nodes: int, index: int) -> JobView:
        return JobView(j, "u", "g", nodes, 1.0, cap=100.0, demand=100.0, index=index)

    view = SystemView(
        now=0.0,
        capacity=100.0,
        node_bandwidth=100.0,
        jobs={"a": row("a", 1, 0), "b": row("b", 1, 1), "c": row("c", 3, 2)},
    )
    policy = default_registry().create("size-fair", {})
    rates = Scheduler._global(view, policy, {"a": 40.0, "gone": 10.0})
    assert rates["a"] == 40.0 and "gone" not in rates
    # b and c arrived after the exchange: size-fair over what is left (60), 1:3
    assert rates["b"] == pytest.approx(15.0) and rates["c"] == pytest.approx(45.0)
