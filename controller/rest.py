"""The REST admin API: FastAPI on the controller's own event loop (docs/rest.md).

``build_app(replica)`` returns the app; ``HttpServer`` runs it with uvicorn on
a socket the controller binds itself, so ``127.0.0.1:0`` works and a taken port
fails at start with a clear error. No globals: every route reaches the replica
through the ``Replica`` it was built with, and a policy switch is one
synchronous call on the loop the scheduler runs on, so no decision ever sees
half of it.

Mutations need ``Authorization: Bearer <token>`` (401 without, 403 with a wrong
one); reads too when ``protect_reads`` is set. The token comes from
``BURSTCTL_ADMIN_TOKEN``, else ``admin_token_file``, else
``<state_dir>/admin-token``, created with mode 0600 on first start.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import logging
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from burstctl.common.limits import (
    MAX_NODES,
    MAX_PERIOD_VOL,
    MAX_PERIOD_W,
    MAX_PRIORITY,
    MAX_RATE,
    MAX_TEXT,
    AllocatorName,
    PlacementName,
    identifier_problem,
)
from burstctl.controller.advice import Advice, JobInput, advise_all, advise_one
from burstctl.controller.config import ControllerConfig, split_host_port
from burstctl.controller.dashboard import mount_dashboard
from burstctl.controller.profiles import MAX_REPLICA_COUNT
from burstctl.controller.records import JobMeta, JobState, JobStatus
from burstctl.controller.state import ActivePolicy
from burstctl.policies.registry import PolicyParamsError, UnknownPolicyError
from burstctl.policies.view import job_cap

if TYPE_CHECKING:
    from burstctl.controller.app import Replica

log = logging.getLogger(__name__)

TOKEN_ENV = "BURSTCTL_ADMIN_TOKEN"
TOKEN_FILE = "admin-token"

# Which paper a built-in policy comes from, by module (GET /v1/policies).
_FAMILIES = {
    "fcfs": "bandwidth-sharing",
    "fair_share": "bandwidth-sharing",
    "greedy": "bandwidth-sharing",
    "io_sets": "bandwidth-sharing",
    "best_next_event": "bandwidth-sharing",
    "statistical_tokens": "statistical-tokens",
}


# Module level: FastAPI resolves the (string) annotations of the routes' dependencies here.
_BEARER = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


class TokenError(RuntimeError):
    pass


def admin_token(config: ControllerConfig) -> str:
    """The bearer token for mutations (module docstring); creates the default file."""
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env
    if config.admin_token_file is not None:
        try:
            token = config.admin_token_file.read_text().strip()
        except OSError as exc:
            raise TokenError(f"cannot read admin token file: {exc}") from None
        if not token:
            raise TokenError(f"admin token file {config.admin_token_file} is empty")
        return token
    path = config.state_dir / TOKEN_FILE
    config.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text().strip()
        if not token:
            raise TokenError(f"admin token file {path} is empty") from None
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("created admin token %s (mode 0600)", path)
    return token


# ---------------------------------------------------------------------------
# Bodies


class PolicyInfo(BaseModel):
    name: str
    family: str
    description: str
    params_schema: dict[str, Any] = Field(description="JSON schema of the parameters")


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        min_length=1,
        max_length=MAX_TEXT,
        description="a registered name (GET /v1/policies) or a sharing spec; never an import path",
    )
    params: dict[str, Any] = Field(default_factory=dict)


class PeerOut(BaseModel):
    replica_id: str
    live: bool
    last_exchange_age_s: float
    capacity: float
    policy: str
    policy_version: int
    jobs: int


class ReplicasOut(BaseModel):
    replica_id: str
    capacity: float
    policy: str
    policy_version: int
    sync_interval_s: float | None
    peers: list[PeerOut]


def _identifier(value: str) -> str:
    problem = identifier_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# the limits a client's Hello and a peer's digest have (common/limits.py)
Identifier = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_identifier)]


class JobIn(BaseModel):
    """A job's authoritative metadata, as a Slurm prolog registers it."""

    model_config = ConfigDict(extra="forbid")
    job_id: Identifier
    user: Identifier
    group: Identifier
    nodes: int = Field(ge=1, le=MAX_NODES, description="p_i, compute nodes")
    priority: float = Field(1.0, gt=0, le=MAX_PRIORITY, allow_inf_nan=False)
    w: float | None = Field(
        None,
        gt=0,
        le=MAX_PERIOD_W,
        allow_inf_nan=False,
        description="a periodic job's compute seconds per iteration (policy persched)",
    )
    vol_io: float | None = Field(
        None,
        gt=0,
        le=MAX_PERIOD_VOL,
        allow_inf_nan=False,
        description="a periodic job's bytes moved per iteration (policy persched)",
    )

    app: Identifier | None = Field(
        None, description="application name of its profile (default: the job id's prefix)"
    )

    @model_validator(mode="after")
    def _both_or_neither(self) -> JobIn:
        if (self.w is None) != (self.vol_io is None):
            missing = "w" if self.w is None else "vol_io"
            raise ValueError(f"{missing}: must be set too: a period declares both w and vol_io")
        return self


