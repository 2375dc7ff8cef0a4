"""Metadata QoS on one replica: each live session's share of its job's metadata limit.

A job's limit on its metadata operations (`JobState.metadata_limit`: operations per second
for the whole job, 0 = none) is the ``metadata_ops`` of the operator's rule that binds it
(docs/rules.md), read through ``limit_of``; the clients enforce it (docs/client.md,
"Metadata operations"). The limit is the job's over all replicas: a replica takes its part,
the limit over the replicas the job is on (this one and the live peers whose digests list
it, ``holders``), so the parts sum to the limit. `MetadataQos` gives each live application
session of the job on this replica an equal share of that part, and offers it to the session's
outbox (`MetadataOutbox.offer_metadata`): every `Allocation` carries it as
``metadata_rate``, and a change reaches the client at once in a copy of the allocation in
force, as placement advice does (``controller/outbox.py``). Drain streams copy to the PFS
and are never paced here.

A share changes with the limit, the job's sessions and the replicas it is on: the servicer
calls `job_changed` when one of its sessions opens or closes, the rules' ``changed`` signal
calls `rules_changed`, and with peers every exchange that changes the split calls
`peers_changed` (a job seen on another replica halves its part here), for the jobs with a
limit only. The limits are the job table's; this module keeps only which jobs have one.
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


def session_share(job: JobState, replicas: int = 1) -> float:
    """The metadata operations per second each live session of ``job`` may make here, its
    job being on ``replicas`` replicas (0: no limit, or no live session to share it)."""
    live = sum(1 for s in job.sessions.values() if not s.closed)
    limit = job.metadata_limit
    if not live or not limit > 0 or not math.isfinite(limit):
        return 0.0
    return limit / max(1, replicas) / live


Holders = Callable[[set[str]], dict[str, list[str]]]  # job ids → the live peers listing each


class MetadataQos:
    """Offers every live session of ``table`` its share of its job's metadata limit, the
    limit of each job being ``limit_of(job_id)`` (`rules_limit`; None: whatever
    `JobState.metadata_limit` holds)."""

    def __init__(
        self,
        table: JobTable,
        limit_of: Callable[[str], float] | None = None,
        holders: Holders | None = None,
    ) -> None:
        self._table = table
        self._limit_of = limit_of
        self._holders = holders
        self._limited: set[str] = set()  # jobs given a limit when last looked at

    def rules_changed(self) -> None:
        """The rules changed: every job's limit is read again, and a changed share offered
        (jobs without a limit before or after cost a lookup)."""
        jobs = self._table.jobs
        limited = set()
        for job_id, job in jobs.items():
            before = job.metadata_limit
            if self._limit_of is not None:
                job.metadata_limit = self._limit_of(job_id)
            if before or job.metadata_limit:
                limited.add(job_id)
        self._reoffer(limited)

    def peers_changed(self) -> None:
        """The replicas' view changed (an exchange): the limited jobs' parts here again (a
        job now seen on another replica, or no longer)."""
        jobs = self._table.jobs
        self._reoffer({j for j in self._limited if j in jobs})

    def _reoffer(self, limited: set[str]) -> None:
        jobs = self._table.jobs
        where = self._holders(limited) if self._holders is not None and limited else {}
        for job_id in sorted(limited):
            self._offer(jobs[job_id], 1 + len(where.get(job_id, ())))
        self._limited = {j for j in limited if jobs[j].metadata_limit}

    def job_changed(self, job_id: str) -> None:
        """The job's limit or its sessions changed: offers each live session its share (an
        outbox that already holds that share sends nothing)."""
        job = self._table.jobs.get(job_id)
        if job is None:
            return
        if self._limit_of is not None:
            job.metadata_limit = self._limit_of(job_id)
        where = self._holders({job_id}) if self._holders is not None else {}
        self._offer(job, 1 + len(where.get(job_id, ())))
        if job.metadata_limit:
            self._limited.add(job_id)
        else:
            self._limited.discard(job_id)

    def _offer(self, job: JobState, replicas: int) -> None:
        share = session_share(job, replicas)
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
