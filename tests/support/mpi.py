"""MPI jobs in tests: a fixture that starts the workloads of bench/workloads/ (the IOR-like
MPI-IO run and the HDF5 checkpoint) with `mpi_tools.MpiJob` and kills what is left of them at
teardown, the tests' sizes, and the same runs on a plain directory without burstctl to compare
with."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from mpi_tools import MpiJob, file_digests

# The two workloads at the tests' size: 4 ranks x 4 MiB for each of the IOR-like runs (N-1 and
# N-N, collective and independent), 2 MiB of state per rank for the checkpoint.
IOR = ("ior_like", ("--block", "1MiB", "--transfer", "256KiB", "--segments", "4"))
H5 = ("h5_checkpoint", ("--size", "2MiB"))


def require_mpi() -> None:
    """Skips (fails on CI, where deploy/system-deps.sh installs Open MPI and the ``test`` extra
    mpi4py and h5py) when ``mpirun``, mpi4py or h5py is missing."""
    missing = [m for m in ("mpi4py", "h5py") if importlib.util.find_spec(m) is None]
    if shutil.which("mpirun") is None:
        missing.append("mpirun (openmpi-bin)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"missing on CI: {', '.join(missing)}")
        pytest.skip(f"not installed here: {', '.join(missing)}")


@pytest.fixture
def mpi_jobs() -> Iterator[Callable[..., MpiJob]]:
    """Starts `MpiJob`s (``mpi_jobs(workload, args, env, **kwargs)``); each one's process
    group is killed at teardown if it still runs."""
    require_mpi()
    started: list[MpiJob] = []

    def start(workload: str, args: Sequence[str], env: Mapping[str, str], **kw: Any) -> MpiJob:
        job = MpiJob(workload, args, env, **kw)
        started.append(job)
        return job

    yield start
    for job in started:
        job.stop()


@functools.cache
def reference(workload: str, args: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """The same run on a plain directory without burstctl: (its report, its files' digests)."""
    require_mpi()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURSTCTL_", "SLURM_"))}
    with tempfile.TemporaryDirectory(prefix="burstctl-mpi-plain-") as plain:
        job = MpiJob(workload, [plain, *args], env)
        try:
            report = job.wait()
        finally:
            job.stop()
        return report, file_digests(Path(plain))
