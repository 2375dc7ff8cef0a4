"""MPI-IO and HDF5 through a real mount: ``mpirun -np 4`` of the IOR-like workload (N-1 and N-N,
collective, independent and nonblocking MPI-IO, Open MPI's default OMPIO) and of the per-rank
h5py checkpoint (bench/workloads/, tests/support/mpi.py) on ``burstctl mount`` at a real
controller.

- Each run's data, read back and checked by the workload itself, has the same checksums and
  its files the same bytes as the same run on a plain directory without burstctl; the
  controller books all four ranks' bytes to the run's one job (``BURSTCTL_JOB_ID``, passed to
  the ranks with ``mpirun -x``) and to no other.
- The pair of `mpi_tools.measure_pair` (3 and 1 nodes, writing at once) through the mount at a
  controller with ``size-fair`` and B = 40 MiB/s gets 3 : 1 of it within 7 %, and 90 % of B
  or more in all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from mpi_tools import MpiJob, checksums, measure_pair
from support import ControllerProcess, MountProcess, clean_env
from support.mpi import (  # noqa: F401 (mpi_jobs: a fixture)
    H5,
    IOR,
    bounds,
    expect_booked,
    mpi_jobs,
    run_against_plain,
)

pytestmark = pytest.mark.integration

MiB = 1 << 20
# The mount sees every request of the ranks: OMPIO's nonblocking calls too, which glibc's POSIX
# AIO threads make (the LD_PRELOAD library paces them at submission: docs/preload.md, "POSIX AIO").
IOR_ALL = (IOR[0], (*IOR[1], "--apis", "collective,independent,nonblocking"))


# MPI-IO through the mount is plain file I/O to the kernel; the binding under it is tested on
# both libraries elsewhere, so this runs on libfuse 3 only (what `--libfuse auto` takes as root).
@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
def test_ior_like_and_hdf5_checkpoint_through_the_mount(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    mpi_jobs: Callable[..., MpiJob],  # noqa: F811
) -> None:
    ctl = controller_factory(
        "--policy", "fair-share", "--capacity", "1GiB/s", "--node-bandwidth", "1GiB/s"
    )
    backing, mountpoint = fuse_dirs
    fuse_mount(backing, mountpoint, "--controller", ctl.address)

    def start(workload: str, args: tuple[str, ...]) -> tuple[MpiJob, Path]:
        (mountpoint / workload).mkdir()
        job = {"BURSTCTL_JOB_ID": f"mpi-{workload}", "SLURM_NNODES": "1"}
        env = {**clean_env(("BURSTCTL_", "SLURM_")), **job}
        where = [str(mountpoint / workload), *args]
        return mpi_jobs(workload, where, env, passed=job), backing / workload

    reports = {w: report for w, (report, _) in run_against_plain((IOR_ALL, H5), start).items()}
    # files opened for writing go direct: the IOR-like writes exactly; reads of read-only
    # files through the page cache, at most the kernel's read-ahead past them
    now = expect_booked(ctl, bounds(reports["ior_like"], reports["h5_checkpoint"], 16 * MiB))
    print(json.dumps({"booked": now, "checksums": {w: checksums(r) for w, r in reports.items()}}))


@pytest.mark.serial  # shares measured over a window: alone, not beside other tests
@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
def test_two_mpi_jobs_through_the_mount_share_in_proportion_to_their_nodes(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    mpi_jobs: Callable[..., MpiJob],  # noqa: F811
) -> None:
    capacity = 40 * MiB
    ctl = controller_factory(
        "--policy", "size-fair", "--capacity", "40MiB/s", "--node-bandwidth", "1GiB/s"
    )
    backing, mountpoint = fuse_dirs
    fuse_mount(backing, mountpoint, "--controller", ctl.address)

    def start(job: str, nodes: int, args: list[str]) -> MpiJob:
        (mountpoint / job).mkdir()
        identity = {"BURSTCTL_JOB_ID": job, "SLURM_NNODES": str(nodes)}
        env = {**clean_env(("BURSTCTL_", "SLURM_")), **identity}
        return mpi_jobs("ior_like", [str(mountpoint / job), *args], env, passed=identity)

    summary = measure_pair(start, capacity)
    print(json.dumps(summary))
    assert summary["ratio"] == pytest.approx(3.0, rel=0.07), summary
    assert summary["aggregate_of_B"] >= 0.90, summary
