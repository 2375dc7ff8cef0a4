"""Digests for the replica tests: a job of a digest and a digest, with the defaults these
tests share (B_r = C, b never the binding cap, a local demand that never binds)."""

from __future__ import annotations

from typing import Any

from burstctl.controller.digest import Digest, JobDigest

C = 100.0
B_NODE = 1e9  # b: never the binding cap here
BIG = 1e6  # a local demand that never binds


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
