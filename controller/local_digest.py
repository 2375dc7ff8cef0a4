"""This replica's digest: what its job table, its buffer's books and its pattern say now.

``build_digest`` turns the job table into the columns of a :class:`~digest.Digest`
(``controller/digest.py`` holds the types, the check and the wire): per active job its
metadata, local demand, bytes, progress and times as instants on this replica's clock, its
period (declared, or learned here once confident) and its bytes on this replica's burst
buffer; in the header, the buffer's size, fill and drain bandwidth, and the origin of the
periodic pattern this replica coordinates. docs/replicas.md, "Digests".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from burstctl.controller.catalog import CatalogRecord
from burstctl.controller.digest import (
    NO_BUFFER,
    NO_PATTERN,
    ROW_FIELDS,
    BufferHeader,
    Digest,
    DigestJobs,
    PatternOrigin,
)
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobStatus
from burstctl.policies.view import BufferView, JobId, job_cap


def build_digest(
    table: JobTable,
    *,
    replica_id: str,
    incarnation: int,
    sequence: int,
    capacity: float,
    node_bandwidth: float,
    policy: tuple[str, Mapping[str, Any], int, str],
    usage_seen: dict[JobId, int],
    now: float,
    buffer: BufferView | None = None,
    pattern: PatternOrigin = NO_PATTERN,
    catalog: tuple[CatalogRecord, ...] = (),
) -> Digest:
    """This replica's digest at ``now``, with ``policy`` = (name, params, version, origin),
    ``buffer`` the books as the policies see them (None: no buffer), ``pattern`` the
    origin of the pattern this replica coordinates and ``catalog`` the records it holds
    (controller/catalog.py); ``usage_seen`` (bytes moved per job at the previous digest) is
    updated in place."""
    rows: list[tuple[Any, ...]] = []
    nan = math.nan
    resident = buffer.resident if buffer is not None else {}
    pending = buffer.pending if buffer is not None else {}
    for job_id in sorted(table.jobs):
        job = table.jobs[job_id]
        if job.status is not JobStatus.ACTIVE:
            usage_seen.pop(job_id, None)
            continue
        meta = job.meta
        cap = job_cap(meta.nodes, node_bandwidth, capacity)
        ops = list(job.open_ops())
        moved = job.bytes_moved - usage_seen.get(job_id, 0)
        usage_seen[job_id] = job.bytes_moved
        if ops:
            demand = table.job_demand(job, cap)
            posted = min(now, min(o.posted_at for o in ops))
            known = all(o.volume > 0 for o in ops)
            remaining = sum(max(0, o.volume - o.moved) for o in ops) if known else nan
        else:
            demand, posted, remaining = 0.0, nan, nan
        period = table.periodic_of(job)
        row = (
            job_id,
            meta.user,
            meta.group,
            meta.nodes,
            meta.priority,
            demand,
            max(0, moved),  # usage_bytes
            max(0.0, job.progress(now, cap)),
            min(now, job.first_seen),  # released_at
            posted,
            remaining,
            bool(ops),  # open_op
            job.transferred,
            nan if period is None else period.w,
            nan if period is None else period.vol_io,
            period is not None and period.learned,
            resident.get(job_id, 0.0),
            pending.get(job_id, 0.0),
            job.mean_volume() if period is not None else 0.0,  # read for periodic jobs
        )
        rows.append(row)
    for job_id in [j for j in usage_seen if j not in table.jobs]:
        del usage_seen[job_id]
    name, params, version, origin = policy
    books = (
        NO_BUFFER
        if buffer is None
        else BufferHeader(buffer.size, buffer.used, buffer.drain_bandwidth)
    )
    return Digest(
        replica_id=replica_id,
        incarnation=incarnation,
        sequence=sequence,
        capacity=float(capacity),
        node_bandwidth=float(node_bandwidth),
        policy=name,
        policy_params=dict(params),
        policy_version=version,
        policy_origin=origin,
        sent_at=now,
        jobs=DigestJobs(**dict(zip(ROW_FIELDS, zip(*rows, strict=True), strict=True)))
        if rows
        else DigestJobs.from_rows(()),
        buffer=books,
        pattern=pattern,
        catalog=catalog,
    )
