"""Metadata QoS through a real mount: a job's metadata limit paces its creates and removals
(docs/fuse.md, "Metadata operations"), another job's metadata goes unpaced.

The real controller runs in this test's loop; once both jobs' sessions are open, an
operator's rule (``POST /v1/rules``, ``metadata_ops``) limits one of them. Two storms
(tests/support/metadata_loop.py) run at once, one per job, each timing its own operations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from support import MountProcess, clean_env
from support.metadata_loop import MetadataLoop, limit_job, ops_rate

from burstctl.controller.app import Replica

pytestmark = pytest.mark.integration

LIMIT = 200.0  # ops/s for the paced job
CEILING = 210.0  # what its storm may reach, measured (the acceptance bound)
SECONDS = 3.5  # each storm's length; measured after its first second


@pytest.mark.serial
@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
async def test_a_jobs_metadata_limit_paces_its_storm_and_not_another_jobs(
    replica_factory: Callable[..., Awaitable[Replica]],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
) -> None:
    replica = await replica_factory()
    backing, mnt = fuse_dirs
    await asyncio.to_thread(fuse_mount, backing, mnt, "--controller", replica.grpc_address)
    clean = clean_env(("BURSTCTL_", "SLURM_"))
    paced = MetadataLoop(mnt, {**clean, "BURSTCTL_JOB_ID": "storm"})
    free = MetadataLoop(mnt, {**clean, "BURSTCTL_JOB_ID": "calm"})
    try:
        await asyncio.to_thread(paced.ready)
        await asyncio.to_thread(free.ready)
        await limit_job(replica, "storm", LIMIT)
        paced.go(SECONDS)
        free.go(SECONDS)
        paced_times, free_times = await asyncio.gather(
            asyncio.to_thread(paced.times), asyncio.to_thread(free.times)
        )
    finally:
        paced.close()
        free.close()
    paced_rate, paced_span = ops_rate(paced_times)
    free_rate, free_span = ops_rate(free_times)
    print(f"paced {paced_rate:.1f} ops/s over {paced_span:.2f} s; free {free_rate:.1f} ops/s")
    assert paced_span >= 2.0 and free_span >= 2.0
    assert paced_rate <= CEILING
    # Each create and each removal is at least one metadata request of the mount, so the
    # storm's own rate is at most the limit; it is not starved either.
    assert paced_rate >= 0.25 * LIMIT
    assert free_rate > 1.5 * CEILING, "the other job's metadata was slowed"
    job = replica.table.jobs["storm"]
    assert job.metadata_ops > 0 and not job.in_io()
