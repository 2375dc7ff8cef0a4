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
from collections.abc import Awaitable, Callable

import httpx
import pytest
from support import async_wait_until
from support.periodic import (
    WINDOWS,
    Steady,
    Trace,
    late,
    periodic_loop,
    pump,
    pumped,
    short_of,
    steady_windows,
)

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
SETTINGS = {
    "policy": "persched",
    "policy_params": {"reserve": RESERVE, "kprime": 2, "headroom": 0.1},
}
# Iterations within which every job must be learned, and how close (its period, and its
# bytes per iteration). The compute time w alone is not held to it: the controller sees a
# phase start when the message arrives, so its event loop's lag on a loaded machine (it runs
# in this test's process) lengthens every gap by a few ms, 6 % of w at worst on CI's cores.
LEARN_ITERATIONS = 10
LEARN_TOLERANCE = 0.05
# Times the pattern may be computed again while the jobs run: a learned period that moves by
# more than the estimator's 2 % step (PUBLISH_TOLERANCE) as the machine's load changes.
RELEARN = 2


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

    def off_the_truth() -> list[str]:
        """The jobs whose period as the policies use it is not learned within 5 % of the
        truth (vol_io and the period alone)."""
        off = []
        for name, nodes, w, vol in PERIODIC:
            period = table.periodic_of(table.jobs[name])
            if period is None or not period.learned:
                off.append(f"{name}: not learned")
                continue
            cap = job_cap(nodes, config.node_bandwidth, config.capacity)
            got = (period.vol_io, period.w + period.vol_io / cap)
            truth = (vol, w + vol / cap)
            if any(abs(g - t) > LEARN_TOLERANCE * t for g, t in zip(got, truth, strict=True)):
                off.append(f"{name}: learned {got} for {truth}")
        return off

    try:
        for name, _, w, vol in PERIODIC:
            loop = asyncio.to_thread(periodic_loop, sessions[name], w, vol, stop, traces[name])
            workers.append(asyncio.create_task(loop))
        await async_wait_until(learned, 60, message="the three jobs learned, and their pattern")
        installed = policy.installed
        assert installed is not None and installed.computed.result is not None
        assert installed.computed.error is None
        assert max(learned_at.values()) <= LEARN_ITERATIONS, learned_at
        assert not off_the_truth(), off_the_truth()
        workers.append(asyncio.create_task(asyncio.to_thread(pump, other, stop, other_grants)))
        reserve = RESERVE * config.capacity

        def misses(window: Steady) -> list[str]:
            # the non-periodic job gets the reserve, within 15 %; the learned values (learned
            # again if the pattern was) stay within 5 % of the truth
            return late(window) + short_of(window, other_grants, reserve) + off_the_truth()

        # Windows of 6 steady iterations of every periodic job.
        windows = await steady_windows(policy, installed, traces, 6, 25, misses, relearn=RELEARN)
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
    window = windows[-1]
    period = window.installed.computed.result.period
    print(
        f"learned after {learned_at} iterations; period {period:.4f} s; per job: "
        f"{window.report}; window {len(windows)} of the test's {WINDOWS}"
    )
    print(
        f"non-periodic: {pumped(window, other_grants) / MiB:.3f} MiB/s for a reserve of "
        f"{reserve / MiB:.3f} MiB/s"
    )
    assert not window.missed, (window.missed, window.report)
    # /v1/jobs shows declared (none) and learned, and which one the policies use
    assert shown["w"] is None and shown["period_used"] == "learned"
    assert shown["learned"]["confident"] and shown["learned"]["samples"] >= 6
    assert shown["learned"]["vol_io"] == pytest.approx(3 * MiB, rel=LEARN_TOLERANCE)
    assert shown["learned"]["io_fraction"] == pytest.approx((3 / 16) / (0.2 + 3 / 16), rel=0.05)
    # the non-periodic job (one long phase) is never learned, and gets the reserve
    assert pumping["period_used"] is None and pumping["learned"] is None
