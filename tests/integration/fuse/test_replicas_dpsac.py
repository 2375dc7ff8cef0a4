"""``dpsac`` on two replicas that share one buffer budget, through two real mounts.

Two in-process replicas (λ = 0.2 s), each the other's peer, each with its part of the budget
(``--bb-capacity 24MiB``, ``--pfs-bandwidth 16MiB/s``: S = 48 MiB and B = 32 MiB/s in all),
policy ``dpsac`` (Δ = 0.5 s). A mount per replica stages out to its own PFS directory and
evicts after the copy. Four writers write 40 MiB each (4 files of 10 MiB), 160 MiB in all,
more than three times S: one job through both mounts, one job through each mount alone.

Both replicas decide from the merged view, with both buffers' books in it (digests carry them:
docs/replicas.md, "What each policy needs"). Every 100 ms the test reads both replicas' books
(the bytes on or promised to each buffer) and the bytes allocated under both backing
directories: the books' total and the disk's never exceed S plus one block per writer;
every file drains, identical on the PFS.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from support import MountProcess, async_wait_until, free_port
from support.bb import WRITER, all_copied, digest, expected_digests, tree_bytes

from burstctl.controller.app import Replica
from burstctl.policies.dpsac.live import DpsacPolicy

pytestmark = pytest.mark.integration

MiB = 1 << 20
S_PART = 24 * MiB
S = 2 * S_PART
FILES, FILE_MIB = 4, 10
BLOCK = MiB
# (job, mount index) per writer: "dp-a" writes through both mounts
WRITERS = [("dp-a", 0), ("dp-a", 1), ("dp-b", 0), ("dp-c", 1)]


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
async def test_dpsac_on_two_replicas_keeps_the_books_within_s_and_every_file_drains(
    replica_factory: Callable[..., Awaitable[Replica]],
    fuse_mount: Callable[..., MountProcess],
    tmp_path: Path,
) -> None:
    ports = [free_port(), free_port()]
    replicas = [
        await replica_factory(
            policy="dpsac",
            policy_params={"time_unit": 0.5},
            capacity="200MiB/s",
            node_bandwidth="50MiB/s",
            bb_capacity=S_PART,
            pfs_bandwidth=16 * MiB,
            grpc_listen=f"127.0.0.1:{ports[i]}",
            replica_id=f"r{i + 1}",
            peers=[f"127.0.0.1:{ports[1 - i]}"],
            sync_interval=0.2,
        )
        for i in range(2)
    ]
    dirs = []
    for i, replica in enumerate(replicas):
        backing, mnt, pfs = (tmp_path / f"{name}{i}" for name in ("backing", "mnt", "pfs"))
        for d in (backing, mnt, pfs):
            d.mkdir()
        args = ("--controller", replica.grpc_address, "--stage-out", str(pfs))
        await asyncio.to_thread(fuse_mount, backing, mnt, *args, "--evict", "after-copy")
        dirs.append((backing, mnt, pfs))
    books: list[int] = []
    disk: list[int] = []
    halt = threading.Event()

    async def sample() -> None:
        while not halt.is_set():
            books.append(sum(r.books.used for r in replicas))
            disk.append(await asyncio.to_thread(lambda: sum(tree_bytes(b) for b, _, _ in dirs)))
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    procs = []
    try:
        await async_wait_until(
            lambda: all(r.peer_sync and r.peer_sync.local_targets is not None for r in replicas),
            10,
            message="both replicas in the global view",
        )
        for seed, (job, m) in enumerate(WRITERS):
            target = dirs[m][1] / f"{job}-{seed}"
            target.mkdir()
            env = {**os.environ, "SLURM_JOB_ID": job, "SLURM_NNODES": "1"}
            argv = [sys.executable, "-c", WRITER, str(target), str(seed), str(FILES)]
            procs.append(
                subprocess.Popen([*argv, str(FILE_MIB)], env=env, stderr=subprocess.PIPE, text=True)
            )
        # The merged view the replicas decide from has the buffers: dpsac clusters its jobs
        # (without a buffer it would be BIOS, with no clustering), for as long as they write.
        merged = replicas[0].slot.merged
        assert isinstance(merged, DpsacPolicy) and merged is not replicas[0].slot.policy
        await async_wait_until(lambda: merged.clustering, 20, message="dpsac's global clusters")
        for proc in procs:
            _, err = await asyncio.to_thread(proc.communicate, timeout=240)
            assert proc.returncode == 0, f"writer failed: {err}"
        sizes = {}
        for seed, (job, m) in enumerate(WRITERS):
            for n in range(FILES):
                sizes[(m, f"{job}-{seed}/f{n:02d}")] = FILE_MIB * MiB

        def drained() -> bool:
            return all(
                all_copied(dirs[m][2], [rel for (mm, rel) in sizes if mm == m], FILE_MIB * MiB)
                for m in range(2)
            )

        await async_wait_until(drained, 120, message="every file on its PFS")
    finally:
        halt.set()
        await sampler
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for seed, (job, m) in enumerate(WRITERS):
        want = expected_digests(seed, FILES, FILE_MIB)
        for n in range(FILES):
            rel = f"{job}-{seed}/f{n:02d}"
            assert digest(dirs[m][2] / rel) == want[n], f"{rel} on PFS {m}"
    print(
        f"books peak {max(books) / MiB:.1f} MiB (S = {S / MiB:.0f}), disk peak "
        f"{max(disk) / MiB:.1f} MiB; {len(books)} samples"
    )
    # A writer's last grant may be rounded up to its file system's blocks: one block each.
    assert max(books) <= S + len(WRITERS) * BLOCK, f"the books hold {max(books) / MiB:.1f} MiB"
    assert max(disk) <= S + len(WRITERS) * BLOCK, f"{max(disk) / MiB:.1f} MiB on the buffers"
