"""MPI jobs in tests: ``mpirun`` of the workloads of bench/workloads/ (the IOR-like MPI-IO run
and the HDF5 checkpoint), the same runs on a plain directory without burstctl to compare with,
and the shares two paced jobs got from their per-call timelines.

``mpirun`` runs in a process group of its own (``start_new_session``): `MpiJob.stop` kills
that group by its pid, so a test that fails leaves neither ``mpirun`` nor a rank behind. As
root (CI, this machine) Open MPI needs ``--allow-run-as-root``; with more ranks than cores,
``--oversubscribe``; the ranks talk over shared memory only (``--mca btl self,vader``). The
job's identity reaches the ranks with ``-x VAR``, as it must on more than one node.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from fio_tools import Io, rate, span

WORKLOADS = Path(__file__).resolve().parents[2] / "bench" / "workloads"
MPIRUN = ("mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader")
# The variables that name a job (and its nodes) for burstctl: passed on to every rank.
IDENTITY = ("BURSTCTL_JOB_ID", "SLURM_NNODES")
# What `burstctl exec` adds, passed on to every rank (on one node they would inherit it anyway).
PRELOAD = ("LD_PRELOAD", "BURSTCTL_AGENT_SOCKET", "BURSTCTL_PRELOAD_PATHS")

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


class MpiJob:
    """``[LAUNCHER...] mpirun [OPTIONS...] -np RANKS [-x VAR...] python
    bench/workloads/WORKLOAD.py ARGS`` with ``env``; ``passed``: the VARs."""

    def __init__(
        self,
        workload: str,
        args: Sequence[str],
        env: Mapping[str, str],
        ranks: int = 4,
        launcher: Sequence[str] = (),
        options: Sequence[str] = (),
        passed: Sequence[str] = (),
    ) -> None:
        self.command = [
            *launcher,
            *MPIRUN,
            *options,
            *("-np", str(ranks)),
            *(arg for var in passed for arg in ("-x", var)),
            sys.executable,
            str(WORKLOADS / f"{workload}.py"),
            *args,
        ]
        self.proc = subprocess.Popen(
            self.command,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.stderr = ""

    def wait(self, timeout: float = 120.0) -> dict[str, Any]:
        """The workload's JSON, once ``mpirun`` exited 0 (else fails with its output)."""
        try:
            out, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.command} ran past {timeout} s") from None
        assert self.proc.returncode == 0, (self.command, out, self.stderr)
        report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return report

    def stop(self) -> None:
        """Kills the job's process group by its pid (while ``mpirun`` is not yet reaped, the
        group's id cannot be anyone else's)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate(timeout=30)


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


def file_digests(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under ``directory``, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def checksums(report: Mapping[str, Any]) -> list[str]:
    """The checksums a workload's report gives, one per run (the checkpoint has one run)."""
    return [r["checksum"] for r in report.get("runs", [report])]


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


def timeline(report: Mapping[str, Any], ddir: str = "write") -> list[Io]:
    """The calls of a report made with ``--timeline``, as the I/Os `fio_tools` measures."""
    return [Io(s, e, n, d) for s, e, n, d in report["timeline"] if d == ddir]


def shares(reports: Mapping[str, Mapping[str, Any]], settle: float = 1.0) -> dict[str, Any]:
    """Each job's rate while all of them were writing: from the latest first call plus
    ``settle`` to the earliest last one (`fio_tools.rate`, calls straddling an edge counted by
    their part inside)."""
    ios = {job: timeline(report) for job, report in reports.items()}
    spans = {job: span(calls) for job, calls in ios.items()}
    a = max(s for s, _ in spans.values()) + settle
    b = min(e for _, e in spans.values())
    assert b - a >= 1.0, f"the jobs overlapped for {b - a + settle:.1f} s only: {spans}"
    return {"window_s": round(b - a, 2), "rates": {j: rate(c, a, b) for j, c in ios.items()}}
