"""Running the MPI workloads of bench/workloads/ and reading what they measured.

Shared by ``bench/mpi_workloads.py`` and the tests (tests/support/mpi.py; they have ``bench``
on their path), so the benchmark and the tests run and measure MPI jobs the same way.

``mpirun`` runs in a session of its own (``start_new_session``): `MpiJob.stop` kills every
process of that session by its pid, so a run that fails leaves neither ``mpirun`` nor a rank
behind. As
root Open MPI needs ``--allow-run-as-root``; with more ranks than cores, ``--oversubscribe``;
the ranks talk over shared memory only (``--mca btl self,vader``). A job's identity reaches
the ranks with ``-x VAR``, as it must on more than one node.

Two jobs' shares come from the workloads' per-call timelines (``--timeline``), measured as
`fio_tools` measures fio's latency logs: a call moved its bytes evenly from its start to its
end, and only the window in which both jobs were writing counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
from fio_tools import Io, MiB, rate, span

WORKLOADS = Path(__file__).resolve().parent / "workloads"
MPIRUN = ("mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader")
# The variables that name a job (and its nodes) for burstctl: passed on to every rank.
IDENTITY = ("BURSTCTL_JOB_ID", "SLURM_NNODES")
# What `burstctl exec` adds, passed on to every rank (on one node they would inherit it anyway).
PRELOAD = ("LD_PRELOAD", "BURSTCTL_AGENT_SOCKET", "BURSTCTL_PRELOAD_PATHS")


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
        """Kills ``mpirun`` and its ranks, each by its pid: every process of the session
        ``mpirun`` leads (Open MPI puts each rank in a process group of its own, but in that
        session; while ``mpirun`` is not yet reaped, its session id is no one else's)."""
        if self.proc.returncode is None:
            for pid in psutil.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if os.getsid(pid) == self.proc.pid:
                        os.kill(pid, signal.SIGKILL)
            self.proc.communicate(timeout=30)


def under_exec(socket: Path, job: str) -> dict[str, Any]:
    """`MpiJob`'s ``launcher`` and ``passed`` for ``burstctl exec --agent SOCKET --job JOB --
    mpirun -x ...``: the job's identity and what ``exec`` sets, passed on to every rank."""
    return {
        "launcher": (
            *(sys.executable, "-m", "burstctl", "exec"),
            *("--agent", str(socket), "--job", job, "--"),
        ),
        "passed": (*IDENTITY, *PRELOAD),
    }


def file_digests(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under ``directory``, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def checksums(report: Mapping[str, Any]) -> list[str]:
    """The checksums a workload's report gives, one per run (the checkpoint has one run)."""
    return [r["checksum"] for r in report.get("runs", [report])]


def timeline(report: Mapping[str, Any], ddir: str = "write") -> list[Io]:
    """The calls of a report made with ``--timeline``, as the I/Os `fio_tools` measures."""
    return [Io(s, e, n, d) for s, e, n, d in report["timeline"] if d == ddir]


def shares(reports: Mapping[str, Mapping[str, Any]], settle: float = 1.0) -> dict[str, Any]:
    """Each job's rate while all of them were writing: from the latest first call plus
    ``settle`` to the earliest last one."""
    ios = {job: timeline(report) for job, report in reports.items()}
    spans = {job: span(calls) for job, calls in ios.items()}
    a = max(s for s, _ in spans.values()) + settle
    b = min(e for _, e in spans.values())
    assert b - a >= 1.0, f"the jobs overlapped for {b - a + settle:.1f} s only: {spans}"
    return {"window_s": round(b - a, 2), "rates": {j: rate(c, a, b) for j, c in ios.items()}}


# Two jobs writing at once, of 3 and 1 nodes (size-fair's shares: 3 : 1). Each writes its share
# of B for ``phase`` seconds, one shared file in blocks of 1 MiB (rank-strided, independent
# calls of 256 KiB), so both end at about the same time and overlap for most of the phase.
PAIR_NODES = {"A": 3, "B": 1}


def measure_pair(
    start: Callable[[str, int, list[str]], MpiJob],
    capacity: float,
    phase: float = 5.0,
    ranks: int = 4,
) -> dict[str, Any]:
    """Starts both jobs (``start(job, nodes, workload args) -> MpiJob``) and waits for them;
    their rates while both wrote, the ratio A : B and the sum as a fraction of ``capacity``."""
    started = {}
    for job, nodes in PAIR_NODES.items():
        share = nodes / sum(PAIR_NODES.values())
        segments = max(1, round(share * capacity * phase / ranks / MiB))
        args = ["--layouts", "n1", "--apis", "independent", "--no-read", "--timeline"]
        started[job] = start(job, nodes, [*args, "--segments", str(segments)])
    reports = {job: proc.wait(timeout=10 * phase + 60) for job, proc in started.items()}
    measured = shares(reports)
    rates = measured["rates"]
    return {
        "window_s": measured["window_s"],
        "mib_s": {job: round(r / MiB, 2) for job, r in rates.items()},
        "ratio": round(rates["A"] / rates["B"], 4),
        "aggregate_of_B": round(sum(rates.values()) / capacity, 4),
    }
