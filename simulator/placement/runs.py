"""The [DIST-IO] simulator: allocation and placement of applications over N I/O resources.

Owns ``burstctl sim placement`` and ``sim placement-sweep``; the model, the metrics and the
choices the paper leaves open are in docs/simulator.md, "[DIST-IO] placement". The
allocators, placements, metrics and profiles are those of ``burstctl.policies.placement``;
this module only generates sets (``placement_workloads``), runs them and measures.

The run is an exact fluid simulation, event to event. Application j alternates a compute
subphase (T_cpu/p_j) and an I/O subphase (V_io/p_j) made of n_j independent transfers of
V_io/(p_j·n_j), one on each of its n_j distinct resources, each at b_j(n_j)/n_j when
alone; the subphase ends when the last of its transfers ends ([DIST-IO] §III, Fig. 4).
A resource on which k applications have an unfinished transfer gives each of them 1/k of
its time, so each transfer moves at b_j(n_j)/(n_j·k). Between two events (a compute
subphase or a transfer ends) every rate is constant, so the loop jumps from event to
event. This is the limit of the paper's time-based simulator ([DIST-IO] §V-B: colliding
applications alternate one time unit each), where over many units each of k colliders
holds the resource 1/k of the time; the fluid form has no unit rounding and is far
faster.

Measurement window ([DIST-IO] §V-D asks for an interval where no application finishes
and every one completes at least one phase). Every application repeats its phase
sequence from the start when it is done, so none leaves, and the window is [0, t_end]
where t_end is the first moment every application has run all its p_j phases at least
once. Inside it: T_j the time application j spent in I/O subphases, V_j the volume it
moved, O_r the fraction of time resource r had at least one transfer.
"""

from __future__ import annotations

import csv
import heapq
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from burstctl.common.limits import ALLOCATOR_NAMES, PLACEMENT_NAMES
from burstctl.policies.placement import metrics
from burstctl.policies.placement.allocators import allocate
from burstctl.policies.placement.model import App, Profile, io_load, n_sys
from burstctl.policies.placement.placements import place
from burstctl.simulator.campaign import Cluster, Format, RowFile, run_campaign
from burstctl.simulator.placement.curves import class_profile, drawer
from burstctl.simulator.placement.workloads import N_RESOURCES, Q_CPU, generate

_REL = 1e-9  # a transfer with less than this fraction of its volume left is over


@dataclass(frozen=True, slots=True)
class SimApp:
    """One application as ``simulate`` runs it."""

    phases: int  # p_j ≥ 1
    t_cpu: float  # T_cpu^j, all phases, s
    v_io: float  # V_io^j, all phases
    bandwidth: float  # b_j(n_j), the aggregate rate alone on its n_j resources
    resources: tuple[int, ...]  # S_j, distinct


@dataclass(frozen=True, slots=True)
class Measured:
    """What ``simulate`` measured over the window [0, t]."""

    t: float
    io_time: tuple[float, ...]  # T_j
    volume: tuple[float, ...]  # V_j
    busy: tuple[float, ...]  # O_r, fraction of t
    phases_done: tuple[int, ...]  # I/O subphases completed per application
    events: int


# audit(dt, resource → total share handed out during dt) after every step, for tests
Audit = Callable[[float, dict[int, float]], None]