class PlacementJobIn(BaseModel):
    """A job about to start, as a Slurm prolog describes it (``POST /v1/placement``)."""

    model_config = ConfigDict(extra="forbid")
    job_id: Identifier
    user: Identifier
    group: Identifier
    nodes: int = Field(ge=1, le=MAX_NODES, description="Q_j, compute nodes")
    app: Identifier | None = Field(None, description="application name (its profile's key)")
    volume_per_phase: float | None = Field(
        None, gt=0, le=MAX_PERIOD_VOL, allow_inf_nan=False, description="bytes per I/O phase"
    )
    compute_seconds: float | None = Field(
        None, ge=0, le=MAX_PERIOD_W, allow_inf_nan=False, description="s between I/O phases"
    )
    phases: int | None = Field(None, ge=1, le=1_000_000, description="number of I/O phases")
    bandwidth: dict[int, Annotated[float, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)]] | None = (
        Field(
            None,
            max_length=MAX_REPLICA_COUNT,
            description="b_j(n): bytes/s at n replicas, as {n: bytes/s}, n in 1..4096",
        )
    )
    allocator: AllocatorName | None = None
    placement: PlacementName | None = None

    @model_validator(mode="after")
    def _counts(self) -> PlacementJobIn:
        for n in self.bandwidth or {}:
            if not 1 <= n <= MAX_REPLICA_COUNT:
                raise ValueError(f"bandwidth: replica count {n} must be in 1..{MAX_REPLICA_COUNT}")
        return self


class PlacementJobOut(BaseModel):
    job_id: str
    replicas: list[str] = Field(description="ids of the advised replicas")
    addresses: list[str] = Field(description="their gRPC addresses (BURSTCTL_REPLICAS)")
    count: int = Field(description="n_j, the number of replicas")
    allocator_used: str = Field(description="the allocator the job's information allowed")
    level: int = Field(description="information level 0, 1 or 2 ([DIST-IO] Table II)")
    fallback: str | None = Field(description="why not the allocator asked for; null if it was")


class PlacementOut(BaseModel):
    replicas: list[str] = Field(description="ids of the live replicas (N), capacity first")
    io_load: float | None = Field(description="I/O-load of the advised allocation")
    allocator: str | None = Field(description="the allocator asked for (null: by level)")
    placement: str | None = Field(description="the placement asked for (null: by level)")
    placement_used: str | None = Field(
        description="the placement applied; `incremental` for POST (the others stay put)"
    )
    placement_note: str = Field(description="why not the placement asked for; empty if it was")
    jobs: list[PlacementJobOut]


