"""``/v1/capacity``: the burst buffer of a replica and the drains to the PFS (docs/capacity.md).

The path keeps the word the API was given; what it shows is the buffer's size S and its
books (``controller/buffer.py``), not the bandwidth B (``--capacity``).
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response
from pydantic import BaseModel, Field

from burstctl.controller.buffer import BufferBooks
from burstctl.controller.jobs import JobTable
from burstctl.controller.rest.auth import Access
from burstctl.controller.rest.models import TOKEN_ERRORS, not_found
from burstctl.controller.scheduler import Scheduler


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


def capacity_router(
    books: BufferBooks, scheduler: Scheduler, table: JobTable, access: Access
) -> APIRouter:
    """The buffer's ``books``, the drain rates ``scheduler`` allots, the bytes the jobs of
    ``table`` drained."""
    router = APIRouter()

    @router.get(
        "/v1/capacity",
        dependencies=access.reads,
        tags=["capacity"],
        response_model=CapacityOut,
        responses=access.read_errors,
    )
    async def capacity() -> CapacityOut:
        """The burst buffer (docs/capacity.md): S, what is used, per job what is resident,
        pending, reserved, its drain rate, its bytes drained and its drain error; the jobs
        waiting for space. Without ``--bb-capacity``, ``size`` and ``free`` are null and the
        mounts' reports and the drains are shown all the same."""
        buffers = books.jobs()
        drain_rates = scheduler.drain_rates
        jobs = table.jobs
        ids = set(buffers) | set(drain_rates)
        ids.update(j for j, state in jobs.items() if state.drained)
        rows = []
        for job_id in sorted(ids):
            b = buffers.get(job_id)
            state = jobs.get(job_id)
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
            drain_bandwidth=books.drain_bandwidth,
            drain_rate=sum(drain_rates.values()),
            waiting=books.waiting_jobs(),
            jobs=rows,
        )

    @router.delete(
        "/v1/capacity/parked/{job_id}",
        dependencies=access.mutations,
        tags=["capacity"],
        status_code=204,
        responses={
            204: {"description": "Released"},
            **not_found("The job has no parked resident (on that host)"),
            **TOKEN_ERRORS,  # nothing durable is written
        },
    )
    async def release_parked(job_id: str, host: str | None = None) -> Response:
        """Release the job's parked residents (on ``host``, or every host): the bytes its
        mounts left on the buffer when their streams ended are gone (a node that will not
        come back; docs/capacity.md, "Holders that end"); 404 if there are none."""
        if not books.release(job_id, host):
            raise HTTPException(404, f"job {job_id!r} has no parked resident")
        return Response(status_code=204)

    return router