def simulate(apps: Sequence[SimApp], n_resources: int, audit: Audit | None = None) -> Measured:
    """Runs the applications until each has done all its phases once (module docstring).

    Processor sharing per resource, with virtual clocks: measured in "seconds alone"
    (volume / (b_j(n_j)/n_j)), every transfer on resource r progresses at 1/k_r, so r
    keeps a clock V_r advancing at 1/k_r and each transfer a finish tag V_r(start) +
    its work; the next end on r is its smallest tag. An event costs O(N + log), not
    O(transfers).
    """
    k = len(apps)
    for j, a in enumerate(apps):
        if a.phases < 1 or a.t_cpu < 0 or a.v_io <= 0 or a.bandwidth <= 0:
            raise ValueError(f"application {j}: bad phases, T_cpu, V_io or bandwidth")
        if not a.resources or len(set(a.resources)) != len(a.resources):
            raise ValueError(f"application {j}: resources must be distinct and non-empty")
        if min(a.resources) < 0 or max(a.resources) >= n_resources:
            raise ValueError(f"application {j}: resource outside 0..{n_resources - 1}")
    cpu_len = [a.t_cpu / a.phases for a in apps]
    piece = [a.v_io / (a.phases * len(a.resources)) for a in apps]  # one transfer
    speed = [a.bandwidth / len(a.resources) for a in apps]  # one transfer, alone
    work = [piece[j] / speed[j] for j in range(k)]  # one transfer, seconds alone
    now = 0.0
    clock = [0.0] * n_resources  # V_r
    tags: list[list[tuple[float, int]]] = [[] for _ in range(n_resources)]  # (tag, j)
    cpu: list[tuple[float, int]] = []  # (end, j)
    left = [0] * k  # unfinished transfers of the current I/O subphase
    io_start: list[float | None] = [None] * k
    done = [0] * k
    io_time = [0.0] * k
    volume = [0.0] * k
    busy = [0.0] * n_resources
    pending = k  # applications yet to complete all their phases once
    events = 0

    def start_io(j: int) -> None:
        io_start[j] = now
        left[j] = len(apps[j].resources)
        for r in apps[j].resources:
            heapq.heappush(tags[r], (clock[r] + work[j], j))

    def end_io(j: int) -> None:
        nonlocal pending
        start = io_start[j]
        assert start is not None
        io_time[j] += now - start
        io_start[j] = None
        done[j] += 1
        if done[j] == apps[j].phases:
            pending -= 1
        if cpu_len[j] > 0.0:
            heapq.heappush(cpu, (now + cpu_len[j], j))
        else:
            start_io(j)

    for j in range(k):
        if cpu_len[j] > 0.0:
            heapq.heappush(cpu, (cpu_len[j], j))
        else:
            start_io(j)
    while pending:
        events += 1
        dt = cpu[0][0] - now if cpu else float("inf")
        for r in range(n_resources):
            heap = tags[r]
            if heap:
                t = (heap[0][0] - clock[r]) * len(heap)
                if t < dt:
                    dt = t
        dt = max(dt, 0.0)
        if audit is not None:
            audit(dt, {r: sum(1.0 / len(h) for _ in h) for r, h in enumerate(tags) if h})
        now += dt
        for r in range(n_resources):  # advance every clock first: ends start new transfers
            heap = tags[r]
            if heap:
                clock[r] += dt / len(heap)
                busy[r] += dt
        for r in range(n_resources):
            heap = tags[r]
            if heap:
                while heap and heap[0][0] - clock[r] <= _REL * work[heap[0][1]]:
                    j = heapq.heappop(heap)[1]
                    volume[j] += piece[j]
                    left[j] -= 1
                    if left[j] == 0:
                        end_io(j)
        while cpu and cpu[0][0] - now <= 1e-9 * max(1.0, now):
            start_io(heapq.heappop(cpu)[1])
    for j in range(k):  # the I/O subphases under way at the window's end
        start = io_start[j]
        if start is not None:
            io_time[j] += now - start
    for r in range(n_resources):
        for tag, j in tags[r]:
            volume[j] += piece[j] - (tag - clock[r]) * speed[j]
    return Measured(
        t=now,
        io_time=tuple(io_time),
        volume=tuple(volume),
        busy=tuple(b / now if now > 0 else 0.0 for b in busy),
        phases_done=tuple(done),
        events=events,
    )


# ------------------------------------------------------------------ sets, runs, rows

# the combinations [DIST-IO] §VI-B runs with profile-class (inaccurate) inputs
ROBUSTNESS = (
    ("tcpu-allocator", "greedy-non-clairvoyant"),
    ("best-bdw", "greedy-non-clairvoyant"),
    ("best-bdw", "greedy-clairvoyant"),
)
FIELDS = (
    "set",
    "target",
    "k",
    "load",
    "allocator",
    "placement",
    "inaccurate",
    "io_load",
    "mean_slowdown",
    "max_slowdown",
    "io_spread",
    "rho_io",
    "rho_con",
    "machine_idle_time",
    "events",
)


@dataclass(frozen=True, slots=True)
class PlacementSet:
    """One generated set: its applications (the model's ``App`` with the true b_j), the
    shape of each one's profile, I/O-load(π_sys) and where the curves came from
    (``curves.CURVE_SOURCES``)."""

    index: int
    target: float  # Θ
    apps: tuple[App, ...]
    shapes: tuple[str, ...]
    load_sys: float
    curves: str = "synthetic"


def _rng(*parts: object) -> random.Random:
    """A generator seeded by a string of ``parts`` (stable across processes and runs)."""
    return random.Random(":".join(map(repr, parts)))


