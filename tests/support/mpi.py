"""MPI jobs in tests: a fixture that starts the workloads of bench/workloads/ (the IOR-like
MPI-IO run and the HDF5 checkpoint) with `mpi_tools.MpiJob` and kills what is left of them at
teardown, the tests' sizes, and the same runs on a plain directory without burstctl to compare
with."""

from __future__ import annotations

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


# A workload and its arguments.
Spec = tuple[str, tuple[str, ...]]
# The runs of each spec on a plain directory without burstctl: (report, its files' digests).
_PLAIN: dict[Spec, tuple[dict[str, Any], dict[str, str]]] = {}


def run_against_plain(
    specs: Sequence[Spec], start: Callable[[str, tuple[str, ...]], tuple[MpiJob, Path]]
) -> dict[str, tuple[dict[str, Any], MpiJob]]:
    """Runs every spec through a shim (``start(workload, args) -> (job, where its files
    land)``), all at once, and the first time a spec is seen the same on a plain directory,
    beside them; then checks that each run read its data back as written, with the plain run's
    checksums, and that its files hold the plain run's bytes. Returns each workload's report
    and job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURSTCTL_", "SLURM_"))}
    plain: dict[Spec, tuple[MpiJob, str]] = {}
    done: dict[str, tuple[dict[str, Any], MpiJob]] = {}
    try:
        for workload, args in specs:
            if (workload, args) not in _PLAIN:
                directory = tempfile.mkdtemp(prefix="burstctl-mpi-plain-")
                plain[workload, args] = (MpiJob(workload, [directory, *args], env), directory)
        shimmed = {spec: start(*spec) for spec in specs}
        for (workload, _), (job, _) in shimmed.items():
            done[workload] = (job.wait(), job)
        for spec, (job, directory) in plain.items():
            _PLAIN[spec] = (job.wait(), file_digests(Path(directory)))
    finally:
        for job, directory in plain.values():
            job.stop()
            shutil.rmtree(directory, ignore_errors=True)
    for workload, args in specs:
        report = done[workload][0]
        plain_report, plain_files = _PLAIN[workload, args]
        assert report["verified"], report
        assert checksums(report) == checksums(plain_report)
        assert file_digests(shimmed[workload, args][1]) == plain_files
    return done


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
