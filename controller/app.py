"""Composition root: ``build_replica(config)`` wires one controller replica.

The ``Replica`` builds each part with what it needs, in dependency order, and
starts and stops them; it holds no logic of its own. Each part connects itself to
the signals it must act on. ``start()`` loads the durable stores, starts the REST
server, the gRPC server and the background tasks; ``stop()`` stops them and saves
the stores once more. Both are idempotent; ``serve()`` runs start → wait for the
exit flag → graceful stop. Only the CLI installs signal handlers.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from burstctl.common.files import keep_saving, save_changes
from burstctl.controller.buffer import BufferBooks
from burstctl.controller.catalog import Catalog
from burstctl.controller.config import ControllerConfig, split_host_port
from burstctl.controller.ghosts import Ghosts, InForce
from burstctl.controller.jobs import JobTable
from burstctl.controller.ledger import Ledger
from burstctl.controller.metadata_qos import MetadataQos, rules_limit
from burstctl.controller.metrics import LatencyHistogram, Metrics
from burstctl.controller.peers import PeerServicer, PeerSync
from burstctl.controller.placement import AdviceFeed, PlacementInputs
from burstctl.controller.profiles import PhaseRecorder, ProfileStore
from burstctl.controller.registrations import Registrations
from burstctl.controller.rest import build_app
from burstctl.controller.rest.auth import TokenError, admin_token
from burstctl.controller.rest.server import HttpServer
from burstctl.controller.rulebook import RuleBook
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.server import GrpcServer
from burstctl.controller.servicer import SERVICE_NAME, ControllerServicer
from burstctl.controller.state import PolicySlot, StateStore, offload_to_thread
from burstctl.controller.trust import UnregisteredLimits, load_credentials
from burstctl.policies.registry import PolicyRegistry, default_registry

log = logging.getLogger(__name__)


class Replica:
    """One controller replica: its parts, as attributes, and their life cycle."""

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
            offload=offload_to_thread,
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
        # Registrations and profiles, held alike by every replica (docs/replicas.md).
        self.catalog = Catalog(config.replica_id, self.profiles)
        # The operator's rules (docs/rules.md), held in the catalog like registrations.
        self.rules = RuleBook(self.catalog, self.store, self.table, config.capacity)
        # Read now, before anything listens: a file that cannot be used fails the build.
        self.credentials = load_credentials(config)
        self.gate = self.credentials.gate
        # The burst buffer's books (docs/capacity.md): S per replica; without --bb-capacity
        # they still hold the mounts' reports (GET /v1/capacity) and grant no space.
        self.books = BufferBooks(
            config.bb_capacity,
            config.pfs_bandwidth,
            clock=clock,
            retention=config.bb_parked_retention,
            min_chunk=config.bb_min_grant,
            horizon=config.bb_grant_horizon,
        )
        self.peer_sync: PeerSync | None = None
        self.peer_servicer: PeerServicer | None = None
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
                books=self.books,
                catalog=self.catalog,
                rules=self.rules,
            )
            self.peer_servicer = PeerServicer(
                self.peer_sync.membership,
                self.slot,
                config.replica_id,
                clock,
                max_jobs=config.max_digest_jobs,
                catalog=self.catalog,
            )
        latency = LatencyHistogram(config.replica_id)
        # Sessions gone without a Goodbye stay counted until they come back, or for as long as
        # a silent client is given before it is taken as gone (controller/ghosts.py).
        self.ghosts = Ghosts(retention=config.heartbeat_timeout, clock=clock)
        # The rates in force at the clients, saved for a successor that restarts in our place.
        self.in_force = InForce(config.state_dir, self._offered, self.ghosts)
        self.scheduler = Scheduler(
            self.table,
            self.slot,
            config,
            peers=self.peer_sync,
            clock=clock,
            observe_latency=latency.observe,
            books=self.books,
            ghosts=self.ghosts,
            rules=self.rules,
        )
        # Metadata QoS: the metadata_ops of a job's rule, its part here shared by its sessions.
        membership = self.peer_sync.membership if self.peer_sync is not None else None
        self.metadata_qos = MetadataQos(
            self.table,
            rules_limit(self.rules),
            membership.holders if membership is not None else None,
        )
        self.rules.changed.connect(self.metadata_qos.rules_changed)
        if self.peer_sync is not None:  # a job seen on another replica: its part here changes
            self.peer_sync.updated.connect(self.metadata_qos.peers_changed)
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
            capacities=(config.capacity, config.pfs_bandwidth or config.capacity),
            ghosts=self.ghosts,
            lease=config.lease,
            metadata=self.metadata_qos,
        )
        self.registrations = Registrations(self.table, self.store, self.servicer, self.catalog)
        handlers = [self.servicer.rpc_handlers()]
        if self.peer_servicer is not None:
            handlers.append(self.peer_servicer.rpc_handlers())
        self.grpc = GrpcServer(
            config.grpc_listen,
            self.credentials,
            handlers,
            health_names=(SERVICE_NAME,),
            max_message_bytes=config.max_message_bytes,
        )
        self.placement = PlacementInputs(
            config.replica_id,
            config.capacity,
            table=self.table,
            profiles=self.profiles,
            grpc=self.grpc,
            peers=self.peer_sync,
        )
        # With peers, every session is told the replicas its job is advised (placement-live.md).
        self.advice_feed = (
            AdviceFeed(self.placement, self.table, config.placement_compute_nodes)
            if self.peer_sync is not None
            else None
        )
        self.phases = PhaseRecorder(
            self.profiles, self.table, self.placement.count, stamp=self.catalog.next_stamp
        )
        self.metrics = Metrics(
            config,
            latency,
            table=self.table,
            slot=self.slot,
            scheduler=self.scheduler,
            books=self.books,
            servicer=self.servicer,
            peers=self.peer_sync,
            peer_servicer=self.peer_servicer,
            rules=self.rules,
        )
        self.http: HttpServer | None = None  # built at start, once the admin token is read
        self.ready = False  # gRPC serving and state loaded (GET /readyz)
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._stopped = asyncio.Event()

    @property
    def grpc_address(self) -> str:
        return self.grpc.address

    @property
    def grpc_port(self) -> int | None:
        return self.grpc.port

    @property
    def http_url(self) -> str:
        host, _ = split_host_port(self.config.http_listen)
        assert self.http is not None and self.http.port is not None, "REST not started"
        return f"http://{host}:{self.http.port}"

    def _load(self) -> None:
        """The durable stores, as the previous run left them (an unreadable file is kept
        aside and its store starts empty: common/files.py)."""
        self.ledger.load()
        # Our predecessor's clients go on pacing at what it allotted until they are back.
        app, drain = self.in_force.load()
        if app or drain:
            log.info(
                "counting the rates in force at the previous run's clients until they are"
                " back: %s B/s (drain %s B/s)",
                round(app),
                round(drain),
            )
        self.ghosts.reserve(app, drain, retention=self.config.lease + self.config.fallback_grace)
        state = self.store.load()
        self.profiles.load()
        self.registrations.resume(state)
        self.rules.resume(state.rules)
        self.slot.resume(state)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._load()
        try:
            token = admin_token(self.config)
        except (OSError, TokenError) as exc:
            raise OSError(f"REST admin token: {exc}") from None
        app = build_app(
            self.config,
            token,
            ready=lambda: self.grpc.address if self.ready else None,
            slot=self.slot,
            table=self.table,
            registrations=self.registrations,
            rules=self.rules,
            placement=self.placement,
            books=self.books,
            scheduler=self.scheduler,
            peers=self.peer_sync,
            metrics=self.metrics,
        )
        http = HttpServer(app, self.config.http_listen, self.config.log_level)
        await http.start()  # first: a taken port fails before anything else runs
        self.http = http
        try:
            await self.grpc.start()
        except OSError:
            await http.stop()
            raise
        self._spawn(self.scheduler.run(), "scheduler")
        self._spawn(self.scheduler.renew_leases(), "lease-renewal")
        self._spawn(self.servicer.reap(), "heartbeat-reaper")
        self._spawn(
            keep_saving((self.ledger, self.profiles, self.in_force), self.config.ledger_interval),
            "ledger",
        )
        self._spawn(self.servicer.lag.run(), "loop-lag")
        if self.config.tick > 0:
            self._spawn(self.scheduler.tick(self.config.tick), "tick")
        if self.peer_sync is not None:
            self._spawn(self.peer_sync.run(), "peer-sync")
        if self.advice_feed is not None:
            self._spawn(self.advice_feed.run(self.config.sync_interval), "advice-feed")
        self.ready = True
        log.info(
            "controller %s serving gRPC on %s (policy %s, capacity %.0f B/s)",
            self.config.replica_id,
            self.grpc_address,
            self.slot.name,
            self.config.capacity,
        )
        log.info("controller %s serving REST on %s", self.config.replica_id, self.http_url)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"controller-{name}"))

    async def stop(self, grace: float = 1.0) -> None:
        if not self._started or self._stopped.is_set():
            return
        self.ready = False
        # The rates in force, saved while the sessions are still open: their clients go on
        # pacing after we are gone, and our successor counts them (controller/ghosts.py).
        await save_changes(self.in_force)
        self.in_force.final = True
        await self.grpc.stop(grace)
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
            json.dumps(self.metrics.stats(), sort_keys=True),
        )

    def _offered(self) -> tuple[float, float]:
        """The rates the clients may pace at: offered to the application and drain sessions."""
        pools = [0.0, 0.0]
        for session in self.table.sessions.values():
            pools[session.drain] += session.offered
        return pools[0], pools[1]

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
