"""``/v1/jobs``: the jobs a replica knows, one page at a time, and their registration.

A job is known from its client sessions (the job table) or from its registration
(``POST /v1/jobs``, a Slurm prolog; ``DELETE`` retires it: ``controller/registrations.py``).
A large table is never one answer: pages are bounded, ordered in a worker thread, and only
the jobs of one page are read on the loop.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from burstctl.common.limits import MAX_NODES, MAX_PERIOD_VOL, MAX_PERIOD_W, MAX_PRIORITY
from burstctl.controller.jobs import JobTable
from burstctl.controller.membership import Membership
from burstctl.controller.records import JobMeta, JobState, JobStatus
from burstctl.controller.registrations import CatalogFull, Registrations
from burstctl.controller.rest.auth import Access
from burstctl.controller.rest.models import Identifier, not_found
from burstctl.controller.rulebook import RuleBook
from burstctl.policies.view import job_cap


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


class LearnedOut(BaseModel):
    """The period learned from the job's observed I/O phases (docs/persched.md, "Learned
    periods")."""

    period: float = Field(description="T = w + vol_io / b_i, seconds: its iteration alone")
    w: float = Field(description="compute seconds per iteration (gap between phases)")
    vol_io: float = Field(description="bytes per iteration (per phase)")
    io_fraction: float = Field(description="(vol_io / b_i) / T")
    confidence: float = Field(description="in [0, 1]")
    samples: int = Field(description="phases the estimate rests on (a bounded window)")
    confident: bool = Field(description="the policies may use it")


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
    learned: LearnedOut | None = Field(default=None, description="its period as learned")
    period_used: Literal["declared", "learned"] | None = Field(
        default=None, description="the period the policies use (null: none, not periodic)"
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
        default=0.0,
        description="seconds the job's I/O waited on its bucket (throttled), all sessions",
    )
    rule: str | None = Field(default=None, description="the rule that binds it (docs/rules.md)")
    limited_by: str | None = Field(
        default=None, description="the rule whose limit holds it back now, else null"
    )
    reservation_met: bool | None = Field(
        default=None, description="whether its rule's reservation is met (null: none)"
    )
    sessions: int = 0
    replicas: list[str] = Field(description="replicas this job is present on (self and peers)")
    age_s: float = Field(default=0.0, description="seconds since this replica first saw the job")


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


def jobs_router(
    replica_id: str,
    capacity: float,
    node_bandwidth: float,
    *,
    table: JobTable,
    registrations: Registrations,
    rules: RuleBook,
    membership: Membership | None,
    access: Access,
) -> APIRouter:
    """The job routes of replica ``replica_id`` (B = ``capacity``, b = ``node_bandwidth``:
    a job's yield is measured against its b_i); ``membership``: the peers' digests, which
    say where else a job is present (None without peers)."""
    router = APIRouter()

    def on_peers(wanted: set[str]) -> dict[str, list[str]]:
        """Job id -> the live peers whose last digest lists it, for the ``wanted`` jobs."""
        return membership.holders(wanted) if membership is not None else {}

    def job_out(job_id: str, now: float, peers: dict[str, list[str]]) -> JobOut | None:
        fields = job_fields(job_id, now, peers)
        return None if fields is None else JobOut(**fields)

    def job_fields(job_id: str, now: float, peers: dict[str, list[str]]) -> dict[str, Any] | None:
        """The fields of a ``JobOut`` (plain values: validated off the loop for a list)."""
        state: JobState | None = table.jobs.get(job_id)
        registered = table.registered.get(job_id)
        meta = state.meta if state is not None else registered
        if meta is None:
            return None
        replicas = [replica_id] if state is not None else []
        replicas += peers.get(job_id, [])
        fields: dict[str, Any] = dict(
            job_id=job_id,
            user=meta.user,
            group=meta.group,
            nodes=meta.nodes,
            priority=meta.priority,
            w=meta.w or None,
            vol_io=meta.vol_io or None,
            app=meta.app or None,
            registered=registered is not None,
            replicas=sorted(replicas),
        )
        rule = rules.rule_of(job_id)
        if rule is not None:
            status = rules.status().get(rule.name)
            fields["rule"] = rule.name
            fields["limited_by"] = rule.name if status is not None and status.limited else None
            fields["reservation_met"] = status.reservation_met if status is not None else None
        if state is None:  # registered, no session yet: the counters' defaults
            declared = meta.w > 0 and meta.vol_io > 0
            return {**fields, "period_used": "declared" if declared else None}
        cap = job_cap(meta.nodes, node_bandwidth, capacity)
        elapsed = now - state.first_seen
        learned = state.phases.estimate
        used = table.periodic_of(state)
        fields.update(
            learned=None
            if learned is None
            else dict(
                period=learned.period(cap),
                w=learned.w,
                vol_io=learned.vol_io,
                io_fraction=learned.io_fraction(cap),
                confidence=learned.confidence,
                samples=learned.samples,
                confident=learned.confident,
            ),
            period_used=None if used is None else "learned" if used.learned else "declared",
            active=state.status is JobStatus.ACTIVE,
            in_io=state.in_io(),
            rate=sum(s.rate or 0.0 for s in state.sessions.values()),
            bytes_read=state.bytes_read,
            bytes_written=state.bytes_written,
            bytes_moved=state.bytes_moved,
            metadata_ops=state.metadata_ops,
            yield_=state.live_yield(now, cap),
            wait_seconds=state.wait_seconds,
            sessions=len(state.sessions),
            age_s=max(0.0, elapsed),
        )
        return fields

    @router.get(
        "/v1/jobs",
        dependencies=access.reads,
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
            **access.read_errors,
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
        now = table.clock()
        peers = on_peers(set(page))
        rows = [f for f in (job_fields(i, now, peers) for i in page) if f is not None]
        body = await asyncio.to_thread(_dump_jobs, rows)
        return Response(
            body, media_type="application/json", headers={"X-Total-Count": str(len(ids))}
        )

    @router.get(
        "/v1/jobs/{job_id}",
        dependencies=access.reads,
        tags=["jobs"],
        responses={**access.read_errors, **not_found("Unknown job")},
    )
    async def get_job(job_id: str) -> JobOut:
        out = job_out(job_id, table.clock(), on_peers({job_id}))
        if out is None:
            raise HTTPException(404, f"unknown job {job_id!r}")
        return out

    @router.post(
        "/v1/jobs",
        dependencies=access.mutations,
        tags=["jobs"],
        status_code=201,
        responses={
            201: {"description": "A new registration"},
            200: {"model": JobOut, "description": "An existing registration, updated"},
            **access.change_errors,
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
        try:
            new = registrations.register(meta)
        except CatalogFull as exc:
            raise HTTPException(503, f"job_id: {exc}") from None
        if not new:
            response.status_code = 200
        out = job_out(body.job_id, table.clock(), on_peers({body.job_id}))
        assert out is not None
        return out

    @router.delete(
        "/v1/jobs/{job_id}",
        dependencies=access.mutations,
        tags=["jobs"],
        status_code=204,
        responses={
            204: {"description": "Retired"},
            **not_found("The job is not registered"),
            **access.change_errors,
        },
    )
    async def retire_job(job_id: str) -> Response:
        """Retire a registered job (a Slurm epilog does this); 404 if it is not registered."""
        if not registrations.retire(job_id):
            raise HTTPException(404, f"job {job_id!r} is not registered")
        return Response(status_code=204)

    return router
