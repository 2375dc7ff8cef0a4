"""``/v1/schedules``: the periodic patterns of windows in force (docs/protocol.md, "Windows")."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from burstctl.controller.jobs import JobTable
from burstctl.controller.rest.auth import Access


class WindowOut(BaseModel):
    start_s: float = Field(description="seconds from the start of the period")
    end_s: float = Field(description="seconds from the start of the period (past it: wraps)")
    rate: float = Field(description="bytes per second, the job's total over its sessions")


class ScheduleOut(BaseModel):
    job_id: str
    period_s: float
    phase_s: float = Field(description="where in its period the job is now, in [0, period_s)")
    windows: list[WindowOut]


def schedules_router(table: JobTable, access: Access) -> APIRouter:
    """The patterns the scheduler last pushed to the sessions of ``table``."""
    router = APIRouter()

    @router.get(
        "/v1/schedules",
        dependencies=access.reads,
        tags=["jobs"],
        response_model=list[ScheduleOut],
        responses=access.read_errors,
    )
    async def list_schedules() -> list[ScheduleOut]:
        """The periodic patterns of windows in force (docs/protocol.md, "Windows"): per job
        with one, its period, where in it the job is now, and its windows with the job's
        total rate. Jobs paced at a plain rate are not listed."""
        now = table.clock()
        found: dict[str, tuple[float, float, dict[tuple[float, float], float]]] = {}
        for session in table.sessions.values():
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

    return router