def make_set(load: float, seed: int, index: int, curves: str = "synthetic") -> PlacementSet:
    """Set ``index`` of target load ``load`` for ``seed`` (its own seed: reproducible
    alone, whatever else runs), its b_j drawn from ``curves`` (``curves.drawer``)."""
    rng = _rng("dist-io-set", seed, float(load), index)
    profiles: list[Profile] = []
    draw_curve = drawer(curves)

    def draw(r: random.Random) -> tuple[str, Sequence[float]]:
        shape, profile = draw_curve(r)  # b_j on 1..8, capped beyond (policies.placement)
        profiles.append(profile)
        return shape, [profile(n) for n in range(1, N_RESOURCES + 1)]

    gen = generate(load, rng, draw)
    apps = tuple(
        App(g.name, q=g.q, t_cpu=g.t_cpu, v_io=g.v_io, phases=g.phases, profile=profile)
        for g, profile in zip(gen, profiles, strict=True)
    )
    pi_sys = [n_sys(a, N_RESOURCES) for a in apps]
    return PlacementSet(
        index=index,
        target=float(load),
        apps=apps,
        shapes=tuple(g.shape for g in gen),
        load_sys=io_load(apps, pi_sys, N_RESOURCES),
        curves=curves,
    )


def _class_apps(pset: PlacementSet) -> list[App]:
    """What the allocators see with inaccurate inputs ([DIST-IO] §VI-B): each
    application's b_j replaced by its shape's class curve (of the set's curve source),
    scaled to its own b_j(1) (known from V_io and T_cf_io(1) of a previous run)."""
    out = []
    for a, shape in zip(pset.apps, pset.shapes, strict=True):
        assert a.profile is not None
        curve = class_profile(pset.curves, shape).scaled(a.profile(1))
        out.append(replace(a, profile=curve))
    return out


def run_one(
    pset: PlacementSet, allocator: str, placement: str, seed: int, inaccurate: bool = False
) -> dict[str, Any]:
    """Allocates, places, simulates one set and measures: one row of ``FIELDS``."""
    apps = list(pset.apps)
    known = _class_apps(pset) if inaccurate else apps
    # the same draws with exact and inaccurate inputs: the pairs differ by information only
    rng = _rng("dist-io-run", seed, pset.target, pset.index, allocator, placement)
    counts = allocate(allocator, known, N_RESOURCES, Q_CPU, rng)
    sets = place(placement, known, counts, N_RESOURCES, rng)
    sim_apps = []
    for a, n, s in zip(apps, counts, sets, strict=True):
        assert a.profile is not None and a.t_cpu is not None and a.v_io is not None
        sim_apps.append(SimApp(a.phases, a.t_cpu, a.v_io, a.profile(n), tuple(s)))
    m = simulate(sim_apps, N_RESOURCES)
    return {
        "set": pset.index,
        "target": pset.target,
        "k": len(apps),
        "load": pset.load_sys,
        "allocator": allocator,
        "placement": placement,
        "inaccurate": inaccurate,
        "io_load": io_load(apps, counts, N_RESOURCES),
        **measure(apps, counts, m),
        "events": m.events,
    }


def run_set(
    pset: PlacementSet,
    allocators: Sequence[str],
    placements: Sequence[str],
    seed: int,
    inaccurate: bool = False,
) -> list[dict[str, Any]]:
    """Every (allocator, placement) on one set, in the order given."""
    return [run_one(pset, a, p, seed, inaccurate) for a in allocators for p in placements]


@dataclass(frozen=True, slots=True)
class SweepTask:
    """One set of one load point of the sweep: all combinations, accurate, and the
    robustness combinations with profile-class inputs."""

    load: float
    index: int
    seed: int
    curves: str = "synthetic"


def sweep_task(task: SweepTask) -> list[dict[str, Any]]:
    pset = make_set(task.load, task.seed, task.index, task.curves)
    rows = run_set(pset, ALLOCATOR_NAMES, PLACEMENT_NAMES, task.seed)
    rows += [run_one(pset, a, p, task.seed, inaccurate=True) for a, p in ROBUSTNESS]
    return rows


def sweep_tasks(
    loads: Sequence[float], sets: int, seed: int = 0, curves: str = "synthetic"
) -> list[SweepTask]:
    """The cases of a sweep, in the order of its rows: load, then set."""
    return [SweepTask(float(load), i, seed, curves) for load in loads for i in range(sets)]


