"""``/v1/placement``: placement advice ([DIST-IO]; docs/placement-live.md).

For every registered job and every job with live sessions here (``GET``), or for one job
about to start (``POST``), how many and which live replicas it should use. The inputs are
gathered on the loop (``controller/placement.py``); the advice (``controller/advice.py``,
pure) runs in a worker thread so that sessions are not held up.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from burstctl.common.limits import (
    MAX_NODES,
    MAX_PERIOD_VOL,
    MAX_PERIOD_W,
    MAX_RATE,
    AllocatorName,
    PlacementName,
)
from burstctl.controller.advice import Advice, JobInput, advise_all, advise_one
from burstctl.controller.jobs import JobTable
from burstctl.controller.placement import PlacementInputs
from burstctl.controller.profiles import MAX_REPLICA_COUNT
from burstctl.controller.records import JobMeta
from burstctl.controller.rest.auth import Access
from burstctl.controller.rest.models import Identifier


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


def placement_router(
    inputs: PlacementInputs, table: JobTable, compute_nodes: int | None, access: Access
) -> APIRouter:
    """The advice from ``inputs``; ``compute_nodes``: Q^cpu (None: the advised jobs' nodes)."""
    router = APIRouter()

    @router.get(
        "/v1/placement",
        dependencies=access.reads,
        tags=["placement"],
        response_model=PlacementOut,
        responses=access.read_errors,
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
        # The inputs are gathered on the loop; the advice (pure, but long for a large
        # cluster: docs/benchmarks.md) runs in a worker thread so sessions are not held up.
        advice = await asyncio.to_thread(
            advise_all,
            inputs.resources(),
            inputs.jobs(),
            compute_nodes=compute_nodes,
            allocator=allocator,
            placement=placement,
        )
        return _placement_out(advice)

    @router.post(
        "/v1/placement",
        dependencies=access.reads,
        tags=["placement"],
        response_model=PlacementOut,
        responses=access.read_errors,
    )
    async def post_placement(body: PlacementJobIn) -> PlacementOut:
        """The advice for one job about to start, given the others (which keep their
        placement). Advisory: nothing is stored, so it is protected as reads are."""
        registered = table.registered.get(body.job_id)
        app_of = body.app or (registered.app if registered is not None else "")
        meta = JobMeta(body.job_id, body.user, body.group, body.nodes, 1.0, app=app_of)
        known = inputs.job_input(meta)
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
            inputs.resources(),
            new,
            inputs.jobs(),
            inputs.presence(),
            compute_nodes=compute_nodes,
            allocator=body.allocator,
            placement=body.placement,
        )
        return _placement_out(advice)

    return router
