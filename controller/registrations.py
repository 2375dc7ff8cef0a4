"""Registered jobs: the authoritative metadata a resource manager gives, on every replica.

``POST /v1/jobs`` (a Slurm prolog) registers a job's metadata, ``DELETE /v1/jobs/<id>``
(an epilog) retires it, on any replica. ``Registrations`` makes each one a record of the
replicated catalog (controller/catalog.py: a newer ``(version, origin)`` wins on every
replica), applies it to the job table (a registration wins over what clients claim, for open
and later sessions), saves it with the replica's state (``state.json``, controller/state.py)
before it counts, and resumes the saved ones at start, before any peer is heard. A peer's
registration or retirement that wins here (``Catalog.adopted``) is applied and saved the same
way. A registration that gives a job to another user ends that user's sessions of it
(docs/security.md): they reconnect, are refused, and their I/O goes to their own default job.
"""

from __future__ import annotations

import logging

from burstctl.controller.catalog import (
    REGISTRATION,
    REGISTRATION_FIELDS,
    RETIRED,
    Catalog,
    CatalogRecord,
)
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobMeta
from burstctl.controller.servicer import ControllerServicer
from burstctl.controller.state import RegisteredJob, ReplicaState, StateStore

log = logging.getLogger(__name__)


class CatalogFull(Exception):
    """A new registration with the catalog at its bound (``catalog.MAX_REGISTRATIONS``)."""


def _meta(record: CatalogRecord) -> JobMeta:
    return JobMeta(record.key, **{f: getattr(record, f) for f in REGISTRATION_FIELDS})


def _record(job: RegisteredJob, replica_id: str) -> CatalogRecord:
    kind = RETIRED if job.retired else REGISTRATION
    body = {} if job.retired else {f: getattr(job, f) for f in REGISTRATION_FIELDS}
    # Version 0: saved by an older burstctl, before registrations were exchanged.
    version, origin = max(1, job.version), job.origin or replica_id
    return CatalogRecord(kind, job.job_id, version, origin, job.changed_at, **body)


def _saved(r: CatalogRecord) -> RegisteredJob:
    return RegisteredJob(
        job_id=r.key,
        **{f: getattr(r, f) for f in REGISTRATION_FIELDS},
        version=r.version,
        origin=r.origin,
        changed_at=r.changed_at,
        retired=r.kind == RETIRED,
    )


class Registrations:
    """The registered jobs of ``table``, records of ``catalog``, saved in ``store``;
    ``servicer`` ends the sessions a registration takes a job from."""

    def __init__(
        self,
        table: JobTable,
        store: StateStore,
        servicer: ControllerServicer,
        catalog: Catalog,
    ) -> None:
        self._table = table
        self._store = store
        self._servicer = servicer
        self._catalog = catalog
        self._adopted_count = 0  # peers' records applied and not saved yet
        catalog.adopted.connect(self._adopted)
        catalog.settled.connect(self._settled)

    def resume(self, state: ReplicaState) -> None:
        """Registers again the jobs of the state loaded at start."""
        catalog = self._catalog
        saved = (_record(job, catalog.replica_id) for job in state.jobs)
        catalog.resume(saved, state.catalog_clock)
        registered = catalog.registered()
        for record in registered:
            self._table.register(_meta(record))
        if registered:
            log.info("resumed %d registered jobs from %s", len(registered), self._store.path)

    def register(self, meta: JobMeta) -> bool:
        """Registers (or updates) a job's authoritative metadata, persisted; True if new.

        If the state cannot be written the registration is not accepted: the
        table is left as it was and the ``OSError`` propagates. ``CatalogFull`` when
        the catalog holds as many registrations as it may.
        """
        table, catalog = self._table, self._catalog
        previous = table.registered.get(meta.job_id)
        if previous is None and catalog.full():
            raise CatalogFull(f"{len(catalog.registrations)} registrations: the catalog is full")
        live = table.jobs.get(meta.job_id)
        live_meta = live.meta if live is not None else None
        body = {f: getattr(meta, f) for f in REGISTRATION_FIELDS}
        record = catalog.stamp(REGISTRATION, meta.job_id, **body)
        held = catalog.put(record)
        table.register(meta)
        try:
            self._save()
        except OSError:
            catalog.restore(meta.job_id, held)
            table.registered.pop(meta.job_id, None)
            if previous is not None:
                table.registered[meta.job_id] = previous
            if live_meta is not None:
                table.set_meta(live_meta)
            raise
        log.info("job %s registered: %s (version %d)", meta.job_id, meta, record.version)
        self._servicer.end_foreign_sessions(meta)
        return previous is None

    def retire(self, job_id: str) -> bool:
        """Forgets a registration, persisted; False if the job was not registered."""
        meta = self._table.registered.get(job_id)
        if meta is None:
            return False
        held = self._catalog.put(self._catalog.stamp(RETIRED, job_id))
        self._table.retire(job_id)
        try:
            self._save()
        except OSError:
            self._catalog.restore(job_id, held)
            self._table.register(meta)
            raise
        log.info("job %s retired", job_id)
        return True

    def _adopted(self, record: CatalogRecord, _previous: CatalogRecord | None) -> None:
        """A peer's registration or retirement that won here: applied as a local one."""
        if record.kind == REGISTRATION:
            meta = _meta(record)
            self._table.register(meta)
            self._servicer.end_foreign_sessions(meta)
        else:
            self._table.retire(record.key)
        log.debug(
            "job %s %s by replica %r (version %d)",
            record.key,
            "registered" if record.kind == REGISTRATION else "retired",
            record.origin,
            record.version,
        )
        self._adopted_count += 1

    def _settled(self) -> None:
        """A peer's records are all taken: saved once for all of them (a replica that joins
        a cluster takes every registration in one digest)."""
        count, self._adopted_count = self._adopted_count, 0
        if not count:
            return
        log.info("took %d registrations and retirements from the peers", count)
        try:
            self._save()
        except OSError as exc:  # applied all the same: peers hold them, the next save keeps them
            log.error("could not save %d registrations from the peers: %s", count, exc)

    def _save(self) -> None:
        catalog = self._catalog
        self._store.update(
            jobs=[_saved(catalog.registrations[k]) for k in sorted(catalog.registrations)],
            catalog_clock=catalog.clock,
        )