def rows_per_task(task: SweepTask) -> int:
    return len(ALLOCATOR_NAMES) * len(PLACEMENT_NAMES) + len(ROBUSTNESS)


def row_file(
    path: Path, fmt: Format = "csv", params: Mapping[str, Any] | None = None
) -> RowFile[SweepTask]:
    """The sweep's CSV (``placement.csv``) as a campaign's output file: a row's case is
    its (target, set); ``params``: as `RowFile`'s."""
    return RowFile(
        path,
        fmt,
        FIELDS,
        lambda t: (t.load, t.index),
        lambda r: (float(r["target"]), int(r["set"])),
        rows_per_task,
        params,
    )


def sweep(
    loads: Sequence[float],
    sets: int,
    seed: int = 0,
    workers: int | None = 1,
    scheduler: str | None = None,
    *,
    out: Path | None = None,
    resume: bool = False,
    progress: Callable[[str], None] | None = None,
    params: Mapping[str, Any] | None = None,
    curves: str = "synthetic",
) -> list[dict[str, Any]]:
    """The rows of every set of every load point, in (load, set) order wherever the cases
    ran (``workers``, ``scheduler``: as `campaign.Cluster`'s; each set has its own seed, so
    the rows are the same row for row). ``out``: the rows also go to this CSV as the sets
    finish (`campaign.RowFile`); ``resume``: the sets already there are not run again, and
    the rows returned are read back from it; ``params``: recorded beside it and checked
    on resume (`campaign.RowFile`); ``curves``: the sets' curve source (`make_set`)."""
    tasks = sweep_tasks(loads, sets, seed, curves)
    target = row_file(out, params=params) if out is not None else None
    chunks = run_campaign(
        sweep_task,
        tasks,
        Cluster(workers, scheduler),
        out=target,
        resume=resume,
        progress=progress,
        label=lambda t: f"load {t.load} set {t.index}",
    )
    if chunks is None:
        assert out is not None
        return read_csv(out)
    return [row for rows in chunks for row in rows]


def write_csv(rows: Sequence[dict[str, Any]], out: Path) -> Path:
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in FIELDS})
    return out


def read_csv(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with path.open() as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = dict(raw)
            for key in ("set", "k", "events"):
                row[key] = int(raw[key])
            for key in FIELDS:
                if key not in ("set", "k", "events", "allocator", "placement", "inaccurate"):
                    row[key] = float(raw[key])
            row["inaccurate"] = raw["inaccurate"] == "True"
            rows.append(row)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A fixed-width table, one line per row."""
    head = (
        f"{'set':>4} {'load':>6} {'allocator':<15} {'placement':<23} {'mean_sd':>8} "
        f"{'max_sd':>8} {'spread':>7} {'rho_io':>7} {'rho_con':>8} {'idle':>7}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['set']:>4} {r['load']:>6.3f} {r['allocator']:<15} {r['placement']:<23} "
            f"{r['mean_slowdown']:>8.3f} {r['max_slowdown']:>8.3f} {r['io_spread']:>7.3f} "
            f"{r['rho_io']:>7.3f} {r['rho_con']:>8.3f} {r['machine_idle_time']:>7.3f}"
        )
    return lines


def measure(apps: Sequence[App], counts: Sequence[int], m: Measured) -> dict[str, float]:
    """The metrics of [DIST-IO] §III-C (``policies.placement.metrics``) from what ``simulate``
    measured, against the true b_j: Mean- and Max-I/O-SlowDown, the mean over applications
    of ρ_j^io and ρ_j^con, I/O-spread of the resources' occupancy, Machine-IdleTime."""
    slow = []
    for a, n, t, v in zip(apps, counts, m.io_time, m.volume, strict=True):
        assert a.profile is not None
        slow.append(metrics.slowdown(t, v, n, a.profile, N_RESOURCES))
    rhos = [s.rho for s in slow]
    return {
        "mean_slowdown": metrics.mean_slowdown(rhos),
        "max_slowdown": metrics.max_slowdown(rhos),
        "io_spread": metrics.io_spread(m.busy),
        "rho_io": statistics.fmean(s.rho_io for s in slow),
        "rho_con": statistics.fmean(s.rho_con for s in slow),
        "machine_idle_time": metrics.machine_idle_time(m.io_time, [a.q for a in apps], m.t, Q_CPU),
    }
