"""Fairness with real tools: two ``fio`` jobs through one mount, shares ∝ nodes.

A controller at B = 100 MiB/s with ``size-fair`` (ThemisIO: shares ∝ nodes; node bandwidth
1 GiB/s so no cap b_i binds) and one ``burstctl mount`` in front of it. Two fio processes run at
once, each with its own Slurm identity in its environment, which the shim reads from
``/proc/<pid>/environ``: job A with 4 nodes (two processes) and job B with 1 node (four
processes, so that the count of processes cannot be what earns a share). Both write their
files sequentially in 1 MiB blocks; once both are done, both read them back (page cache
invalidated on open). Each phase is its own fio run: a read section in the same job file would
make fio lay the files out (write them whole) before anything else starts.

Throughput is measured from fio's own per-I/O latency logs (`fio_tools`), only while both jobs
are in the phase: from the later of the two jobs' first I/O plus a settling second to the
earlier of their last. The sizes are in the 4:1 proportion the policy should produce, so both
jobs end a phase at about the same time and the overlap covers most of it.

Targets: A : B = 4 : 1 within 5 %, aggregate >= 95 % of B. Run with ``-s`` to
see the measured figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fio_tools import LOGGED, FioProcess, FioRun, MiB, job_file, rate, series, span

pytestmark = pytest.mark.integration

CAPACITY = 100 * MiB
PHASE = 8.0  # seconds each phase should take at the target rates
SETTLE = 1.0  # seconds after both jobs start a phase before it is measured
WITHIN = 0.05
# job id -> (nodes, fio processes); the size per process follows from the target share
JOBS = {"A": (4, 2), "B": (1, 4)}


def fio_job(directory: Path, nodes: int, processes: int, rw: str) -> str:
    share = nodes / sum(n for n, _ in JOBS.values())
    per_process = int(share * CAPACITY * PHASE / processes) // MiB * MiB
    options = {
        "directory": str(directory),
        "filename_format": "part.$jobnum",
        "numjobs": processes,
        "size": per_process,
        "bs": "1M",
        "rw": rw,
        "fallocate": "none",
        "invalidate": 1,  # reads start from an empty page cache, every byte through the shim
    }
    return job_file(LOGGED, [(rw, options)])


def run_phase(mountpoint: Path, workdir: Path, rw: str) -> dict[str, FioRun]:
    """Both jobs' fio runs of one phase, started together; returns when both are done."""
    started: dict[str, FioProcess] = {}
    try:
        for job, (nodes, processes) in JOBS.items():
            started[job] = FioProcess(
                workdir / f"{rw}-{job}",
                fio_job(mountpoint / job, nodes, processes, rw),
                env={"SLURM_JOB_ID": f"fio-{job}", "SLURM_NNODES": str(nodes)},
            )
        runs = {job: proc.wait(timeout=3 * PHASE + 30) for job, proc in started.items()}
    finally:
        for proc in started.values():
            proc.stop()
    for job, run in runs.items():
        assert not run.errors(), f"fio job {job}, {rw}: {run.errors()}"
    return runs


# Pacing sits above the binding, so this 40-second run is done on one library only: libfuse 3,
# what `--libfuse auto` takes as root (the POSIX, integrity and lifecycle tests cover both).
@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
def test_two_fio_jobs_share_the_mount_in_proportion_to_their_nodes(
    controller_factory, fuse_mount, fuse_dirs, tmp_path: Path
) -> None:
    controller = controller_factory(
        "--policy", "size-fair", "--capacity", "100MiB/s", "--node-bandwidth", "1GiB/s"
    )
    backing, mountpoint = fuse_dirs
    fuse_mount(backing, mountpoint, "--controller", controller.address)
    for job in JOBS:
        (mountpoint / job).mkdir()

    summary: dict[str, dict[str, object]] = {}
    for rw in ("write", "read"):
        runs = run_phase(mountpoint, tmp_path, rw)
        spans = {job: span(run.ios) for job, run in runs.items()}
        t0 = min(s for s, _ in spans.values())
        a = max(s for s, _ in spans.values()) + SETTLE
        b = min(e for _, e in spans.values())
        assert b - a >= PHASE / 4, f"{rw}: the jobs overlapped for {b - a + SETTLE:.1f} s only"
        rates = {job: rate(run.ios, a, b) for job, run in runs.items()}
        summary[rw] = {
            "window_s": [round(a - t0, 2), round(b - t0, 2)],
            "job_spans_s": {job: [round(x - t0, 2) for x in s] for job, s in spans.items()},
            "mib_s": {job: round(r / MiB, 2) for job, r in rates.items()},
            "ratio": round(rates["A"] / rates["B"], 4),
            "aggregate_of_B": round(sum(rates.values()) / CAPACITY, 4),
            "per_second_mib_s": {
                job: [round(x / MiB, 1) for x in series(run.ios, a, b)] for job, run in runs.items()
            },
        }
    print(json.dumps(summary))

    for rw, measured in summary.items():
        assert measured["ratio"] == pytest.approx(4.0, rel=WITHIN), (rw, measured)
        assert measured["aggregate_of_B"] >= 0.95, (rw, measured)
