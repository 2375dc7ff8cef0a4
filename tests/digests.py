"""Digests for the replica tests: a job of a digest and a digest, with the defaults these
tests share (B_r = C, b never the binding cap, a local demand that never binds), a digest
that uses every field (the wire tests), one exchange as a replica computes it, and sums of
a split by job and by replica."""

from __future__ import annotations

from typing import Any

from burstctl.controller.digest import BufferHeader, Digest, JobDigest, PatternOrigin
from burstctl.controller.membership import Membership
from burstctl.controller.merge import merge, split_targets
from burstctl.controller.split import Edge
from burstctl.policies.decision import decide
from burstctl.policies.registry import default_registry

C = 100.0
B_NODE = 1e9  # b: never the binding cap here
BIG = 1e6  # a local demand that never binds
REGISTRY = default_registry()


def job(job_id: str, nodes: int = 8, demand: float = BIG, **kw: Any) -> JobDigest:
    """A job of a digest with an open operation when it has demand."""
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


def digest(rid: str, jobs: Any = (), **kw: Any) -> Digest:
    """Replica ``rid``'s digest of ``jobs`` (size-fair, version 0, sequence 1)."""
    fields: dict[str, Any] = {
        "incarnation": 1,
        "sequence": 1,
        "capacity": C,
        "node_bandwidth": B_NODE,
        "policy": "size-fair",
        "policy_params": {},
        "policy_version": 0,
    }
    fields.update(kw)
    return Digest(replica_id=rid, jobs=jobs, **fields)


# Every field set, absent optionals included: what the wire must carry unchanged.
FULL_ROWS = (
    JobDigest("a", "u", "g", 4, 1.5, 40.0, 10.0, 2.0, -3.0, -1.0, 500.0, True, 77.0),
    JobDigest("b", "u", "g", 1, 1.0, 0.0, 0.0, 0.0, -1.0),
    JobDigest(
        "c",
        "u",
        "g",
        2,
        1.0,
        0.0,
        0.0,
        0.0,
        -1.0,
        period_w=0.5,
        period_vol=1e6,
        period_learned=True,
        resident=3.0,
        pending=2.0,
        mean_volume=5e5,
    ),
)
FULL_DIGEST = Digest(
    replica_id="r1",
    incarnation=7,
    sequence=3,
    capacity=100.0,
    node_bandwidth=10.0,
    policy="size-fair",
    policy_params={"x": [1, 2]},
    policy_version=2,
    jobs=FULL_ROWS,
    sent_at=10.0,
    buffer=BufferHeader(1e9, 4e8, 1e8),
    pattern=PatternOrigin("k1", 9.5),
)


def exchange(membership: Membership, me: Digest) -> tuple[dict[str, float], dict[Edge, float]]:
    """One exchange as ``me`` computes it: the elected policy's global targets t_j on
    the merge of the live digests (0 for a job it leaves out), and their split x_jr."""
    elected = membership.elected(me)
    merged = merge(membership.digests(me))
    policy = REGISTRY.create(elected.policy, elected.policy_params)
    targets = decide(policy, merged.view).rates
    x = merged.by_edge(split_targets(merged, targets))
    return {j: targets.get(j, 0.0) for j in merged.view.jobs}, x


def per_job(rates: dict[Edge, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (j, _), x in rates.items():
        out[j] = out.get(j, 0.0) + x
    return out


def per_replica(rates: dict[Edge, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (_, r), x in rates.items():
        out[r] = out.get(r, 0.0) + x
    return out
