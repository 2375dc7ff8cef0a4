"""Metadata QoS on one replica: each live session's share of its job's metadata limit.

A job's limit on its metadata operations (`JobState.metadata_limit`: operations per second
for the whole job, 0 = none) is the ``metadata_ops`` of the operator's rule that binds it
(docs/rules.md), read through ``limit_of``; the clients enforce it (docs/client.md,
"Metadata operations"). `MetadataQos` gives each live application session of the job on this
replica an equal share, ``limit / its live sessions here``, and offers it to the session's
outbox (`MetadataOutbox.offer_metadata`): every `Allocation` carries it as
``metadata_rate``, and a change reaches the client at once in a copy of the allocation in
force, as placement advice does (``controller/outbox.py``). Drain streams copy to the PFS
and are never paced here.

A share changes with the limit and with the job's sessions: the servicer calls `job_changed`
when one of its sessions opens or closes, and the rules' ``changed`` signal calls
`rules_changed`. The state is the job table's; this module keeps none.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobState
from burstctl.controller.rulebook import RuleBook


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
    """Offers every live session of ``table`` its share of its job's metadata limit, the
    limit of each job being ``limit_of(job_id)`` (`rules_limit`; None: whatever
    `JobState.metadata_limit` holds)."""

    def __init__(self, table: JobTable, limit_of: Callable[[str], float] | None = None) -> None:
        self._table = table
        self._limit_of = limit_of

    def rules_changed(self) -> None:
        """The rules changed: every job's limit is read again, and a changed share offered."""
        for job_id in list(self._table.jobs):
            self.job_changed(job_id)

    def job_changed(self, job_id: str) -> None:
        """The job's limit or its sessions changed: offers each live session its share (an
        outbox that already holds that share sends nothing)."""
        job = self._table.jobs.get(job_id)
        if job is None:
            return
        if self._limit_of is not None:
            job.metadata_limit = self._limit_of(job_id)
        share = session_share(job)
        for session in job.sessions.values():
            outbox = session.outbox
            if not session.closed and isinstance(outbox, MetadataOutbox):
                outbox.offer_metadata(share)


def rules_limit(rules: RuleBook) -> Callable[[str], float]:
    """A job's metadata limit as the rules set it: the ``metadata_ops`` of the rule that
    binds the job (0: none binds it, or it sets none)."""

    def limit_of(job_id: str) -> float:
        rule = rules.rule_of(job_id)
        return 0.0 if rule is None else float(rule.metadata_ops)

    return limit_of
