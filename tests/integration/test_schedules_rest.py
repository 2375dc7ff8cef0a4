"""``GET /v1/schedules``: the periodic patterns of windows in force, per job (the dashboard
draws them), from a real controller whose policy gives one job a schedule."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import pytest
from support import async_wait_until
from test_windows import END, PERIOD, START, R, holding, probe_replica  # noqa: F401  (fixture)

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica

pytestmark = pytest.mark.integration

KiB = 1 << 10


async def test_schedules_list_the_windows_of_each_job_that_has_them(
    probe_replica: Callable[..., Awaitable[Replica]],  # noqa: F811
) -> None:
    replica = await probe_replica(job="periodic")
    periodic = Session(replica.grpc_address, JobInfo("periodic", "ann", "phys"))
    plain = Session(replica.grpc_address, JobInfo("plain", "bob", "chem"))
    async with holding(periodic, plain):
        await async_wait_until(
            lambda: periodic.pattern is not None and plain.rate > 0, 10, message="allocations"
        )
        async with httpx.AsyncClient(base_url=replica.http_url) as http:
            response = await http.get("/v1/schedules")
            assert response.status_code == 200
            body = response.json()
            assert [s["job_id"] for s in body] == ["periodic"]  # "plain" has a rate only
            (schedule,) = body
            assert schedule["period_s"] == PERIOD
            assert 0 <= schedule["phase_s"] < PERIOD
            assert schedule["windows"] == [{"start_s": START, "end_s": END, "rate": R}]
            # The phase is the controller's clock against the pattern's origin (0).
            assert schedule["phase_s"] == pytest.approx(replica.clock() % PERIOD, abs=0.5)
            spec = (await http.get("/openapi.json")).json()
            assert "/v1/schedules" in spec["paths"]