def _placement_out(advice: Advice) -> PlacementOut:
    return PlacementOut(
        replicas=advice.replicas,
        io_load=advice.io_load,
        allocator=advice.allocator,
        placement=advice.placement,
        placement_used=advice.placement_used,
        placement_note=advice.placement_note,
        jobs=[
            PlacementJobOut(
                job_id=j.job_id,
                replicas=j.replicas,
                addresses=j.addresses,
                count=j.count,
                allocator_used=j.allocator_used,
                level=j.level,
                fallback=j.fallback,
            )
            for j in advice.jobs
        ],
    )


class WindowOut(BaseModel):
    start_s: float = Field(description="seconds from the start of the period")
    end_s: float = Field(description="seconds from the start of the period (past it: wraps)")
    rate: float = Field(description="bytes per second, the job's total over its sessions")


class ScheduleOut(BaseModel):
    job_id: str
    period_s: float
    phase_s: float = Field(description="where in its period the job is now, in [0, period_s)")
    windows: list[WindowOut]


class JobOut(BaseModel):
    job_id: str
    user: str
    group: str
    nodes: int
    priority: float
    w: float | None = Field(default=None, description="declared compute s per iteration")
    vol_io: float | None = Field(default=None, description="declared bytes per iteration")
    app: str | None = Field(
        default=None, description="application name of its profile (placement advice)"
    )
    registered: bool = Field(description="metadata from POST /v1/jobs, not from clients")
    active: bool = Field(default=False, description="at least one live client session")
    in_io: bool = Field(default=False, description="an operation is open (the job is in S(t))")
    rate: float = Field(default=0.0, description="bytes/s allotted right now, all sessions")
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_moved: int = Field(default=0, description="all bytes, whatever the operation kind")
    metadata_ops: int = 0
    yield_: float | None = Field(
        default=None,
        serialization_alias="yield",
        description="y_i = P_i / (t − τ_i), eq. (6); null before any time passed",
    )
    wait_seconds: float = Field(
        default=0.0, description="time the job's acquire calls waited for tokens"
    )
    sessions: int = 0
    replicas: list[str] = Field(description="replicas this job is present on (self and peers)")
    age_s: float = Field(default=0.0, description="seconds since this replica first saw the job")


class CapacityJobOut(BaseModel):
    job_id: str
    resident: int = Field(description="bytes of the job on the burst buffer (its mounts' reports)")
    pending: int = Field(description="of them, bytes not yet copied to the PFS")
    reserved: int = Field(description="resident + space granted and not filled yet")
    drain_rate: float = Field(description="bytes/s allotted to the job's drain streams now")
    drained: int = Field(description="bytes the job's drain streams copied to the PFS")
    drain_error: str = Field(description="why the job's files do not drain; empty if they do")


class CapacityOut(BaseModel):
    """The burst buffer of this replica (docs/capacity.md)."""

    size: int | None = Field(description="S, bytes (--bb-capacity); null: no capacity set")
    used: int = Field(description="bytes on the buffer or granted to writers (<= size)")
    free: int | None = Field(description="size - used; null without a capacity")
    resident: int = Field(description="bytes on the buffer, all jobs")
    pending: int = Field(description="bytes not yet on the PFS, all jobs")
    drain_bandwidth: float | None = Field(
        description="B to the PFS, bytes/s (--pfs-bandwidth); null: drains share --capacity"
    )
    drain_rate: float = Field(description="bytes/s allotted to all drain streams now")
    waiting: list[str] = Field(description="jobs with a writer waiting for space")
    jobs: list[CapacityJobOut]


class ErrorOut(BaseModel):
    """Any error but a validation 422 (FastAPI's shape: ``HTTPException``'s detail)."""

    detail: str = Field(description="what went wrong")


# The statuses routes answer besides their success and FastAPI's own 422, for the schema
# (`responses=`): the token check on mutations (and on reads with ``protect_reads``), a
# state that cannot be written on mutations, an unknown job.
_TOKEN_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorOut,
        "description": "No bearer token",
        "headers": {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}},
    },
    403: {"model": ErrorOut, "description": "Wrong bearer token"},
}
_NOT_DURABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorOut, "description": "The state cannot be written: nothing changed"},
}


