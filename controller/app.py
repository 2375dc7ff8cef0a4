"""Composition root: ``build_replica(config)`` wires one controller replica.

The ``Replica`` owns the state store, the policy slot, the job table, the
scheduler, the gRPC server (controller, peer and standard health services), the
REST server and the background tasks. Each part is given what it needs when it
is built, and connects itself to the signals it must act on. ``start()`` and
``stop()`` are idempotent; ``serve()`` runs start → wait for the exit flag →
graceful stop. Only the CLI installs signal handlers.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from burstctl.common.files import keep_saving, save_changes
from burstctl.controller.advice import JobInput, Resource
from burstctl.controller.buffer import BufferBooks
from burstctl.controller.config import ControllerConfig, split_host_port
from burstctl.controller.jobs import JobTable
from burstctl.controller.ledger import Ledger
from burstctl.controller.metrics import Metrics
from burstctl.controller.peers import PeerServicer, PeerSync
from burstctl.controller.profiles import PhaseRecorder, ProfileStore, app_key
from burstctl.controller.records import JobMeta, JobStatus
from burstctl.controller.rest import HttpServer, TokenError, admin_token, build_app
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.servicer import SERVICE_NAME, ControllerServicer
from burstctl.controller.state import PolicySlot, RegisteredJob, StateStore
from burstctl.controller.trust import UnregisteredLimits, load_credentials
from burstctl.policies.registry import PolicyRegistry, default_registry

log = logging.getLogger(__name__)


class Replica:
    """One controller replica."""

    def __init__(
        self,
        config: ControllerConfig,
        registry: PolicyRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock  # the job table's clock (monotonic); the admin views read it too
        self.store = StateStore(config.state_dir)
        self.slot = PolicySlot(
            registry,
            self.store,
            (config.policy, config.policy_params),
            replica_id=config.replica_id,
        )
        self.table = JobTable(
            clock,
            heartbeat_timeout=config.heartbeat_timeout,
            job_retention=config.job_retention,
            demand_headroom=config.demand_headroom,
            max_jobs=config.max_jobs,
            max_open_ops=config.max_open_ops,
        )
        self.ledger = Ledger(config.state_dir, self.table)
        # What applications did in their I/O phases: the input of placement advice.
        self.profiles = ProfileStore(config.state_dir, config.profile_max_keys)
        self.phases = PhaseRecorder(
            self.profiles,
            self.table,
            count_of=lambda job_id: len(self.presence({job_id}).get(job_id, ())),
        )
        self.peer_sync: PeerSync | None = None
        self.peer_servicer: PeerServicer | None = None
        # Read now, before anything listens: a file that cannot be used fails the build.
        self.credentials = load_credentials(config)
        self.gate = self.credentials.gate
        if config.peers:
            self.peer_sync = PeerSync(
                self.table,
                self.slot,
                replica_id=config.replica_id,
                addresses=list(config.peers),
                interval=config.sync_interval,
                missed=config.missed_exchanges,
                capacity=config.capacity,
                node_bandwidth=config.node_bandwidth,
                lease=config.lease,
                keep=config.fallback_grace,
                clock=clock,
                security=self.credentials.peers,
            )
            self.peer_servicer = PeerServicer(
                self.peer_sync.membership,
                self.slot,
                config.replica_id,
                clock,
                max_jobs=config.max_digest_jobs,
            )
        # The burst buffer's books (docs/capacity.md): S per replica; without --bb-capacity
        # they still hold the mounts' reports (GET /v1/capacity) and grant no space.
        self.books = BufferBooks(
            config.bb_capacity,
            config.pfs_bandwidth,
            clock=clock,
            retention=config.job_retention,
            min_chunk=config.bb_min_grant,
            horizon=config.bb_grant_horizon,
        )
        self.metrics = Metrics(self)
        self.scheduler = Scheduler(
            self.table,
            self.slot,
            config,
            peers=self.peer_sync,
            clock=clock,
            observe_latency=self.metrics.decision_latency.observe,
            books=self.books,
        )
        self.servicer = ControllerServicer(
            self.table,
            max_op_volume=config.max_op_volume,
            replica_id=config.replica_id,
            max_sessions=config.max_sessions,
            max_sessions_per_client=config.max_sessions_per_client,
            max_notices=config.max_notices,
            retry_after=config.retry_after,
            shed_loop_lag=config.shed_loop_lag,
            gate=self.gate,
            unregistered=UnregisteredLimits(
                max_nodes=config.max_unregistered_nodes,
                max_priority=config.max_unregistered_priority,
            ),
            books=self.books,
        )
        self.http: HttpServer | None = None
        self.ready = False  # gRPC serving and state loaded (GET /readyz)
        self.health = health_aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.grpc_port: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._stopped = asyncio.Event()

    @property
    def grpc_address(self) -> str:
        host, _ = split_host_port(self.config.grpc_listen)
        return f"{host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        host, _ = split_host_port(self.config.http_listen)
        assert self.http is not None and self.http.port is not None, "REST not started"
        return f"http://{host}:{self.http.port}"

    def _resume_state(self) -> None:
        self.ledger.load()
        state = self.store.load()
        self.profiles.load()
        for job in state.jobs:
            self.table.register(
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
            log.info("resumed %d registered jobs from %s", len(state.jobs), self.store.path)
        self.slot.resume(state)

    def _save_jobs(self) -> None:
        self.store.update(
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
                for m in sorted(self.table.registered.values(), key=lambda m: m.job_id)
            ]
        )

    def register_job(self, meta: JobMeta) -> bool:
        """Registers (or updates) a job's authoritative metadata, persisted; True if new.

        If the state cannot be written the registration is not accepted: the
        table is left as it was and the ``OSError`` propagates.
        """
        previous = self.table.registered.get(meta.job_id)
        live = self.table.jobs.get(meta.job_id)
        live_meta = live.meta if live is not None else None
        self.table.register(meta)
        try:
            self._save_jobs()
        except OSError:
            self.table.registered.pop(meta.job_id, None)
            if previous is not None:
                self.table.registered[meta.job_id] = previous
            if live_meta is not None:
                self.table.set_meta(live_meta)
            raise
        log.info("job %s registered: %s", meta.job_id, meta)
        # Sessions of another user lose the job (docs/security.md): ended, they reconnect
        # and are refused, so their I/O goes to their own default job.
        job = self.table.jobs.get(meta.job_id)
        for session in list(job.sessions.values()) if job is not None else ():
            claim = session.claim
            if claim is not None and claim.user != meta.user:
                log.warning(
                    "job %s registered to %s: ending session %d of user %s",
                    meta.job_id,
                    meta.user,
                    session.sid,
                    claim.user,
                )
                self.servicer.kill(
                    session,
                    f"hello.user: job {meta.job_id!r} is now registered to another user",
                    grpc.StatusCode.PERMISSION_DENIED,
                )
                self.table.close_session(session)
        return previous is None

    # -- placement advice (controller/advice.py) -------------------------------
    def placement_resources(self) -> list[Resource]:
        """This replica and its live peers, with their gRPC addresses and capacities."""
        out = [Resource(self.config.replica_id, self.advertised_address, self.config.capacity)]
        sync = self.peer_sync
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

    @property
    def advertised_address(self) -> str:
        """The gRPC address clients reach this replica at: the listen address, the host
        name in place of a wildcard."""
        host, _ = split_host_port(self.config.grpc_listen)
        if host in ("0.0.0.0", "[::]", "::"):
            host = socket.getfqdn()
        return f"{host}:{self.grpc_port}"

    def presence(self, wanted: set[str] | None = None) -> dict[str, list[str]]:
        """Job id -> the replicas it has live sessions on (this one, and the live peers whose
        last digest lists it), for the ``wanted`` jobs (None: every job)."""
        where: dict[str, list[str]] = {}
        for job_id, job in self.table.jobs.items():
            if job.sessions and (wanted is None or job_id in wanted):
                where[job_id] = [self.config.replica_id]
        if self.peer_sync is not None:
            for d in self.peer_sync.membership.digests():
                ids = d.jobs.job_id if wanted is None else wanted.intersection(d.jobs.job_id)
                for job_id in ids:
                    where.setdefault(job_id, []).append(d.replica_id)
        return where

    def placement_jobs(self) -> list[JobInput]:
        """The jobs advice is given for: registered ones and those with live sessions here,
        each with what its application's profile knows."""
        metas: dict[str, JobMeta] = dict(self.table.registered)
        for job_id, job in self.table.jobs.items():
            if job.status is JobStatus.ACTIVE and job.sessions:
                metas.setdefault(job_id, job.meta)
        return [self.job_input(metas[job_id]) for job_id in sorted(metas)]

    def job_input(self, meta: JobMeta) -> JobInput:
        profile = self.profiles.get(app_key(meta))
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

    def retire_job(self, job_id: str) -> bool:
        """Forgets a registration, persisted; False if the job was not registered."""
        meta = self.table.registered.get(job_id)
        if meta is None:
            return False
        self.table.retire(job_id)
        try:
            self._save_jobs()
        except OSError:
            self.table.register(meta)
            raise
        log.info("job %s retired", job_id)
        return True

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._resume_state()
        try:
            token = admin_token(self.config)
        except (OSError, TokenError) as exc:
            raise OSError(f"REST admin token: {exc}") from None
        server_credentials = self.credentials.server
        http = HttpServer(build_app(self, token), self.config.http_listen, self.config.log_level)
        await http.start()  # first: a taken port fails before anything else runs
        self.http = http
        server = grpc.aio.server(
            interceptors=[self.gate.interceptor()],
            options=[
                ("grpc.so_reuseport", 0),  # fail loudly if the port is taken
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
                # a larger message is refused by gRPC with RESOURCE_EXHAUSTED (config.py)
                ("grpc.max_receive_message_length", self.config.max_message_bytes),
            ],
        )
        server.add_generic_rpc_handlers((self.servicer.rpc_handlers(),))
        if self.peer_servicer is not None:
            server.add_generic_rpc_handlers((self.peer_servicer.rpc_handlers(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            if server_credentials is None:
                self.grpc_port = server.add_insecure_port(self.config.grpc_listen)
            else:
                self.grpc_port = server.add_secure_port(self.config.grpc_listen, server_credentials)
        except RuntimeError as exc:
            await http.stop()
            raise OSError(f"cannot listen on {self.config.grpc_listen}: {exc}") from None
        await server.start()
        self.server = server
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._spawn(self.scheduler.run(), "scheduler")
        self._spawn(self.scheduler.renew_leases(), "lease-renewal")
        self._spawn(self._reap(), "heartbeat-reaper")
        self._spawn(
            keep_saving((self.ledger, self.profiles), self.config.ledger_interval), "ledger"
        )
        self._spawn(self.servicer.lag.run(), "loop-lag")
        if self.config.tick > 0:
            self._spawn(self.scheduler.tick(self.config.tick), "tick")
        if self.peer_sync is not None:
            self._spawn(self.peer_sync.run(), "peer-sync")
        self.ready = True
        log.info(
            "controller %s serving gRPC on %s (policy %s, capacity %.0f B/s)",
            self.config.replica_id,
            self.grpc_address,
            self.slot.name,
            self.config.capacity,
        )
        log.info("controller %s serving REST on %s", self.config.replica_id, self.http_url)

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"controller-{name}"))

    async def _reap(self) -> None:
        period = min(1.0, self.config.heartbeat_timeout / 4)
        while True:
            await asyncio.sleep(period)
            # Silence the controller caused itself (its loop lagging: messages unread) is no
            # client's fault: forgiven, so that overload does not close sessions.
            for session in self.table.expire(grace=self.servicer.lag.value):
                log.warning(
                    "session %d of job %s: no heartbeat for %.1fs, closed",
                    session.sid,
                    session.job.job_id,
                    self.config.heartbeat_timeout,
                )
                self.servicer.kill(session, "no heartbeat within the timeout")
            if self.books.parked:  # parked residents past the retention leave the books
                self.books.expire()
                self.servicer.request_grant()

    async def stop(self, grace: float = 1.0) -> None:
        if not self._started or self._stopped.is_set():
            return
        self.ready = False
        await self.health.enter_graceful_shutdown()
        if self.server is not None:
            await self.server.stop(grace)
        if self.http is not None:
            await self.http.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await save_changes(self.ledger)
        await save_changes(self.profiles)
        if self.peer_sync is not None:
            await self.peer_sync.close()
        self._stopped.set()
        log.info(
            "controller %s stopped; stats: %s",
            self.config.replica_id,
            json.dumps(self.stats(), sort_keys=True),
        )

    def stats(self) -> dict[str, Any]:
        """Counters since start, logged at stop and read by benchmarks (/metrics: metrics.py)."""
        st = self.scheduler.stats
        lat = sorted(st.latencies)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        return {
            "messages": self.servicer.messages,
            "rejected_sessions": self.servicer.rejected,
            "refused_sessions": self.servicer.refused,
            "denied_sessions": self.servicer.denied,
            "loop_lag_peak_s": self.servicer.lag.peak,
            "unauthenticated_calls": self.gate.refused,
            "decisions": st.decisions,
            "pushes": st.pushes,
            "pushes_start": st.pushes_start,
            "pushes_stop": st.pushes_stop,
            "renewals": st.renewals,
            "clamped": st.clamped,
            "decision_p50_s": pct(0.50),
            "decision_p99_s": pct(0.99),
            "jobs": len(self.table.jobs),
            "sessions": len(self.table.sessions),
            "policy": self.slot.name,
            "policy_version": self.slot.version,
            **({"sync": self._sync_stats()} if self.peer_sync is not None else {}),
        }

    def _sync_stats(self) -> dict[str, Any]:
        assert self.peer_sync is not None and self.peer_servicer is not None
        return {
            **self.peer_sync.stats(),
            "digests_received": self.peer_servicer.received,
            "digests_rejected": self.peer_servicer.rejected,
        }

    async def serve(self, should_exit: asyncio.Event) -> None:
        await self.start()
        # The daemon's heap as of now (modules, classes, the replica) lives as long as the
        # process: frozen, out of the cyclic collector's way, a full collection walks only
        # what came later (jobs, sessions), so its pauses of the loop stay short.
        gc.collect()
        gc.freeze()
        try:
            await should_exit.wait()
        finally:
            await self.stop()


def build_replica(config: ControllerConfig, registry: PolicyRegistry | None = None) -> Replica:
    return Replica(config, registry if registry is not None else default_registry())
