"""Registered jobs: the authoritative metadata a resource manager gives, kept durable.

``POST /v1/jobs`` (a Slurm prolog) registers a job's metadata, ``DELETE /v1/jobs/<id>``
(an epilog) retires it. ``Registrations`` applies them to the job table (a registration
wins over what clients claim, for open and later sessions), saves them with the replica's
state (``state.json``, controller/state.py) before they count, and resumes them at start.
A registration that gives a job to another user ends that user's sessions of it
(docs/security.md): they reconnect, are refused, and their I/O goes to their own
default job.
"""

from __future__ import annotations

import logging

from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobMeta
from burstctl.controller.servicer import ControllerServicer
from burstctl.controller.state import RegisteredJob, ReplicaState, StateStore

log = logging.getLogger(__name__)


class Registrations:
    """The registered jobs of ``table``, saved in ``store``; ``servicer`` ends the sessions a
    registration takes a job from."""

    def __init__(self, table: JobTable, store: StateStore, servicer: ControllerServicer) -> None:
        self._table = table
        self._store = store
        self._servicer = servicer

    def resume(self, state: ReplicaState) -> None:
        """Registers again the jobs of the state loaded at start."""
        for job in state.jobs:
            self._table.register(
                JobMeta(
                    job.job_id,
                    job.user,
                    job.group,
                    job.nodes,
                    job.priority,
                    job.w,
                    job.vol_io,
                    app=job.app,
                )
            )
        if state.jobs:
            log.info("resumed %d registered jobs from %s", len(state.jobs), self._store.path)

    def register(self, meta: JobMeta) -> bool:
        """Registers (or updates) a job's authoritative metadata, persisted; True if new.

        If the state cannot be written the registration is not accepted: the
        table is left as it was and the ``OSError`` propagates.
        """
        table = self._table
        previous = table.registered.get(meta.job_id)
        live = table.jobs.get(meta.job_id)
        live_meta = live.meta if live is not None else None
        table.register(meta)
        try:
            self._save()
        except OSError:
            table.registered.pop(meta.job_id, None)
            if previous is not None:
                table.registered[meta.job_id] = previous
            if live_meta is not None:
                table.set_meta(live_meta)
            raise
        log.info("job %s registered: %s", meta.job_id, meta)
        self._servicer.end_foreign_sessions(meta)
        return previous is None

    def retire(self, job_id: str) -> bool:
        """Forgets a registration, persisted; False if the job was not registered."""
        meta = self._table.registered.get(job_id)
        if meta is None:
            return False
        self._table.retire(job_id)
        try:
            self._save()
        except OSError:
            self._table.register(meta)
            raise
        log.info("job %s retired", job_id)
        return True

    def _save(self) -> None:
        self._store.update(
            jobs=[
                RegisteredJob(
                    job_id=m.job_id,
                    user=m.user,
                    group=m.group,
                    nodes=m.nodes,
                    priority=m.priority,
                    w=m.w,
                    vol_io=m.vol_io,
                    app=m.app,
                )
                for m in sorted(self._table.registered.values(), key=lambda m: m.job_id)
            ]
        )
