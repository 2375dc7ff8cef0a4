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
from mpi_tools import MpiJob, checksums, file_digests
from support import ControllerProcess, booked, wait_until

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
    """Starts `MpiJob`s (``mpi_jobs(workload, args, env, **kwargs)``); one that still runs at
    teardown is killed, ``mpirun`` and ranks (`MpiJob.stop`)."""
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


def check_against_plain(
    workload: str, args: tuple[str, ...], report: Mapping[str, Any], files: Path
) -> None:
    """A run's data were read back as written, with the checksums of the same run on a plain
    directory, and its files (``files``: where they landed) hold the same bytes."""
    plain, plain_files = reference(workload, args)
    assert report["verified"], report
    assert checksums(report) == checksums(plain)
    assert file_digests(files) == plain_files


# Per job: ((least, most) bytes written, (least, most) bytes read).
Bounds = dict[str, tuple[tuple[int, int], tuple[int, int]]]


def bounds(ior: Mapping[str, Any], h5: Mapping[str, Any], read_ahead: int) -> Bounds:
    """What the controller should book to the jobs ``mpi-ior_like`` and ``mpi-h5_checkpoint``
    for the reports of `IOR` and `H5`: the IOR-like writes exactly, its reads plus at most
    ``read_ahead`` (what a shim may read past them); HDF5's data plus its own metadata (less a
    few hundred bytes of each file it leaves unwritten, holes between its blocks; its metadata
    read more than once)."""
    moved = sum(run["write"]["bytes"] for run in ior["runs"])
    files = h5["file_bytes"]
    return {
        "mpi-ior_like": ((moved, moved), (moved, moved + read_ahead)),
        "mpi-h5_checkpoint": (
            (h5["write"]["bytes"], files),
            (h5["read"]["bytes"], files + (1 << 20) + read_ahead),
        ),
    }


def expect_booked(ctl: ControllerProcess, expected: Bounds) -> dict[str, tuple[int, int]]:
    """Waits until the controller has booked each job of ``expected`` at least its least bytes,
    then checks that it booked no more than the most, and nothing to any other job; returns
    what it booked."""

    def all_in() -> bool:
        now = booked(ctl)
        return all(
            job in now and now[job][0] >= w[0] and now[job][1] >= r[0]
            for job, (w, r) in expected.items()
        )

    try:
        wait_until(all_in, timeout=20, interval=0.1, message="every rank's bytes booked")
    except AssertionError:
        raise AssertionError(f"booked {booked(ctl)}, expected {expected}") from None
    now = booked(ctl)
    assert {j for j, (w, r) in now.items() if w or r} == set(expected), now
    for job, (w, r) in expected.items():
        assert w[0] <= now[job][0] <= w[1] and r[0] <= now[job][1] <= r[1], (job, now[job])
    return now
