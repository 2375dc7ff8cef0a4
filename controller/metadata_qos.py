"""Metadata QoS on one replica: each live session's share of its job's metadata limit.

A job's limit on its metadata operations (`JobState.metadata_limit`: operations per second
for the whole job, 0 = none) is set by whoever decides it (the operator's rules); the clients
enforce it (docs/client.md, "Metadata operations"). `MetadataQos` gives each live application
session of the job on this replica an equal share, ``limit / its live sessions here``, and
offers it to the session's outbox (`MetadataOutbox.offer_metadata`): every `Allocation`
carries it as ``metadata_rate``, and a change reaches the client at once in a copy of the
allocation in force, as placement advice does (``controller/outbox.py``). Drain streams copy
to the PFS and are never paced here.

A share changes with the limit and with the job's sessions: the servicer calls `job_changed`
when one of its sessions opens or closes, and whoever sets a job's limit calls `set_limit`
(or sets the attribute and calls `job_changed`). The state is the job table's; this module
keeps none.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobState


@runtime_checkable
class MetadataOutbox(Protocol):
    """A session's outbox that carries a metadata rate (``StreamOutbox``)."""

    def offer_metadata(self, rate: float) -> None: ...


def session_share(job: JobState) -> float:
    """The metadata operations per second each live session of ``job`` may make here (0: no
    limit, or no live session to share it)."""
    live = sum(1 for s in job.sessions.values() if not s.closed)
    limit = job.metadata_limit
    if not live or not limit > 0 or not math.isfinite(limit):
        return 0.0
    return limit / live


class MetadataQos:
    """Offers every live session of ``table`` its share of its job's metadata limit."""

    def __init__(self, table: JobTable) -> None:
        self._table = table

    def set_limit(self, job_id: str, limit: float) -> bool:
        """Sets the job's limit (ops/s for the whole job, 0 = none) and tells its sessions.
        False when the table holds no such job (nothing to set: its first session's open
        finds whatever the caller sets on the new job then)."""
        if not 0.0 <= limit < math.inf:  # also NaN
            raise ValueError(f"a metadata limit must be >= 0 and finite, got {limit!r}")
        job = self._table.jobs.get(job_id)
        if job is None:
            return False
        job.metadata_limit = float(limit)
        self.job_changed(job_id)
        return True

    def job_changed(self, job_id: str) -> None:
        """The job's limit or its sessions changed: offers each live session its share (an
        outbox that already holds that share sends nothing)."""
        job = self._table.jobs.get(job_id)
        if job is None:
            return
        share = session_share(job)
        for session in job.sessions.values():
            outbox = session.outbox
            if not session.closed and isinstance(outbox, MetadataOutbox):
                outbox.offer_metadata(share)
