"""``persched`` with periods learned online: three periodic client jobs that declare nothing are
learned from their phases (``policies/periods.py``) within 10 iterations, to within 5 % of their
true w, vol_io and period; PERSCHED's pattern is then computed on the learned values and the jobs
pace to it as declared ones do; a non-periodic job is never learned and gets the reserve.

The controller runs in this test's event loop, the sessions on their own threads
(``support/periodic.py``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from support import async_wait_until
from support.periodic import CHUNK, Paced, Trace, paced, periodic_loop, pump

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica
from burstctl.policies.persched.live import PerSchedLive
from burstctl.policies.view import job_cap

pytestmark = pytest.mark.integration

MiB = 1 << 20
# The jobs of test_persched_live.py, declaring nothing: B = 40 MiB/s, b = 8 MiB/s;
# (name, nodes, w s, vol_io bytes)
PERIODIC = [("p1", 2, 0.2, 3 * MiB), ("p2", 2, 0.3, 4 * MiB), ("p3", 1, 0.25, 1 * MiB)]
RESERVE = 0.1
SETTINGS = {"policy": "persched", "policy_params": {"reserve": RESERVE, "kprime": 2}}
# Iterations within which every job must be learned, and how close.
LEARN_ITERATIONS = 10
LEARN_TOLERANCE = 0.05


@pytest.mark.serial
async def test_periods_learned_online_are_used_by_persched_and_the_jobs_pace_to_them(
    replica_factory: Callable[..., Awaitable[Replica]],
) -> None:
    replica = await replica_factory(**SETTINGS)
    policy = replica.slot.policy
    assert isinstance(policy, PerSchedLive)
    config = replica.config
    table = replica.table
    stop = threading.Event()
    sessions = {
        name: Session(replica.grpc_address, JobInfo(name, "ann", "phys", nodes))
        for name, nodes, *_ in PERIODIC
    }
    traces = {name: Trace() for name, *_ in PERIODIC}
    other_grants: list[float] = []
    other = Session(replica.grpc_address, JobInfo("np", "bob", "chem", 1))
    learned_at: dict[str, int] = {}  # iterations the job had completed when first learned
    workers = []

    def learned() -> bool:
        for name, trace in traces.items():
            job = table.jobs.get(name)
            if name not in learned_at and job is not None and table.periodic_of(job) is not None:
                learned_at[name] = len(trace.iterations)
        installed = policy.installed
        return (
            len(learned_at) == len(traces)
            and installed is not None
            and {j for j, *_ in installed.computed.key[0]} == set(traces)
        )

    try:
        for name, _, w, vol in PERIODIC:
            loop = asyncio.to_thread(periodic_loop, sessions[name], w, vol, stop, traces[name])
            workers.append(asyncio.create_task(loop))
        await async_wait_until(learned, 60, message="the three jobs learned, and their pattern")
        installed = policy.installed
        assert installed is not None and installed.computed.result is not None
        assert installed.computed.error is None
        for name, nodes, w, vol in PERIODIC:
            period = table.periodic_of(table.jobs[name])
            assert period is not None and period.learned, name
            cap = job_cap(nodes, config.node_bandwidth, config.capacity)
            true_period = w + vol / cap
            got = (period.w, period.vol_io, period.w + period.vol_io / cap)
            assert learned_at[name] <= LEARN_ITERATIONS, (name, learned_at)
            for value, truth in zip(got, (w, vol, true_period), strict=True):
                assert value == pytest.approx(truth, rel=LEARN_TOLERANCE), (name, got)
        steady = time.monotonic() + 2 * installed.computed.result.period
        workers.append(asyncio.create_task(asyncio.to_thread(pump, other, stop, other_grants)))
        await async_wait_until(
            lambda: all(sum(s >= steady for s, _ in t.iterations) >= 6 for t in traces.values()),
            25,
            message="6 steady iterations of every periodic job",
        )
        assert policy.installed is installed, "the pattern changed while the jobs ran"
        window_end = time.monotonic()
        stop.set()
        await asyncio.gather(*workers)
        # the sessions are still open: the jobs are live
        token = (config.state_dir / "admin-token").read_text().strip()
        async with httpx.AsyncClient(
            base_url=replica.http_url, headers={"Authorization": f"Bearer {token}"}
        ) as http:
            shown = (await http.get("/v1/jobs/p1")).json()
            pumping = (await http.get("/v1/jobs/np")).json()
    finally:
        stop.set()
        for s in (*sessions.values(), other):
            await asyncio.to_thread(s.close)
    report: list[Paced] = []
    for name, trace in traces.items():
        report.append(paced(installed, name, trace, steady, window_end))
        got = report[-1]
        assert got.outside <= 0.01 * got.grants, report
        assert got.measured == pytest.approx(got.predicted, rel=0.05), report
    # /v1/jobs shows declared (none) and learned, and which one the policies use
    assert shown["w"] is None and shown["period_used"] == "learned"
    assert shown["learned"]["confident"] and shown["learned"]["samples"] >= 6
    assert shown["learned"]["w"] == pytest.approx(0.2, rel=LEARN_TOLERANCE)
    assert shown["learned"]["io_fraction"] == pytest.approx((3 / 16) / (0.2 + 3 / 16), rel=0.05)
    # the non-periodic job (one long phase) is never learned, and gets the reserve
    assert pumping["period_used"] is None and pumping["learned"] is None
    period = installed.computed.result.period
    print(f"learned after {learned_at} iterations; period {period:.4f} s; per job: {report}")
    got_reserve = [t for t in other_grants if steady <= t <= window_end]
    rate = len(got_reserve) * CHUNK / (window_end - steady)
    reserve = RESERVE * config.capacity
    print(f"non-periodic: {rate / MiB:.3f} MiB/s for a reserve of {reserve / MiB:.3f} MiB/s")
    assert rate == pytest.approx(reserve, rel=0.15)
