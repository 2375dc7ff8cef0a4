"""Fairness with real tools, the measurement both shims' tests share: two ``fio`` jobs whose
shares should follow their node counts (tests/integration/fuse/test_fio_fairness.py through the
mount, tests/integration/preload/test_acceptance.py under ``burstctl exec``).

Job A has 4 nodes (two fio processes) and job B 1 node (four processes, so that the count of
processes cannot be what earns a share), each with its own Slurm identity in its environment.
Both write their files sequentially in 1 MiB blocks; once both are done, both read them back
(page cache invalidated on open). Each phase is its own fio run: a read section in the same job
file would make fio lay the files out (write them whole) before anything else starts.

Throughput is measured from fio's own per-I/O latency logs (`fio_tools`), only while both jobs
are in the phase: from the later of the two jobs' first I/O plus a settling second to the
earlier of their last. The sizes are in the 4:1 proportion the policy should produce, so both
jobs end a phase at about the same time and the overlap covers most of it.

The ratio the tests hold to the node counts is taken over the seconds of that window in which
the two jobs together kept the buffer busy (≥ ``CONTENDED`` of B): in a second where one job's
fio stalled on its own (a loaded machine), the other may take what it left (opportunity
fairness), which is no measure of the shares. Such seconds may be at most ``UNCONTENDED`` of
the window, so a pacing glitch that leaves B unused still fails the test.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fio_tools import LOGGED, FioProcess, FioRun, MiB, job_file, rate, series, span

CAPACITY = 100 * MiB
PHASE = 8.0  # seconds each phase should take at the target rates
SETTLE = 1.0  # seconds after both jobs start a phase before it is measured
WITHIN = 0.05
# a second is contended when the two jobs moved this much of B in it; at most this share of the
# window's seconds may be uncontended
CONTENDED = 0.95
UNCONTENDED = 0.25
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


def run_phase(
    directory: Path, workdir: Path, rw: str, env: Mapping[str, str] | None = None
) -> dict[str, FioRun]:
    """Both jobs' fio runs of one phase in ``directory/<job>``, started together, with ``env``
    added to each one's Slurm identity; returns when both are done."""
    started: dict[str, FioProcess] = {}
    try:
        for job, (nodes, processes) in JOBS.items():
            started[job] = FioProcess(
                workdir / f"{rw}-{job}",
                fio_job(directory / job, nodes, processes, rw),
                env={**(env or {}), "SLURM_JOB_ID": f"fio-{job}", "SLURM_NNODES": str(nodes)},
            )
        runs = {job: proc.wait(timeout=3 * PHASE + 30) for job, proc in started.items()}
    finally:
        for proc in started.values():
            proc.stop()
    for job, run in runs.items():
        assert not run.errors(), f"fio job {job}, {rw}: {run.errors()}"
    return runs


def measure(
    directory: Path, workdir: Path, env: Mapping[str, str] | None = None
) -> dict[str, dict[str, object]]:
    """Both phases (write, then read) in ``directory``: per phase the overlap window, each
    job's rate in it, their ratio (A/B), the ratio over the contended seconds (module
    docstring) and the aggregate as a fraction of `CAPACITY`."""
    for job in JOBS:
        (directory / job).mkdir()
    summary: dict[str, dict[str, object]] = {}
    for rw in ("write", "read"):
        runs = run_phase(directory, workdir, rw, env)
        spans = {job: span(run.ios) for job, run in runs.items()}
        t0 = min(s for s, _ in spans.values())
        a = max(s for s, _ in spans.values()) + SETTLE
        b = min(e for _, e in spans.values())
        assert b - a >= PHASE / 4, f"{rw}: the jobs overlapped for {b - a + SETTLE:.1f} s only"
        rates = {job: rate(run.ios, a, b) for job, run in runs.items()}
        seconds = {job: series(run.ios, a, b) for job, run in runs.items()}
        busy = [
            i
            for i, pair in enumerate(zip(*seconds.values(), strict=True))
            if sum(pair) >= CONTENDED * CAPACITY
        ]
        assert len(busy) >= (1 - UNCONTENDED) * len(seconds["A"]), (rw, "capacity unused", seconds)
        contended = {job: sum(x[i] for i in busy) for job, x in seconds.items()}
        summary[rw] = {
            "window_s": [round(a - t0, 2), round(b - t0, 2)],
            "job_spans_s": {job: [round(x - t0, 2) for x in s] for job, s in spans.items()},
            "mib_s": {job: round(r / MiB, 2) for job, r in rates.items()},
            "ratio": round(rates["A"] / rates["B"], 4),
            "contended_ratio": round(contended["A"] / contended["B"], 4),
            "contended_seconds": [len(busy), len(seconds["A"])],
            "aggregate_of_B": round(sum(rates.values()) / CAPACITY, 4),
            "per_second_mib_s": {
                job: [round(x / MiB, 1) for x in xs] for job, xs in seconds.items()
            },
        }
    return summary