def _as_json(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """``responses`` for a route whose response class is not JSON (``/metrics``): FastAPI
    would document a ``model`` in the route's media type, so the schema is given inline."""
    out: dict[int | str, dict[str, Any]] = {}
    for status, response in responses.items():
        response = dict(response)
        model = response.pop("model")
        response["content"] = {"application/json": {"schema": model.model_json_schema()}}
        out[status] = response
    return out


def _not_found(what: str) -> dict[int | str, dict[str, Any]]:
    return {404: {"model": ErrorOut, "description": what}}


def _invalid(loc: list[str | int], msg: str, value: Any) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": loc, "msg": msg, "input": value}])


# GET /v1/jobs pages: bounded, so a table of 20,000 jobs is never one answer.
JOBS_PAGE_DEFAULT = 100
JOBS_PAGE_MAX = 1000
_JOB_LIST = TypeAdapter(list[JobOut])


def _page(ids: set[str], rates: dict[str, float], order: str, offset: int, limit: int) -> list[str]:
    """The ids of one page (runs in a worker thread: ``ids`` and ``rates`` are copies)."""
    end = offset + limit
    if order == "rate":
        # the jobs holding a rate (few: they have live sessions), then the others by id
        rated = sorted(rates, key=lambda i: (-rates[i], i))
        if end <= len(rated):
            return rated[offset:end]
        rest = heapq.nsmallest(end - len(rated), ids.difference(rates))
        return (rated + rest)[offset:end]
    return heapq.nsmallest(end, ids)[offset:]


def _dump_jobs(rows: list[dict[str, Any]]) -> bytes:
    """Validates and serialises a page of jobs (a worker thread: plain values only)."""
    return _JOB_LIST.dump_json(_JOB_LIST.validate_python(rows), by_alias=True)


def build_app(replica: Replica, token: str) -> FastAPI:
    """The admin app of one replica."""
    app = FastAPI(
        title="burstctl controller",
        version="1",
        summary="Switch policies, see jobs and replicas of one burstctl controller replica.",
    )

    def require_token(creds: Credentials) -> None:
        if creds is None or creds.scheme.lower() != "bearer":
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        if not secrets.compare_digest(creds.credentials.encode(), token.encode()):
            raise HTTPException(403, "wrong bearer token")

    # The schema declares the bearer scheme (and its 401/403) only where the token is
    # required: on mutations always, on reads only with ``protect_reads`` (the config is
    # frozen, so deciding here is deciding for every request).
    mutations = [Depends(require_token)]
    reads = [Depends(require_token)] if replica.config.protect_reads else []
    read_errors = _TOKEN_ERRORS if replica.config.protect_reads else {}
    change_errors = {**_TOKEN_ERRORS, **_NOT_DURABLE}

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        responses={503: {"model": ErrorOut, "description": "Not ready yet"}},
    )
    async def readyz() -> dict[str, Any]:
        """gRPC is serving and the state is loaded (503 otherwise)."""
        if not replica.ready:
            raise HTTPException(503, "not ready")
        return {"status": "ready", "grpc": replica.grpc_address}

    @app.get("/v1/policies", dependencies=reads, tags=["policy"], responses=read_errors)
    async def list_policies() -> list[PolicyInfo]:
        """The registry: every name a switch accepts (sharing specs are also accepted)."""
        out = []
        registry = replica.slot.registry
        for name in registry.names():
            try:
                cls = registry.get(name)
            except UnknownPolicyError as exc:  # a third-party entry point that does not load
                log.warning("%s", exc)
                continue
            module = cls.__module__.rsplit(".", 1)[-1]
            # Its own docstring, else its module's: inherited ones describe the base class.
            own = cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__ or name
            doc = inspect.cleandoc(own).splitlines()[0]
            if cls.name != name:  # a ThemisIO alias: say which sharing spec it stands for
                doc = f"{doc} Spec: {cls.name}."
            out.append(
                PolicyInfo(
                    name=name,
                    family=_FAMILIES.get(module, "external"),
                    description=doc,
                    params_schema=cls.Params.model_json_schema(),
                )
            )
        return out

    @app.get("/v1/policy", dependencies=reads, tags=["policy"], responses=read_errors)
    async def get_policy() -> ActivePolicy:
        """The active policy of this replica."""
        return replica.slot.active()

    @app.put("/v1/policy", dependencies=mutations, tags=["policy"], responses=change_errors)
    async def put_policy(body: PolicyIn) -> ActivePolicy:
        """Switch the policy: validated, applied at once, persisted, sent to the peers
        at once."""
        try:
            return replica.slot.switch(body.name, body.params)
        except UnknownPolicyError as exc:
            raise _invalid(["body", "name"], str(exc), body.name) from None
        except PolicyParamsError as exc:
            raise RequestValidationError(
                [
                    {"type": "value_error", "loc": ["body", "params", *loc], "msg": msg}
                    for loc, msg in exc.errors
                ]
            ) from None

    @app.get("/v1/replicas", dependencies=reads, tags=["replicas"], responses=read_errors)
    async def replicas() -> ReplicasOut:
        """This replica and the peers it has heard from."""
        sync = replica.peer_sync
        stats = sync.stats() if sync is not None else {"peers": [], "sync_interval_s": None}
        return ReplicasOut(
            replica_id=replica.config.replica_id,
            capacity=replica.config.capacity,
            policy=replica.slot.name,
            policy_version=replica.slot.version,
            sync_interval_s=stats["sync_interval_s"],
            peers=[PeerOut(**p) for p in stats["peers"]],
        )

    def on_peers(wanted: set[str]) -> dict[str, list[str]]:
        """Job id -> the live peers whose last digest lists it, for the ``wanted`` jobs;
        one pass over the digests per request, not one per job."""
        where: dict[str, list[str]] = {}
        if replica.peer_sync is not None:
            for d in replica.peer_sync.membership.digests():
                for job_id in wanted.intersection(d.jobs.job_id):
                    where.setdefault(job_id, []).append(d.replica_id)
        return where

    def job_out(job_id: str, now: float, peers: dict[str, list[str]]) -> JobOut | None:
        fields = job_fields(job_id, now, peers)
        return None if fields is None else JobOut(**fields)

    def job_fields(job_id: str, now: float, peers: dict[str, list[str]]) -> dict[str, Any] | None:
        """The fields of a ``JobOut`` (plain values: validated off the loop for a list)."""
        state: JobState | None = replica.table.jobs.get(job_id)
        registered = replica.table.registered.get(job_id)
        meta = state.meta if state is not None else registered
        if meta is None:
            return None
        replicas = [replica.config.replica_id] if state is not None else []
        replicas += peers.get(job_id, [])
        if state is None:  # registered, no session yet: the counters' defaults
            return dict(
                job_id=job_id,
                user=meta.user,
                group=meta.group,
                nodes=meta.nodes,
                priority=meta.priority,
                w=meta.w or None,
                vol_io=meta.vol_io or None,
                app=meta.app or None,
                registered=True,
                replicas=sorted(replicas),
            )
        cap = job_cap(meta.nodes, replica.config.node_bandwidth, replica.config.capacity)
        elapsed = now - state.first_seen
        return dict(
            job_id=job_id,
            user=meta.user,
            group=meta.group,
            nodes=meta.nodes,
            priority=meta.priority,
            w=meta.w or None,
            vol_io=meta.vol_io or None,
            app=meta.app or None,
            registered=registered is not None,
            active=state.status is JobStatus.ACTIVE,
            in_io=state.in_io(),
            rate=sum(s.rate or 0.0 for s in state.sessions.values()),
            bytes_read=state.bytes_read,
            bytes_written=state.bytes_written,
            bytes_moved=state.bytes_moved,
            metadata_ops=state.metadata_ops,
            yield_=state.progress(now, cap) / elapsed if elapsed > 0 else None,
            wait_seconds=state.wait_seconds,
            sessions=len(state.sessions),
            replicas=sorted(replicas),
            age_s=max(0.0, elapsed),
        )

    @app.get(
        "/v1/jobs",
        dependencies=reads,
        tags=["jobs"],
        response_model=list[JobOut],
        responses={
            200: {
                "headers": {
                    "X-Total-Count": {
                        "description": "how many jobs there are, in all pages",
                        "schema": {"type": "integer"},
                    }
                }
            },
            **read_errors,
        },
    )
    async def list_jobs(
        limit: Annotated[
            int, Query(ge=1, le=JOBS_PAGE_MAX, description="jobs in this page")
        ] = JOBS_PAGE_DEFAULT,
        offset: Annotated[int, Query(ge=0, description="jobs skipped before this page")] = 0,
        order: Annotated[
            Literal["job_id", "rate"],
            Query(description="`job_id` ascending, or `rate` descending (then job id)"),
        ] = "job_id",
    ) -> Response:
        """The jobs this replica knows (from client sessions, and registered ones), one
        page at a time; the header ``X-Total-Count`` gives how many there are."""
        table = replica.table
        # On the loop: C-speed copies; the ordering of every id runs in a thread.
        ids = table.jobs.keys() | table.registered.keys()
        rates: dict[str, float] = {}
        if order == "rate":
            for session in table.sessions.values():
                if session.rate:
                    job_id = session.job.meta.job_id
                    rates[job_id] = rates.get(job_id, 0.0) + session.rate
        page = await asyncio.to_thread(_page, ids, rates, order, offset, limit)
        # Back on the loop for this page's jobs only, where their fields change.
        now = replica.clock()
        peers = on_peers(set(page))
        rows = [f for f in (job_fields(i, now, peers) for i in page) if f is not None]
        body = await asyncio.to_thread(_dump_jobs, rows)
        return Response(
            body, media_type="application/json", headers={"X-Total-Count": str(len(ids))}
        )

    @app.get(
        "/v1/jobs/{job_id}",
        dependencies=reads,
        tags=["jobs"],
        responses={**read_errors, **_not_found("Unknown job")},
    )
    async def get_job(job_id: str) -> JobOut:
        out = job_out(job_id, replica.clock(), on_peers({job_id}))
        if out is None:
            raise HTTPException(404, f"unknown job {job_id!r}")
        return out

    @app.get(
        "/v1/schedules",
        dependencies=reads,
        tags=["jobs"],
        response_model=list[ScheduleOut],
        responses=read_errors,
    )
    async def list_schedules() -> list[ScheduleOut]:
        """The periodic patterns of windows in force (docs/protocol.md, "Windows"): per job
        with one, its period, where in it the job is now, and its windows with the job's
        total rate. Jobs paced at a plain rate are not listed."""
        now = replica.clock()
        found: dict[str, tuple[float, float, dict[tuple[float, float], float]]] = {}
        for session in replica.table.sessions.values():
            schedule = session.schedule
            if schedule is None:
                continue
            job_id = session.job.meta.job_id
            period, origin, windows = found.setdefault(
                job_id, (schedule.period, schedule.origin, {})
            )
            if (schedule.period, schedule.origin) != (period, origin):
                continue  # a session not yet moved to the job's new pattern
            for w in schedule.windows:
                windows[(w.start, w.end)] = windows.get((w.start, w.end), 0.0) + w.rate
        return [
            ScheduleOut(
                job_id=job_id,
                period_s=period,
                phase_s=(now - origin) % period,
                windows=[
                    WindowOut(start_s=start, end_s=end, rate=rate)
                    for (start, end), rate in sorted(windows.items())
                ],
            )
            for job_id, (period, origin, windows) in sorted(found.items())
        ]

    @app.get(
        "/v1/placement",
        dependencies=reads,
        tags=["placement"],
        response_model=PlacementOut,
        responses=read_errors,
    )
    async def get_placement(
        allocator: Annotated[
            AllocatorName | None, Query(description="allocator (default: by information level)")
        ] = None,
        placement: Annotated[
            PlacementName | None, Query(description="placement (default: by information level)")
        ] = None,
    ) -> PlacementOut:
        """Placement advice ([DIST-IO]; docs/placement-live.md): for every registered job and
        every job with live sessions here, how many and which live replicas it should use,
        with the allocator and information level its profile allowed, and the I/O-load."""
        # The inputs are gathered on the loop, the advice (pure, ~0.1 s for 1,000 jobs over
        # 200 replicas) runs in a worker thread so that sessions are not held up.
        advice = await asyncio.to_thread(
            advise_all,
            replica.placement_resources(),
            replica.placement_jobs(),
            compute_nodes=replica.config.placement_compute_nodes,
            allocator=allocator,
            placement=placement,
        )
        return _placement_out(advice)

    @app.post(
        "/v1/placement",
        dependencies=reads,
        tags=["placement"],
        response_model=PlacementOut,
        responses=read_errors,
    )
    async def post_placement(body: PlacementJobIn) -> PlacementOut:
        """The advice for one job about to start, given the others (which keep their
        placement). Advisory: nothing is stored, so it is protected as reads are."""
        registered = replica.table.registered.get(body.job_id)
        app_of = body.app or (registered.app if registered is not None else "")
        meta = JobMeta(body.job_id, body.user, body.group, body.nodes, 1.0, app=app_of)
        known = replica.job_input(meta)
        new = JobInput(
            body.job_id,
            body.nodes,
            volume_per_phase=body.volume_per_phase or known.volume_per_phase,
            compute_seconds=(
                body.compute_seconds if body.compute_seconds is not None else known.compute_seconds
            ),
            phases=body.phases or known.phases,
            bandwidth=body.bandwidth or known.bandwidth,
        )
        advice = await asyncio.to_thread(
            advise_one,
            replica.placement_resources(),
            new,
            replica.placement_jobs(),
            replica.presence(),
            compute_nodes=replica.config.placement_compute_nodes,
            allocator=body.allocator,
            placement=body.placement,
        )
        return _placement_out(advice)

    @app.get(
        "/v1/capacity",
        dependencies=reads,
        tags=["capacity"],
        response_model=CapacityOut,
        responses=read_errors,
    )
    async def capacity() -> CapacityOut:
        """The burst buffer (docs/capacity.md): S, what is used, per job what is resident,
        pending, reserved, its drain rate, its bytes drained and its drain error; the jobs
        waiting for space. Without ``--bb-capacity``, ``size`` and ``free`` are null and the
        mounts' reports and the drains are shown all the same."""
        books = replica.books
        buffers = books.jobs()
        drain_rates = replica.scheduler.drain_rates
        table = replica.table.jobs
        ids = set(buffers) | set(drain_rates)
        ids.update(j for j, state in table.items() if state.drained)
        rows = []
        for job_id in sorted(ids):
            b = buffers.get(job_id)
            state = table.get(job_id)
            rows.append(
                CapacityJobOut(
                    job_id=job_id,
                    resident=b.resident if b else 0,
                    pending=b.pending if b else 0,
                    reserved=b.reserved if b else 0,
                    drain_rate=drain_rates.get(job_id, 0.0),
                    drained=state.drained if state is not None else 0,
                    drain_error=b.drain_error if b else "",
                )
            )
        return CapacityOut(
            size=books.size,
            used=books.used,
            free=books.free,
            resident=sum(r.resident for r in rows),
            pending=sum(r.pending for r in rows),
            drain_bandwidth=replica.config.pfs_bandwidth,
            drain_rate=sum(drain_rates.values()),
            waiting=books.waiting_jobs(),
            jobs=rows,
        )

    @app.post(
        "/v1/jobs",
        dependencies=mutations,
        tags=["jobs"],
        status_code=201,
        responses={
            201: {"description": "A new registration"},
            200: {"model": JobOut, "description": "An existing registration, updated"},
            **change_errors,
        },
    )
    async def register_job(body: JobIn, response: Response) -> JobOut:
        """Register a job with authoritative metadata (a Slurm prolog does this); it
        wins over what clients claim. 201 when new, 200 when it updates one."""
        meta = JobMeta(
            body.job_id,
            body.user,
            body.group,
            body.nodes,
            body.priority,
            w=body.w or 0.0,
            vol_io=body.vol_io or 0.0,
            app=body.app or "",
        )
        if not replica.register_job(meta):
            response.status_code = 200
        out = job_out(body.job_id, replica.clock(), on_peers({body.job_id}))
        assert out is not None
        return out

    @app.delete(
        "/v1/jobs/{job_id}",
        dependencies=mutations,
        tags=["jobs"],
        status_code=204,
        responses={
            204: {"description": "Retired"},
            **_not_found("The job is not registered"),
            **change_errors,
        },
    )
    async def retire_job(job_id: str) -> Response:
        """Retire a registered job (a Slurm epilog does this); 404 if it is not registered."""
        if not replica.retire_job(job_id):
            raise HTTPException(404, f"job {job_id!r} is not registered")
        return Response(status_code=204)

    @app.get(
        "/metrics",
        dependencies=reads,
        tags=["metrics"],
        response_class=PlainTextResponse,
        responses=_as_json(read_errors),
    )
    async def metrics() -> PlainTextResponse:
        """Prometheus text format (controller/metrics.py lists the series): per-job series
        for the ``metrics_top_jobs`` jobs with the highest rate, aggregates over all;
        rendered in a worker thread, concurrent scrapes share one render."""
        return PlainTextResponse(await replica.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(OSError)
    async def not_durable(request: Request, exc: OSError) -> JSONResponse:
        # The state directory could not be written: the change was not applied.
        log.error("%s %s: cannot persist state: %s", request.method, request.url.path, exc)
        return JSONResponse(
            {"detail": f"cannot persist the state, nothing changed: {exc}"}, status_code=503
        )

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError) -> JSONResponse:
        # A check deeper down that the body validation did not catch: the documented shape
        # of a 422 (a list of errors), naming the body since no field is known.
        return JSONResponse(
            {"detail": [{"loc": ["body"], "msg": str(exc), "type": "value_error"}]},
            status_code=422,
        )

    mount_dashboard(app)
    return app


class _Server(uvicorn.Server):
    # The controller's CLI owns SIGINT/SIGTERM; uvicorn must not capture them.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """uvicorn serving ``app`` on ``listen`` in the running loop; ``port`` once started."""

    def __init__(self, app: FastAPI, listen: str, log_level: str) -> None:
        self.listen = listen
        # log_config=None: uvicorn's records go through the controller's logging setup.
        self._config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            log_level=log_level.lower(),
            access_log=log_level.upper() == "DEBUG",
            timeout_graceful_shutdown=1,
        )
        self._server = _Server(self._config)
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.port: int | None = None

    async def start(self) -> None:
        host, port = split_host_port(self.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP given, not 0: asyncio sets TCP_NODELAY only on sockets whose proto
        # says TCP, and without it every keep-alive answer (written in two sends) waits
        # ~40 ms for the client's delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot listen on {self.listen} (REST): {exc.strerror}") from None
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        # Connections wait in the backlog until uvicorn accepts them: ready as of now.
        self._task = asyncio.create_task(self._server.serve([sock]), name="controller-http")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except Exception:
            log.exception("REST server failed")
        self._task = None
        if self._sock is not None:
            self._sock.close()
