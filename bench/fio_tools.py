"""Running ``fio`` and reading what it measured: job files, JSON results, per-I/O latency logs.

Shared by ``bench/fuse_throughput.py`` and the FUSE integration tests (which have ``bench`` on
their path), so the benchmark and the tests measure throughput the same way.

Throughput over a window comes from fio's per-I/O latency log (``write_lat_log``, with
``log_unix_epoch=1`` so that the logs of separate fio processes share one clock). Each line is
one completed I/O: its completion time (ms since the epoch), its latency (ns), its direction
and size. An I/O is taken to have moved its bytes evenly between issue (completion − latency)
and completion, so the bytes a run moved inside a window ``[a, b]`` count a straddling 1 MiB
I/O by the fraction inside the window. Counting whole I/Os by completion time instead would be
off by up to one block per process at each edge (4 % of a 5 s window at 20 MiB/s with four
processes).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Variables that name a job: never inherited by fio from whoever runs the tests or benchmark.
IDENTITY_PREFIXES = ("BURSTCTL_", "SLURM_")


def clean_env() -> dict[str, str]:
    """This process's environment without a job identity (``IDENTITY_PREFIXES``): the
    caller's own must not leak into a workload's attribution."""
    return {k: v for k, v in os.environ.items() if not k.startswith(IDENTITY_PREFIXES)}


MiB = 1 << 20
GiB = 1 << 30

LAT_LOG = "io"  # prefix of the latency logs that `LOGGED` asks for

# Global options of a run whose throughput is read from its logs: synchronous I/O through the
# page cache, one log line per I/O (fio's own job index in the file name), on the epoch clock.
LOGGED = {
    "ioengine": "psync",
    "direct": 0,
    "write_lat_log": LAT_LOG,
    "log_unix_epoch": 1,
    "per_job_logs": 1,
}


def job_file(
    global_options: Mapping[str, object], jobs: Sequence[tuple[str, Mapping[str, object]]]
) -> str:
    """The text of a fio job file: a ``[global]`` section, then one section per job, in order.

    A value of ``True`` writes the bare option (``stonewall``); ``None`` or ``False`` leaves it
    out.
    """
    lines: list[str] = []
    for name, options in [("global", global_options), *jobs]:
        lines.append(f"[{name}]")
        for key, value in options.items():
            if value is None or value is False:
                continue
            lines.append(key if value is True else f"{key}={value}")
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True)
class Io:
    """One completed I/O from a latency log; times in seconds since the epoch."""

    start: float
    end: float
    nbytes: int
    ddir: str  # "read" | "write" | "trim"


_DDIR = {"0": "read", "1": "write", "2": "trim"}


def parse_lat_log(path: Path | str) -> list[Io]:
    """The I/Os of one fio ``*_lat.N.log`` written with ``log_unix_epoch=1``."""
    ios = []
    with open(path, encoding="ascii") as f:
        for line in f:
            fields = [x.strip() for x in line.split(",")]
            if len(fields) < 4:
                continue
            end = int(fields[0]) / 1000.0
            latency = int(fields[1]) / 1e9
            ios.append(Io(end - latency, end, int(fields[3]), _DDIR.get(fields[2], fields[2])))
    return ios


def bytes_in(ios: Iterable[Io], a: float, b: float) -> float:
    """Bytes moved inside ``[a, b]``; an I/O straddling an edge counts by the part inside."""
    total = 0.0
    for io in ios:
        if io.end <= a or io.start >= b:
            continue
        if io.end <= io.start:  # finished within the log's millisecond: a point in time
            total += io.nbytes
            continue
        inside = min(io.end, b) - max(io.start, a)
        total += io.nbytes * inside / (io.end - io.start)
    return total


def rate(ios: Iterable[Io], a: float, b: float) -> float:
    """Bytes/s over ``[a, b]``."""
    return bytes_in(ios, a, b) / (b - a)


def span(ios: Iterable[Io]) -> tuple[float, float]:
    """(first issue, last completion) of ``ios``; they must not be empty."""
    ios = list(ios)
    return min(io.start for io in ios), max(io.end for io in ios)


def series(ios: Iterable[Io], a: float, b: float, step: float = 1.0) -> list[float]:
    """Bytes/s in consecutive ``step``-second bins from ``a`` to ``b`` (for reports and plots)."""
    ios = list(ios)
    out = []
    t = a
    while t + step <= b + 1e-9:
        out.append(rate(ios, t, t + step))
        t += step
    return out


@dataclass
class FioRun:
    """One finished fio process: its JSON report, the I/Os of its latency logs, its CPU time."""

    workdir: Path
    returncode: int
    report: dict[str, object]
    ios: list[Io]
    cpu_seconds: float  # user + system of fio and every process it forked, from rusage
    stderr: str
    log_ios: dict[int, list[Io]] = field(default_factory=dict)  # per fio job (clone) index

    @property
    def jobs(self) -> list[dict[str, object]]:
        return list(self.report.get("jobs", []))  # type: ignore[arg-type]

    def errors(self) -> list[str]:
        """What went wrong: fio's exit code, each job's ``error``, anything on stderr."""
        problems = []
        if self.returncode != 0:
            problems.append(f"fio exited with {self.returncode}")
        for job in self.jobs:
            if job.get("error"):
                problems.append(f"job {job.get('jobname')}: error {job.get('error')}")
        if self.stderr.strip():
            problems.append(self.stderr.strip())
        return problems

    def moved(self, ddir: str) -> int:
        """Bytes fio reports for a direction ("read" or "write"), all jobs together."""
        return sum(int(job[ddir]["io_bytes"]) for job in self.jobs)  # type: ignore[index]

    def iops(self, ddir: str) -> float:
        return sum(float(job[ddir]["iops"]) for job in self.jobs)  # type: ignore[index]

    def job_cpu_seconds(self) -> float:
        """CPU seconds fio's job processes report for their I/O (``usr_cpu`` + ``sys_cpu`` over
        each job's runtime): unlike `cpu_seconds`, without fio's start-up and reporting."""
        return sum(
            (float(job["usr_cpu"]) + float(job["sys_cpu"])) / 100 * float(job["job_runtime"]) / 1000
            for job in self.jobs
        )

    def bandwidth(self, ddir: str) -> float:
        """Bytes/s fio reports for a direction, summed over jobs (each over its own runtime)."""
        return sum(float(job[ddir]["bw_bytes"]) for job in self.jobs)  # type: ignore[index]


class FioProcess:
    """``fio --output-format=json JOBFILE`` started in ``workdir``, with its own environment.

    The job file is written as ``<workdir>/<name>.fio``; the latency logs land in ``workdir``,
    which must hold no other run's logs. fio's environment is this one less any variable that
    names a job (``BURSTCTL_*``, ``SLURM_*``), plus ``env``.
    ``wait()`` returns the `FioRun`. The CPU time counted is this process's children's rusage
    before and after the wait, so start one `FioProcess` at a time when CPU time matters.
    """

    def __init__(
        self,
        workdir: Path,
        text: str,
        env: Mapping[str, str] | None = None,
        name: str = "job",
    ) -> None:
        base = clean_env()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.jobfile = self.workdir / f"{name}.fio"
        self.jobfile.write_text(text)
        self.output = self.workdir / f"{name}.json"
        self._usage = _children_cpu()
        self.proc = subprocess.Popen(
            ["fio", "--output-format=json", f"--output={self.output}", str(self.jobfile)],
            cwd=self.workdir,
            env={**base, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float | None = None) -> FioRun:
        try:
            _, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        cpu = _children_cpu() - self._usage
        report = _load_report(self.output)
        log_ios = {
            int(p.name.split(".")[-2]): parse_lat_log(p)
            for p in self.workdir.glob(f"{LAT_LOG}_lat.*.log")
        }
        ios = sorted((io for part in log_ios.values() for io in part), key=lambda io: io.end)
        return FioRun(self.workdir, self.proc.returncode, report, ios, cpu, stderr, log_ios)

    def stop(self) -> None:
        """Ends fio (by pid) if it still runs; for cleanup after a failure."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def run_fio(
    workdir: Path,
    text: str,
    env: Mapping[str, str] | None = None,
    name: str = "job",
    timeout: float | None = None,
) -> FioRun:
    """Runs fio on a job file's text to the end; see `FioProcess`."""
    return FioProcess(workdir, text, env, name).wait(timeout)


def _load_report(path: Path) -> dict[str, object]:
    """fio's JSON report; fio may print warnings (e.g. about verify and ``numjobs``) first."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    start = text.find("\n{")
    start = 0 if text.startswith("{") else start + 1 if start >= 0 else -1
    if start < 0:
        return {}
    try:
        return dict(json.loads(text[start:]))
    except ValueError:
        return {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
