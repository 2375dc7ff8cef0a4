"""From Darshan logs to the simulator's applications: the replay's one mapping.

Owns the mapping that ``burstctl sim replay`` and the live replay both run
(docs/simulator.md, "Darshan replay"): each log is one job, its ranks its nodes p_i. A
job's transfers (``darshan.py``) are spread evenly over their intervals into ``bins``
time bins of the log's run time (bytes read and written alike); a bin that moved V bytes
is an I/O phase of V at the job's cap b_i = min(p_i·b, B) from the bin's start, and the
time until the next bin with bytes is a work phase, so the job's dedicated run keeps the
log's timeline wherever b_i is at least the bin's rate. Consecutive I/O bins merge into one
phase. The jobs start together at t = 0 (job k after ``k × stagger`` seconds of work) and
every job's phases are padded with work to the longest job's dedicated span, which is T:
the window keeps every phase of every job (``instance.prepare_window`` with window 1).

The defaults of B and b come from the logs: B is the highest bin rate any job reached, b
the highest bin rate per rank, so every job's cap covers its own peak bin and its dedicated
run is the log's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from burstctl.simulator.bws.instance import (
    IO_FIRST,
    WORK_FIRST,
    Application,
    Window,
    prepare_window,
)
from burstctl.simulator.replay.darshan import DarshanLog

DEFAULT_BINS = 100
# A gap shorter than this share of a job's span joins the I/O bins on either side.
_JOIN = 1e-9


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One log as a job: what the table shows of it and the bins its phases come from."""

    name: str  # the log's name, "#k" added when a log is given more than once
    path: str
    ranks: int  # p_i
    span: float  # the log's run time, s
    offset: float  # s of work before its own t = 0 (``stagger``)
    width: float  # a bin's length, s
    volumes: tuple[float, ...]  # bytes moved in each bin
    transfers: int
    dxt: bool

    @property
    def nbytes(self) -> float:
        return math.fsum(self.volumes)

    @property
    def peak(self) -> float:
        """The highest rate of one of its bins, bytes/s."""
        return max(self.volumes, default=0.0) / self.width


@dataclass(frozen=True, slots=True)
class Replay:
    """The jobs of a replay, the system they share and the window the simulator runs."""

    jobs: tuple[ReplayJob, ...]
    bandwidth: float  # B, bytes/s
    node_bandwidth: float  # b, bytes/s per rank
    apps: tuple[Application, ...]  # volumes in bytes, caps in bytes/s
    window: Window  # normalised to B = 1

    def io_phases(self, i: int) -> int:
        return sum(1 for p in self.window.apps[i].phases if p.io)


def bin_volumes(log: DarshanLog, bins: int) -> tuple[float, tuple[float, ...]]:
    """(bin width, bytes per bin) of ``log``: each transfer's bytes spread evenly over its
    interval, one at an instant all in the bin of that instant."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    span = log.run_time if log.run_time > 0.0 else 1.0
    width = span / bins
    volumes = [0.0] * bins
    for t in log.transfers:
        first = min(int(t.start / width), bins - 1)
        last = min(int(t.end / width), bins - 1)
        if first == last:
            volumes[first] += t.nbytes
            continue
        rate = t.nbytes / (t.end - t.start)
        for k in range(first, last + 1):
            lo = max(t.start, k * width)
            hi = t.end if k == last else min(t.end, (k + 1) * width)
            volumes[k] += rate * (hi - lo)
    return width, tuple(volumes)


def replay_jobs(
    logs: Sequence[DarshanLog],
    *,
    bins: int = DEFAULT_BINS,
    bandwidth: float | None = None,
    node_bandwidth: float | None = None,
    stagger: float = 0.0,
) -> Replay:
    """The replay of ``logs`` as concurrent jobs. ``bandwidth`` (B) and ``node_bandwidth``
    (b) in bytes/s; None: from the logs (the module's docstring)."""
    if not logs:
        raise ValueError("no logs to replay")
    if not (math.isfinite(stagger) and stagger >= 0.0):
        raise ValueError(f"stagger must be >= 0, got {stagger}")
    seen: dict[str, int] = {}
    jobs = []
    for k, log in enumerate(logs):
        seen[log.name] = seen.get(log.name, 0) + 1
        width, volumes = bin_volumes(log, bins)
        jobs.append(
            ReplayJob(
                name=log.name if seen[log.name] == 1 else f"{log.name}#{seen[log.name]}",
                path=log.path,
                ranks=log.nprocs,
                span=width * bins,
                offset=k * stagger,
                width=width,
                volumes=volumes,
                transfers=len(log.transfers),
                dxt=log.dxt,
            )
        )
    peak = max(j.peak for j in jobs)
    B = bandwidth if bandwidth is not None else (peak if peak > 0.0 else 1.0)
    per_rank = max(j.peak / j.ranks for j in jobs)
    b = node_bandwidth if node_bandwidth is not None else (per_rank if per_rank > 0.0 else B)
    for name, value in (("bandwidth", B), ("node bandwidth", b)):
        if not (math.isfinite(value) and value > 0.0):
            raise ValueError(f"the {name} must be > 0, got {value}")
    drafts = [_phases(job, min(job.ranks * b, B)) for job in jobs]
    longest = max(span for _, span in drafts)
    apps = []
    for job, (values, span) in zip(jobs, drafts, strict=True):
        _append(values, False, longest - span)
        apps.append(
            Application(
                name=job.name.replace(" ", "_"),
                bandwidth=min(job.ranks * b, B),
                age=0.0,
                progress=0.0,
                age_phase=0.0,
                w_iter=0.0,
                initial_type=IO_FIRST if values[0][0] else WORK_FIRST,
                values=tuple(v for _, v in values),
            )
        )
    return Replay(
        jobs=tuple(jobs),
        bandwidth=B,
        node_bandwidth=b,
        apps=tuple(apps),
        window=prepare_window(apps, 1.0, B),
    )


def _phases(job: ReplayJob, cap: float) -> tuple[list[tuple[bool, float]], float]:
    """A job's phases as (is I/O, bytes or seconds), alternating, and its dedicated span."""
    values: list[tuple[bool, float]] = []
    cursor = 0.0  # the end of the dedicated run so far (the offset is work too)
    join = _JOIN * (job.offset + job.span)
    for k, volume in enumerate(job.volumes):
        if volume <= 0.0:
            continue
        start = job.offset + k * job.width
        if start - cursor > join:
            _append(values, False, start - cursor)
            cursor = start
        _append(values, True, volume)
        cursor += volume / cap
    end = job.offset + job.span
    if end - cursor > join or not values:
        _append(values, False, end - cursor)
        cursor = max(cursor, end)
    return values, cursor


def _append(values: list[tuple[bool, float]], io: bool, value: float) -> None:
    """Adds a phase, merged into the last one if that is of the same kind."""
    if value <= 0.0:
        return
    if values and values[-1][0] == io:
        values[-1] = (io, values[-1][1] + value)
    else:
        values.append((io, value))
