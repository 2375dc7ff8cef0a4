"""Metadata QoS through the preload library: a job's metadata limit paces the creates and
removals of a program run by ``burstctl exec`` on files under the agent's paths; another
job's storm, and calls outside the paths, go unpaced (docs/preload.md, "Metadata calls").

The real controller runs in this test's loop, a real ``burstctl agent`` and the real library
in child processes; once the storms' first calls attached them, an operator's rule
(``POST /v1/rules``, ``metadata_ops``) limits one job.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from agent_process import CLEAN, AgentProcess
from support import async_wait_until
from support.metadata_loop import MetadataLoop, limit_job, ops_rate

from burstctl.controller.app import Replica

pytestmark = pytest.mark.integration

LIMIT = 200.0
CEILING = 210.0
SECONDS = 3.5


def exec_prefix(agent: AgentProcess) -> list[str]:
    return [sys.executable, "-m", "burstctl", "exec", "--agent", str(agent.socket), "--"]


@pytest.mark.serial
async def test_a_jobs_metadata_limit_paces_its_storm_under_exec_and_not_another_jobs(
    replica_factory: Callable[..., Awaitable[Replica]],
    agents: Callable[..., AgentProcess],
    world: Path,
) -> None:
    replica = await replica_factory()
    bb = world / "bb"
    agent = await asyncio.to_thread(
        agents, "--controller", replica.grpc_address, "--paths", str(bb), "--tick", "0.02"
    )
    (bb / "storm").mkdir()
    (bb / "calm").mkdir()
    prefix = exec_prefix(agent)
    paced = MetadataLoop(bb / "storm", {**CLEAN, "BURSTCTL_JOB_ID": "storm"}, prefix)
    free = MetadataLoop(bb / "calm", {**CLEAN, "BURSTCTL_JOB_ID": "calm"}, prefix)
    outside = MetadataLoop(world, {**CLEAN, "BURSTCTL_JOB_ID": "storm"}, prefix)
    try:
        for loop in (paced, free, outside):
            await asyncio.to_thread(loop.ready)
        await limit_job(replica, "storm", LIMIT)
        await async_wait_until(
            lambda: (agent.job("storm") or {}).get("metadata_rate") == LIMIT,
            10,
            message="the agent to publish the limit on the job's page",
        )
        for loop in (paced, free, outside):
            loop.go(SECONDS)
        paced_times, free_times, outside_times = await asyncio.gather(
            *(asyncio.to_thread(loop.times) for loop in (paced, free, outside))
        )
    finally:
        for loop in (paced, free, outside):
            loop.close()
    paced_rate, paced_span = ops_rate(paced_times)
    free_rate, free_span = ops_rate(free_times)
    outside_rate, _ = ops_rate(outside_times)
    print(
        f"paced {paced_rate:.1f} ops/s over {paced_span:.2f} s; free {free_rate:.1f} ops/s;"
        f" the paced job outside the paths {outside_rate:.1f} ops/s"
    )
    assert paced_span >= 2.0 and free_span >= 2.0
    assert paced_rate <= CEILING
    # One create and one removal are exactly two metadata calls of the library: the storm
    # goes at the limit, not far below it.
    assert paced_rate >= 0.5 * LIMIT
    assert free_rate > 1.5 * CEILING, "the other job's metadata was slowed"
    assert outside_rate > 1.5 * CEILING, "calls outside the paths were slowed"
    await async_wait_until(
        lambda: replica.table.jobs["storm"].metadata_ops >= len(paced_times),
        10,
        message="the agent to book the storm's metadata calls",
    )
