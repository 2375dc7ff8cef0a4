"""What live placement advice is computed from, as one replica knows it (docs/placement-live.md).

``PlacementInputs`` gathers, on the event loop, the inputs of ``controller/advice.py``: the
live replicas (this one and the live peers, with their gRPC addresses and capacities), the
jobs advice is given for (registered ones and those with live sessions here, each with what
its application's profile knows), and where each job is present (this replica when it has
live sessions here, and the live peers whose last digest lists it), which the profiles'
phase recorder also reads to scale a phase to the replicas it was striped over.

``AdviceFeed`` tells every session of this replica the replicas its job is advised now
(``Allocation.advice``, docs/placement-live.md "Following the advice"): every λ (at least
``ADVICE_MIN_PERIOD`` apart), while it has sessions, when its inputs differ from the last
computation's (the live replicas, the profiles, the jobs), it computes the advice as
``GET /v1/placement`` does (the default allocator and placement) in a worker thread, and
offers each session its job's addresses; a session's outbox sends only a change.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, runtime_checkable

from burstctl.controller.advice import JobInput, Resource, advise_all
from burstctl.controller.jobs import JobTable
from burstctl.controller.peers import PeerSync
from burstctl.controller.profiles import ProfileStore, app_key
from burstctl.controller.records import JobMeta, JobStatus
from burstctl.controller.server import GrpcServer

log = logging.getLogger(__name__)

# The advice feed looks at its inputs at most this often (s): the advice over a thousand jobs
# takes tens of ms (docs/benchmarks.md, "placement_speed"), and a session moves only at its
# next phase start anyway.
ADVICE_MIN_PERIOD = 1.0


class PlacementInputs:
    """The inputs of placement advice of replica ``replica_id`` (module docstring)."""

    def __init__(
        self,
        replica_id: str,
        capacity: float,
        *,
        table: JobTable,
        profiles: ProfileStore,
        grpc: GrpcServer,
        peers: PeerSync | None,
    ) -> None:
        self.replica_id = replica_id
        self.capacity = capacity
        self._table = table
        self._profiles = profiles
        self._grpc = grpc
        self._peers = peers

    @property
    def profiles_version(self) -> int:
        """Changes with every change of the profiles (the advice's input)."""
        return self._profiles.version

    def resources(self) -> list[Resource]:
        """This replica and its live peers, with their gRPC addresses and capacities."""
        out = [Resource(self.replica_id, self._grpc.advertised_address, self.capacity)]
        sync = self._peers
        if sync is None:
            return out
        addresses = {
            link.replica_id: link.address for link in sync.links if link.replica_id is not None
        }
        for rid in sync.membership.live_peers():
            heard = sync.membership.last_heard(rid)
            if heard is not None and rid in addresses:
                out.append(Resource(rid, addresses[rid], heard[0].capacity))
        return out

    def presence(self, wanted: set[str] | None = None) -> dict[str, list[str]]:
        """Job id -> the replicas it has live sessions on (this one, and the live peers whose
        last digest lists it), for the ``wanted`` jobs (None: every job)."""
        where: dict[str, list[str]] = {}
        for job_id, job in self._table.jobs.items():
            if job.sessions and (wanted is None or job_id in wanted):
                where[job_id] = [self.replica_id]
        if self._peers is not None:
            for job_id, peers in self._peers.membership.holders(wanted).items():
                where.setdefault(job_id, []).extend(peers)
        return where

    def count(self, job_id: str) -> int:
        """The number of replicas ``job_id`` is present on (`presence`)."""
        return len(self.presence({job_id}).get(job_id, ()))

    def jobs(self) -> list[JobInput]:
        """The jobs advice is given for: registered ones and those with live sessions here,
        each with what its application's profile knows."""
        table = self._table
        metas: dict[str, JobMeta] = dict(table.registered)
        for job_id, job in table.jobs.items():
            if job.status is JobStatus.ACTIVE and job.sessions:
                metas.setdefault(job_id, job.meta)
        return [self.job_input(metas[job_id]) for job_id in sorted(metas)]

    def job_input(self, meta: JobMeta) -> JobInput:
        """What the advice knows of the job of ``meta``: its profile's figures, if any."""
        profile = self._profiles.get(app_key(meta))
        if profile is None or profile.phases == 0:
            return JobInput(meta.job_id, meta.nodes)
        return JobInput(
            meta.job_id,
            meta.nodes,
            volume_per_phase=profile.volume_per_phase or None,
            compute_seconds=profile.compute_seconds if profile.gaps else None,
            phases=profile.phases,
            bandwidth=dict(profile.bandwidth),
        )


@runtime_checkable
class AdviceOutbox(Protocol):
    """A session's outbox that carries the advised replicas (``StreamOutbox``)."""

    def offer_advice(self, addresses: tuple[str, ...]) -> None: ...


class AdviceFeed:
    """Offers every session of ``table`` its job's advised replica addresses, recomputed
    from ``inputs`` when they change (module docstring); ``compute_nodes``: Q^cpu."""

    def __init__(self, inputs: PlacementInputs, table: JobTable, compute_nodes: int | None) -> None:
        self._inputs = inputs
        self._table = table
        self._compute_nodes = compute_nodes
        self._key: object = None  # what the advice held was computed from
        self.advised: dict[str, tuple[str, ...]] = {}  # job id -> addresses
        self.computed = 0

    async def refresh(self) -> None:
        """Recomputes the advice if its inputs changed, then offers it to every session."""
        if not self._table.sessions:
            return  # nobody to tell
        inputs = self._inputs
        resources, jobs = inputs.resources(), inputs.jobs()
        key = (tuple(resources), inputs.profiles_version, tuple(jobs))
        if key != self._key:
            advice = await asyncio.to_thread(
                advise_all, resources, jobs, compute_nodes=self._compute_nodes
            )
            self._key = key
            self.advised = {j.job_id: tuple(j.addresses) for j in advice.jobs}
            self.computed += 1
        for session in self._table.sessions.values():
            outbox = session.outbox
            addresses = self.advised.get(session.job.job_id)
            if addresses and isinstance(outbox, AdviceOutbox):
                outbox.offer_advice(addresses)

    async def run(self, interval: float) -> None:
        """Refreshes every ``interval`` (λ: the live replicas change with the exchanges), at
        least ``ADVICE_MIN_PERIOD`` apart."""
        interval = max(interval, ADVICE_MIN_PERIOD)
        while True:
            try:
                await self.refresh()
            except Exception:  # advice is a hint: a bug here must not stop the controller
                log.exception("placement advice for the sessions failed")
            await asyncio.sleep(interval)
