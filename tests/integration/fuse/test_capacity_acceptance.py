"""Issue 18's live acceptance of the capacity tier: a burst buffer smaller than what is written.

A controller with ``--bb-capacity 200MiB --pfs-bandwidth 40MiB/s`` and one mount with
``--stage-out PFS --evict after-copy``. Three writers with different job ids each write
150 MiB (15 files of 10 MiB, 1 MiB writes), 450 MiB in all, more than twice S. A sampler
reads the buffer's used space (Σ st_blocks · 512 over BACKING) every 100 ms.

- The buffer's used space never exceeds S plus one in-flight block per writer.
- Every writer completes without an error (writes wait for space; none fails).
- Every file ends byte-identical on the PFS directory, and reads back identical through the
  mount once evicted.
- The drain's throughput, over the middle of the drain (20 % to 80 % of the bytes on the
  PFS, the buffer full and every writer waiting on space), is within 5 % of the granted
  40 MiB/s.

Run with ``-s`` to see the measured figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import wait_until
from support.bb import WRITER, Sampler, all_copied, digest, expected_digests, tree_bytes

pytestmark = pytest.mark.integration

MiB = 1 << 20
S = 200 * MiB
DRAIN = 40 * MiB
FILES, FILE_MIB = 15, 10
JOBS = ("cap-a", "cap-b", "cap-c")
BLOCK = MiB


@pytest.mark.serial  # the drain rate is measured over a window: alone, not beside other tests
@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
def test_three_writers_share_a_small_buffer_that_drains_to_the_pfs(
    controller_factory, fuse_mount, fuse_dirs, tmp_path: Path
) -> None:
    controller = controller_factory(
        "--capacity",
        "1GiB/s",
        "--node-bandwidth",
        "1GiB/s",
        "--bb-capacity",
        "200MiB",
        "--pfs-bandwidth",
        "40MiB/s",
    )
    backing, mountpoint = fuse_dirs
    pfs = tmp_path / "pfs"
    pfs.mkdir()
    fuse_mount(
        backing,
        mountpoint,
        "--controller",
        controller.address,
        "--stage-out",
        str(pfs),
        "--evict",
        "after-copy",
    )
    for job in JOBS:
        (mountpoint / job).mkdir()
    sampler = Sampler(backing, pfs)
    sampler.start()
    writers = {}
    try:
        for seed, job in enumerate(JOBS):
            writers[job] = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    str(mountpoint / job),
                    str(seed),
                    str(FILES),
                    str(FILE_MIB),
                ],
                env={**os.environ, "SLURM_JOB_ID": job, "SLURM_NNODES": "1"},
                stderr=subprocess.PIPE,
                text=True,
            )
        for job, proc in writers.items():
            _, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, f"writer {job} failed: {err}"
        names = [(seed, job, n) for seed, job in enumerate(JOBS) for n in range(FILES)]
        rels = [f"{job}/f{n:02d}" for _, job, n in names]
        wait_until(
            lambda: all_copied(pfs, rels, FILE_MIB * MiB), 120, message="every file on the PFS"
        )
        # evicted: the buffer empties (the stubs keep no blocks)
        wait_until(lambda: tree_bytes(backing, True) < MiB, 60, message="the buffer to empty")
    finally:
        sampler.halt.set()
        sampler.join()
        for proc in writers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    wanted = {seed: expected_digests(seed, FILES, FILE_MIB) for seed in range(len(JOBS))}
    for seed, job, n in names:
        want = wanted[seed][n]
        assert digest(pfs / job / f"f{n:02d}") == want, f"{job}/f{n:02d} on the PFS"
        assert digest(mountpoint / job / f"f{n:02d}") == want, f"{job}/f{n:02d} via the mount"
    assert not [p for p in pfs.rglob("*") if "burstctl-part" in p.name], "temporaries left"

    samples = sampler.samples
    peak = max(u for _, u, _ in samples)
    total = len(names) * FILE_MIB * MiB
    t20 = next(t for t, _, p in samples if p >= 0.2 * total)
    t80 = next(t for t, _, p in samples if p >= 0.8 * total)
    p20 = next(p for _, _, p in samples if p >= 0.2 * total)
    p80 = next(p for _, _, p in samples if p >= 0.8 * total)
    drain_rate = (p80 - p20) / (t80 - t20)
    capacity = httpx.get(f"{controller.url}/v1/capacity", timeout=5).json()
    print(
        json.dumps(
            {
                "peak_used_mib": round(peak / MiB, 2),
                "bound_mib": (S + len(JOBS) * BLOCK) / MiB,
                "drain_mib_s": round(drain_rate / MiB, 2),
                "drain_of_granted": round(drain_rate / DRAIN, 4),
                "samples": len(samples),
                "capacity_after": capacity,
            }
        )
    )
    assert peak <= S + len(JOBS) * BLOCK, f"buffer used {peak / MiB:.1f} MiB > S + blocks"
    assert drain_rate == pytest.approx(DRAIN, rel=0.05), f"drain {drain_rate / MiB:.2f} MiB/s"
    assert capacity["size"] == S
