"""The DPSAC simulator: a burst buffer in front of a PFS, and three schedulers ([DPSAC] §5).

Owns ``burstctl sim dpsac``, ``sim dpsac-join`` and ``sim dpsac-plot``; the model, the
metrics and every choice the paper leaves open are in docs/simulator.md, "DPSAC". The
algorithms (clustering, partition, Dist, Algorithm 3, priorities, updaters) are those of
``burstctl.policies.dpsac``; this module only drives them.

The platform. PFS bandwidth B, buffer capacity S, split into partitions (one per cluster
for DPSAC, one for MCIOS and BIOS), partition k with capacity cap_k = U_k·S and PFS share
share_k = U_k·B. Each step of ``dt`` seconds, the applications in I/O of a partition send,
in their scheduler's order, up to their granted rate: first straight to the PFS while the
share lasts, then into the partition's buffer while it has room, slowed near full (the
SSD model below), and what neither takes is not sent (the transfer blocks). What is left
of the share drains the partition's buffer. So a partition never holds more than cap_k
and never sends more than share_k to the PFS.

The SSD model ([DPSAC] §4.4: the buffer's performance "will rapidly decrease with its
spare space exhausting", write amplification). Above a fill fraction ``knee`` the rate at
which a partition's buffer absorbs falls linearly, to ``floor`` × the offered rate at
full. ``knee = 1`` turns it off.

Time. The loop is time-stepped with ``dt`` while some application is in I/O or some
buffer holds data, and jumps to the next compute-phase end otherwise (draining the
buffers over the jump). A scheduler decides for a partition whenever one of its
applications starts or ends an I/O phase, and otherwise every time unit Δ_k of the
partition ([DPSAC] §3.2.2, §4.4: the mean I/O-phase length l_i of its applications);
its grants hold until the next decision.
"""

from __future__ import annotations

import csv
import math
import random
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from burstctl.policies.dpsac.algorithm3 import full_probability, schedule
from burstctl.policies.dpsac.clustering import cluster
from burstctl.policies.dpsac.dist import LoadDistribution, to_units
from burstctl.policies.dpsac.model import App
from burstctl.policies.dpsac.partition import Part, partition
from burstctl.policies.dpsac.priorities import Efficiency, minmax
from burstctl.policies.dpsac.updaters import Updater, make_updater
from burstctl.simulator.campaign import Cluster, Row, RowFile, map_cases, run_campaign
from burstctl.simulator.dpsac_workloads import (
    B_PFS,
    JOINERS,
    KINDS,
    NODE_RATE,
    S_BUFFER,
    AppKind,
    set_apps,
    table3_apps,
    teio,
    with_instances,
)

DEFAULT_DT = 1.0  # s
DEFAULT_KNEE = 0.8
DEFAULT_FLOOR = 0.2
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Params:
    """The platform and the loop's knobs."""

    bandwidth: float = B_PFS  # B, GB/s
    capacity: float = S_BUFFER  # S, GB
    dt: float = DEFAULT_DT  # s, the physics step
    knee: float = DEFAULT_KNEE  # fill fraction where the SSD slowdown starts (1 = none)
    floor: float = DEFAULT_FLOOR  # absorb factor at full
    release_spread: float = 1.0  # r_i ~ U(0, spread·T_i)
    unit: float | None = None  # Δ for every partition, s (None: the paper's mean l_i)

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or not self.capacity > 0 or not self.dt > 0:
            raise ValueError("bandwidth, capacity and dt must be > 0")
        if not 0.0 < self.knee <= 1.0 or not 0.0 < self.floor <= 1.0:
            raise ValueError("knee and floor must be in (0, 1]")
        if self.release_spread < 0:
            raise ValueError("release_spread must be >= 0")
        if self.unit is not None and not self.unit > 0:
            raise ValueError("unit must be > 0")

    def time_unit(self, kinds: Sequence[AppKind]) -> float:
        """Δ of a partition holding ``kinds``: ``unit`` if set, else their mean l_i."""
        return self.unit if self.unit is not None else mean_unit(kinds)

    def absorb_factor(self, fill: float) -> float:
        """The SSD model: 1 up to ``knee``, then linear down to ``floor`` at full."""
        if fill <= self.knee or self.knee >= 1.0:
            return 1.0
        x = min(1.0, (fill - self.knee) / (1.0 - self.knee))
        return 1.0 - (1.0 - self.floor) * x


@dataclass(slots=True)
class SimApp:
    """One running application and its state."""

    index: int
    kind: AppKind
    release: float  # r_i
    done: int = 0  # n_i(t): completed instances
    in_io: bool = False
    compute_end: float = 0.0  # end of the current compute phase
    remaining: float = 0.0  # GB left in the current I/O phase
    finish: float | None = None  # d_i
    partition: int = 0
    moved: float = 0.0  # GB sent (PFS + buffer)

    def rho_tilde(self, t: float) -> float:
        """ρ̃_i(t) = n_i(t)·W_i / (t − r_i); ρ_i before any time has passed."""
        if t <= self.release + _EPS:
            return self.kind.rho
        return self.done * self.kind.work / (t - self.release)


@dataclass(slots=True)
class Partition:
    """A share of the buffer and of the PFS."""

    cap: float  # GB
    share: float  # GB/s
    unit: float  # Δ_k, s
    level: float = 0.0  # L_k, GB
    next_decision: float = 0.0
    dirty: bool = True
    grants: list[tuple[SimApp, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Step:
    """What one physics step did (for tests and traces)."""

    t: float
    dt: float
    levels: tuple[float, ...]
    caps: tuple[float, ...]
    granted: float  # Σ granted rates, GB/s
    direct: float  # GB sent straight to the PFS
    absorbed: float  # GB into the buffer
    drained: float  # GB from the buffer to the PFS


class Scheduler(Protocol):
    """A method: lays out the partitions and decides the grants of one partition."""

    name: str

    def layout(self, sim: Simulation) -> None:
        """Sets ``sim.partitions`` and every application's ``partition``."""

    def decide(self, sim: Simulation, k: int, active: list[SimApp]) -> list[tuple[SimApp, float]]:
        """The grants (application, GB/s) of partition ``k``, in priority order."""

    def join(self, sim: Simulation, app: SimApp) -> None:
        """An application joined (after t = 0)."""

    def exit(self, sim: Simulation, app: SimApp) -> None:
        """An application finished its last instance."""


@dataclass(frozen=True, slots=True)
class Result:
    """One run of one method."""

    method: str
    seed: int
    sys_eff: float
    dilation: float
    makespan: float
    sched_seconds: float  # CPU time in the scheduler (decisions and updates)
    decisions: int
    moved: float  # GB sent by the applications
    io_total: float  # GB, Σ IO_i over finished instances
    pfs: float  # GB that reached the PFS (after the final drain)
    max_level: float  # GB, the largest total buffer level seen
    steps: int


class Simulation:
    """One run: applications, partitions, clock."""

    def __init__(
        self,
        apps: Sequence[tuple[AppKind, float]],
        scheduler: Scheduler,
        params: Params,
        rng: random.Random,
        on_step: Callable[[Step], None] | None = None,
    ) -> None:
        """``apps``: (kind, arrival time); each release r_i = arrival + U(0, spread·T_i)
        drawn from ``rng``; the scheduler draws from ``rng`` too."""
        self.params = params
        self.rng = rng
        self.scheduler = scheduler
        self.on_step = on_step
        self.apps: list[SimApp] = []
        for i, (kind, arrival) in enumerate(apps):
            r = arrival + rng.uniform(0.0, params.release_spread * kind.period)
            self.apps.append(SimApp(i, kind, r, compute_end=r + kind.work))
        self.arrival = [a for _, a in apps]
        self.joined = [a == 0.0 for a in self.arrival]
        self.partitions: list[Partition] = []
        self.t = 0.0
        self.sched_seconds = 0.0
        self.decisions = 0
        self.pfs = 0.0
        self.max_level = 0.0
        self.steps = 0

    # -- helpers for schedulers -------------------------------------------------------
    def members(self, k: int) -> list[SimApp]:
        return [a for a in self.apps if a.partition == k and self.joined[a.index]]

    def timed(self, fn: Callable[[], None]) -> None:
        """Runs ``fn`` and charges its CPU time to the scheduler."""
        start = time.perf_counter()
        fn()
        self.sched_seconds += time.perf_counter() - start

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        self.timed(lambda: self.scheduler.layout(self))
        dt = self.params.dt
        while any(a.finish is None for a in self.apps):
            self._joins()
            self._phase_starts()
            self._decide()
            busy = any(a.in_io for a in self.apps)
            if not busy:
                nxt = min(self._next_event(), self.t + 1e12)
                self._drain_only(nxt - self.t)
                self.t = nxt
                continue
            self._physics(dt)
            self.t += dt
        # what is still buffered reaches the PFS afterwards
        for p in self.partitions:
            self.pfs += p.level
            p.level = 0.0

    def _next_event(self) -> float:
        times = [a.compute_end for a in self.apps if a.finish is None and not a.in_io]
        times += [a for j, a in enumerate(self.arrival) if not self.joined[j]]
        return max(self.t, min(times))

    def _joins(self) -> None:
        for a in self.apps:
            if not self.joined[a.index] and self.arrival[a.index] <= self.t + _EPS:
                self.joined[a.index] = True
                self.timed(lambda a=a: self.scheduler.join(self, a))  # type: ignore[misc]

    def _phase_starts(self) -> None:
        for a in self.apps:
            if (
                self.joined[a.index]
                and a.finish is None
                and not a.in_io
                and a.compute_end <= self.t + _EPS
            ):
                a.in_io = True
                a.remaining = a.kind.io_volume
                self.partitions[a.partition].dirty = True

    def _decide(self) -> None:
        for k, p in enumerate(self.partitions):
            if not (p.dirty or self.t + _EPS >= p.next_decision):
                continue
            active = [a for a in self.apps if a.in_io and a.partition == k]
            p.dirty = False
            p.next_decision = self.t + p.unit
            if not active:
                p.grants = []
                continue
            start = time.perf_counter()
            p.grants = self.scheduler.decide(self, k, active)
            self.sched_seconds += time.perf_counter() - start
            self.decisions += 1

    def _drain_only(self, span: float) -> None:
        for p in self.partitions:
            d = min(p.level, p.share * span)
            p.level -= d
            self.pfs += d

    def _physics(self, dt: float) -> None:
        prm = self.params
        granted = direct_all = absorbed_all = drained_all = 0.0
        for p in self.partitions:
            pfs_left = p.share * dt
            room = max(0.0, p.cap - p.level)
            factor = prm.absorb_factor(p.level / p.cap) if p.cap > 0 else 0.0
            absorbed = 0.0
            for a, rate in p.grants:
                if not a.in_io or rate <= 0.0:
                    continue
                granted += rate
                want = min(rate * dt, a.remaining)
                direct = min(want, pfs_left)
                pfs_left -= direct
                buffered = min((want - direct) * factor, room)
                room -= buffered
                absorbed += buffered
                sent = direct + buffered
                direct_all += direct
                a.remaining -= sent
                a.moved += sent
                if a.remaining <= 1e-9 * a.kind.io_volume:
                    # the phase ends inside the step, at the fraction it took
                    frac = sent / (rate * dt) if rate > 0 else 1.0
                    self._end_io(a, self.t + min(1.0, frac) * dt)
            drained = min(p.level, pfs_left)
            p.level += absorbed - drained
            self.pfs += drained
            absorbed_all += absorbed
            drained_all += drained
        self.pfs += direct_all
        self.steps += 1
        level = sum(p.level for p in self.partitions)
        self.max_level = max(self.max_level, level)
        if self.on_step is not None:
            self.on_step(
                Step(
                    self.t,
                    dt,
                    tuple(p.level for p in self.partitions),
                    tuple(p.cap for p in self.partitions),
                    granted,
                    direct_all,
                    absorbed_all,
                    drained_all,
                )
            )

    def _end_io(self, a: SimApp, at: float) -> None:
        a.in_io = False
        a.remaining = 0.0
        a.done += 1
        self.partitions[a.partition].dirty = True
        if a.done >= a.kind.instances:
            a.finish = at
            self.timed(lambda: self.scheduler.exit(self, a))
        else:
            a.compute_end = at + a.kind.work

    # -- metrics --------------------------------------------------------------------
    def result(self, seed: int) -> Result:
        """SysEff and Dilation ([DPSAC] §3.3 eqs. (1), (2))."""
        n = sum(a.kind.nodes for a in self.apps)
        sys_eff = 0.0
        dilation = 0.0
        makespan = 0.0
        for a in self.apps:
            assert a.finish is not None
            rt = a.kind.instances * a.kind.work / (a.finish - a.release)
            sys_eff += a.kind.nodes * rt
            dilation = max(dilation, a.kind.rho / rt)
            makespan = max(makespan, a.finish)
        return Result(
            method=self.scheduler.name,
            seed=seed,
            sys_eff=sys_eff / n,
            dilation=dilation,
            makespan=makespan,
            sched_seconds=self.sched_seconds,
            decisions=self.decisions,
            moved=sum(a.moved for a in self.apps),
            io_total=sum(a.done * a.kind.io_volume for a in self.apps),
            pfs=self.pfs,
            max_level=self.max_level,
            steps=self.steps,
        )


def mean_unit(kinds: Sequence[AppKind]) -> float:
    """Δ = the mean I/O-phase length l_i ([DPSAC] §3.2.2)."""
    return statistics.fmean(k.checkpoint for k in kinds) if kinds else 1.0


def stderr(xs: Sequence[float]) -> float:
    """The standard error of the mean (0 for one value)."""
    return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0


# -- experiments ------------------------------------------------------------------------

METHODS: tuple[str, ...] = ("dpsac", "mcios", "bios")
UPDATERS: tuple[str, ...] = ("st", "dt", "ok")
DEFAULT_JOINS = 5


def run_seeds(seed: int, runs: int) -> list[int]:
    """The seeds of ``runs`` runs derived from ``seed``: seed, seed + 1, …"""
    return [seed + r for r in range(runs)]


def simulate(
    apps: Sequence[tuple[AppKind, float]],
    method: str,
    seed: int,
    params: Params | None = None,
    updater: str | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> Result:
    """One run of ``method`` on ``apps`` ((kind, arrival) pairs) with ``random.Random(seed)``
    (the releases first, so every method of one seed sees the same releases)."""
    sim = Simulation(
        apps, make_scheduler(method, updater), params or Params(), random.Random(seed), on_step
    )
    sim.run()
    return sim.result(seed)


@dataclass(frozen=True, slots=True)
class Summary:
    """A method's mean over runs."""

    label: str  # "set 3" or "join eap"
    method: str
    runs: int
    sys_eff: float
    sys_eff_se: float
    dilation: float
    dilation_se: float
    sched_seconds: float  # mean CPU seconds in the scheduler per run
    teio_over_b: float
    results: tuple[Result, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "method": self.method,
            "runs": self.runs,
            "sys_eff": self.sys_eff,
            "sys_eff_se": self.sys_eff_se,
            "dilation": self.dilation,
            "dilation_se": self.dilation_se,
            "sched_seconds": self.sched_seconds,
            "teio_over_b": self.teio_over_b,
        }


def summarise(label: str, method: str, results: Sequence[Result], teio_over_b: float) -> Summary:
    se = [r.sys_eff for r in results]
    dil = [r.dilation for r in results]
    return Summary(
        label,
        method,
        len(results),
        statistics.fmean(se),
        stderr(se),
        statistics.fmean(dil),
        stderr(dil),
        statistics.fmean(r.sched_seconds for r in results),
        teio_over_b,
        tuple(results),
    )


def set_workload(number: int) -> list[tuple[AppKind, float]]:
    """Table 2's set ``number``: every application arrives at t = 0."""
    return [(k, 0.0) for k in set_apps(number)]


def join_workload(joiner: str, joins: int = DEFAULT_JOINS) -> list[tuple[AppKind, float]]:
    """Table 3's batch at t = 0, then one ``joiner`` (Table 4) at each m·period, m = 1..joins."""
    if joiner not in JOINERS:
        raise ValueError(f"joiner: must be one of {', '.join(JOINERS)}, got {joiner!r}")
    if joins < 0:
        raise ValueError(f"joins must be >= 0, got {joins}")
    j = JOINERS[joiner]
    kind = with_instances(KINDS[j.kind], j.instances)
    return [(k, 0.0) for k in table3_apps()] + [(kind, m * j.period) for m in range(1, joins + 1)]


@dataclass(frozen=True, slots=True)
class Case:
    """One run of a campaign: ``method`` (with ``updater``) on ``apps`` with ``seed``."""

    label: str
    apps: tuple[tuple[AppKind, float], ...]
    method: str
    seed: int
    params: Params | None
    updater: str | None = None

    def describe(self) -> str:
        return f"{self.label} {self.updater or self.method} seed {self.seed}"


def run_case(case: Case) -> Result:
    return simulate(case.apps, case.method, case.seed, case.params, updater=case.updater)


def case_rows(case: Case) -> list[Row]:
    """`run_case` as the one row of a runs file: the case's keys, then the `Result`."""
    return [{"label": case.label, "updater": case.updater, **asdict(run_case(case))}]


def _case_key(case: Case) -> Hashable:
    return (case.label, case.method, case.updater, case.seed)


def _row_key(row: Row) -> Hashable:
    return (row["label"], row["method"], row["updater"], int(row["seed"]))


def result_of(row: Row) -> Result:
    """The `Result` of a runs-file row (JSON keeps every value exactly)."""
    return Result(**{f.name: row[f.name] for f in fields(Result)})


def runs_file(path: Path, params: Mapping[str, Any] | None = None) -> RowFile[Case]:
    """The runs file of a DPSAC campaign (``--runs-file``/``--resume``): JSON lines, one
    run per line, keyed by (label, method, updater, seed); ``params``: as `RowFile`'s."""
    names = ("label", "updater", *(f.name for f in fields(Result)))
    return RowFile(path, "json", names, _case_key, _row_key, lambda _c: 1, params)


def _run(
    cases: list[Case],
    where: Cluster | None,
    progress: Callable[[str], None] | None,
    out: RowFile[Case] | None = None,
    resume: bool = False,
) -> list[Result]:
    if out is not None:
        # Every run through the file: the summaries come from its rows, resumed or not.
        run_campaign(
            case_rows,
            cases,
            where or Cluster(workers=1),
            out=out,
            resume=resume,
            progress=progress,
            label=Case.describe,
        )
        return [result_of(rows[0]) for rows in out.case_rows()]
    if where is None:
        return [run_case(c) for c in cases]
    return map_cases(run_case, cases, where, progress=progress, label=Case.describe)


def run_set(
    number: int,
    methods: Sequence[str] = METHODS,
    runs: int = 5,
    seed: int = 0,
    params: Params | None = None,
    where: Cluster | None = None,
    progress: Callable[[str], None] | None = None,
    out: RowFile[Case] | None = None,
    resume: bool = False,
) -> list[Summary]:
    """Each method on set ``number``, ``runs`` runs, seeds from ``seed``; the runs on
    ``where`` (`campaign.Cluster`; default: in this process). ``out`` (`runs_file`): each
    run is appended to it as it finishes and the summaries are computed from its rows;
    ``resume``: the runs already there are not run again."""
    return run_sets([number], methods, runs, seed, params, where, progress, out, resume)


def run_sets(
    numbers: Sequence[int],
    methods: Sequence[str] = METHODS,
    runs: int = 5,
    seed: int = 0,
    params: Params | None = None,
    where: Cluster | None = None,
    progress: Callable[[str], None] | None = None,
    out: RowFile[Case] | None = None,
    resume: bool = False,
) -> list[Summary]:
    """`run_set` of each set in ``numbers``, as one campaign."""
    apps = {n: tuple(set_workload(n)) for n in numbers}
    seeds = run_seeds(seed, runs)
    cases = [
        Case(f"set {n}", apps[n], m, s, params) for n in numbers for m in methods for s in seeds
    ]
    results = iter(_run(cases, where, progress, out, resume))
    bandwidth = (params or Params()).bandwidth
    return [
        summarise(
            f"set {n}",
            m,
            [next(results) for _ in seeds],
            teio([k for k, _ in apps[n]]) / bandwidth,
        )
        for n in numbers
        for m in methods
    ]


def run_join(
    joiner: str,
    updaters: Sequence[str] = UPDATERS,
    runs: int = 5,
    seed: int = 0,
    params: Params | None = None,
    joins: int = DEFAULT_JOINS,
    where: Cluster | None = None,
    progress: Callable[[str], None] | None = None,
    out: RowFile[Case] | None = None,
    resume: bool = False,
) -> list[Summary]:
    """DPSAC with each updater on Table 3's batch plus ``joins`` joiners of kind ``joiner``;
    the runs on ``where`` (default: in this process); ``out``, ``resume``: as
    `run_set`'s."""
    apps = tuple(join_workload(joiner, joins))
    ratio = teio([k for k, _ in apps]) / (params or Params()).bandwidth
    seeds = run_seeds(seed, runs)
    cases = [Case(f"join {joiner}", apps, "dpsac", s, params, u) for u in updaters for s in seeds]
    results = iter(_run(cases, where, progress, out, resume))
    return [summarise(f"join {joiner}", u, [next(results) for _ in seeds], ratio) for u in updaters]


def table(summaries: Sequence[Summary], head: str = "method") -> list[str]:
    """A text table: one line per summary."""
    lines = [
        f"{'':<10} {head:<7} {'runs':>4} {'SysEff':>8} {'±se':>7} {'Dilation':>9} {'±se':>7}"
        f" {'sched s':>8} {'TEIO/B':>7}"
    ]
    for s in summaries:
        lines.append(
            f"{s.label:<10} {s.method:<7} {s.runs:>4} {s.sys_eff:>8.4f} {s.sys_eff_se:>7.4f}"
            f" {s.dilation:>9.4f} {s.dilation_se:>7.4f} {s.sched_seconds:>8.3f}"
            f" {s.teio_over_b:>7.4f}"
        )
    return lines


# -- the three methods --------------------------------------------------------------------

K_MAX = 5  # K_C, the most clusters DPSAC makes ([DPSAC] §4.2)
GAMMA = 0.5  # MinMax-0.5, the priority of all three methods ([DPSAC] §5.2)


def _order(sim: Simulation, apps: Sequence[SimApp]) -> list[SimApp]:
    """``apps`` in MinMax-0.5 order at ``sim.t`` (``policies.dpsac.priorities``)."""
    effs = [Efficiency(str(a.index), a.rho_tilde(sim.t), a.kind.rho, a.kind.nodes) for a in apps]
    by_id = {str(a.index): a for a in apps}
    return [by_id[e.app_id] for e in minmax(effs, GAMMA)]


class Bios:
    """BIOS ([DPSAC] §5.2, after [BWS]-style greedy ordering): one partition (all of S and
    B), every application in I/O granted its B_i in MinMax-0.5 order, whatever the buffer
    holds. The platform then serves them in that order: the PFS first, the buffer while it
    has room, and the rest blocks."""

    name = "bios"

    def layout(self, sim: Simulation) -> None:
        p = sim.params
        sim.partitions = [
            Partition(p.capacity, p.bandwidth, p.time_unit([a.kind for a in sim.apps]))
        ]
        for a in sim.apps:
            a.partition = 0

    def decide(self, sim: Simulation, k: int, active: list[SimApp]) -> list[tuple[SimApp, float]]:
        return [(a, a.kind.bandwidth) for a in _order(sim, active)]

    def join(self, sim: Simulation, app: SimApp) -> None:
        app.partition = 0

    def exit(self, sim: Simulation, app: SimApp) -> None:
        pass


class Probabilistic:
    """DPSAC and MCIOS: Algorithm 3 per partition and time unit ([DPSAC] §4.4.3).

    DPSAC clusters the I/O-phase lengths l_i (Algorithm 1, K ≤ K_C by the elbow rule),
    gives cluster k the quota U_k·S and the PFS share U_k·B (§4.3) and the time unit
    Δ_k = the mean l_i of the cluster; MCIOS is the same with one cluster (U = 1, Δ the
    mean l_i of all applications). Algorithm 3 works in volumes per time unit: a rate B_i
    becomes B_i·Δ_k, and Dist counts in quanta of one node's rate × Δ_k (so B_i is β_i
    quanta). Its grants (volumes per Δ_k) become rates again.

    With an ``updater`` (the join experiment) the clusters are the updater's: a join goes
    into the cluster it names, Dist takes one more pass and U_k are recomputed for every
    partition (levels kept; Δ_k kept); an exit leaves the parameters alone (§4.5: "corrected
    when a new application is added") and takes the application out of Dist. When the
    updater reports ``changed`` (a split, a dropped cluster, a replaced centre), the
    partitions are laid out anew and the data already buffered is spread over them in
    proportion to their quotas."""

    def __init__(self, name: str, clustered: bool, updater: str | None = None) -> None:
        self.name = name
        self.clustered = clustered
        self.updater_name = updater
        self.updater: Updater | None = None
        self.dists: list[LoadDistribution] = []

    @staticmethod
    def model(a: SimApp) -> App:
        return App(str(a.index), a.kind.bandwidth, a.kind.p, a.kind.checkpoint)

    def layout(self, sim: Simulation) -> None:
        present = [a for a in sim.apps if sim.joined[a.index]]
        if self.updater_name is not None:
            self.updater = make_updater(self.updater_name, K_MAX, sim.rng)
            self.updater.on_batch([(str(a.index), a.kind.checkpoint) for a in present])
            self.updater.changed = False
            self._lay_out(sim, self._groups(sim))
        elif not self.clustered or len(present) <= 1:
            self._lay_out(sim, [present])
        else:
            c = cluster([a.kind.checkpoint for a in present], K_MAX)
            self._lay_out(sim, [[present[i] for i in members] for members in c.members])

    def _groups(self, sim: Simulation) -> list[list[SimApp]]:
        assert self.updater is not None
        return [[sim.apps[int(i)] for i in members] for members in self.updater.clusters]

    def _parts(self, sim: Simulation, groups: list[list[SimApp]]) -> list[Part]:
        models = {str(a.index): self.model(a) for g in groups for a in g}
        ids = [[str(a.index) for a in g] for g in groups]
        return partition(ids, models, sim.params.capacity, sim.params.bandwidth)

    def _lay_out(self, sim: Simulation, groups: list[list[SimApp]]) -> None:
        groups = groups or [[]]  # empty clusters stay: indices are the updater's
        total = sum(q.level for q in sim.partitions)
        sim.partitions = []
        self.dists = []
        for k, (g, part) in enumerate(zip(groups, self._parts(sim, groups), strict=True)):
            unit = sim.params.time_unit([a.kind for a in g])
            sim.partitions.append(Partition(part.quota, part.pfs, unit, level=total * part.share))
            dist = LoadDistribution(quantum=NODE_RATE * unit)
            for a in g:
                a.partition = k
                if a.finish is None:
                    dist.add(self._units(a, unit, dist), a.kind.p)
            self.dists.append(dist)

    @staticmethod
    def _units(a: SimApp, unit: float, dist: LoadDistribution) -> int:
        return to_units(a.kind.bandwidth * unit, dist.quantum)

    def decide(self, sim: Simulation, k: int, active: list[SimApp]) -> list[tuple[SimApp, float]]:
        part = sim.partitions[k]
        unit = part.unit
        ordered = _order(sim, active)
        p_full = full_probability(self.dists[k], part.cap, part.share * unit, part.level)
        tick = schedule(
            [(str(a.index), a.kind.bandwidth * unit) for a in ordered],
            part.share * unit,
            part.cap,
            part.level,
            min(1.0, max(0.0, p_full)),
            sim.rng,
        )
        return [(sim.apps[int(i)], v / unit) for i, v in tick.granted]

    def join(self, sim: Simulation, app: SimApp) -> None:
        if self.updater is None:  # no updater: into the closest cluster by time unit
            k = min(
                range(len(sim.partitions)),
                key=lambda k: abs(sim.partitions[k].unit - app.kind.checkpoint),
            )
            groups = [
                [a for a in sim.members(j) if a is not app] for j in range(len(sim.partitions))
            ]
            groups[k].append(app)
        else:
            k = self.updater.on_join(str(app.index), app.kind.checkpoint)
            if self.updater.changed:
                self.updater.changed = False
                self._relayout(sim)
                return
            groups = self._groups(sim)
        app.partition = k
        self.dists[k].add(self._units(app, sim.partitions[k].unit, self.dists[k]), app.kind.p)
        for part, new in zip(sim.partitions, self._parts(sim, groups), strict=True):
            part.cap, part.share = new.quota, new.pfs  # U_k again; levels and Δ_k kept
            part.dirty = True

    def exit(self, sim: Simulation, app: SimApp) -> None:
        if self.updater is not None:
            self.updater.on_exit(str(app.index))
            if self.updater.changed:
                self.updater.changed = False
                self._relayout(sim)
                return
        k = app.partition
        self.dists[k].remove(self._units(app, sim.partitions[k].unit, self.dists[k]), app.kind.p)

    def _relayout(self, sim: Simulation) -> None:
        self._lay_out(sim, self._groups(sim))
        for p in sim.partitions:
            p.dirty = True


def make_scheduler(method: str, updater: str | None = None) -> Scheduler:
    """``dpsac``, ``mcios`` or ``bios`` (an updater only with ``dpsac``)."""
    if method not in METHODS:
        raise ValueError(f"method: must be one of {', '.join(METHODS)}, got {method!r}")
    if updater is not None and method != "dpsac":
        raise ValueError("an updater goes with the dpsac method only")
    if method == "bios":
        return Bios()
    return Probabilistic(method, clustered=method == "dpsac", updater=updater)


CSV_FIELDS = (
    "label",
    "method",
    "runs",
    "sys_eff",
    "sys_eff_se",
    "dilation",
    "dilation_se",
    "sched_seconds",
    "teio_over_b",
)


def write_csv(summaries: Sequence[Summary], out: Path) -> Path:
    """One row per summary (``CSV_FIELDS``)."""
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for s in summaries:
            writer.writerow(s.to_json())
    return out


def plot_sets(summaries: Sequence[Summary], out: Path) -> Path:
    """SysEff and Dilation per set, one line per method with standard-error bars (the
    layout of [DPSAC] Fig. 6). matplotlib is imported here only (extra ``[plot]``)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(s.label for s in summaries))
    methods = list(dict.fromkeys(s.method for s in summaries))
    by = {(s.label, s.method): s for s in summaries}
    xs = range(1, len(labels) + 1)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for m in methods:
        rows = [by[(lab, m)] for lab in labels]
        axes[0].errorbar(
            xs, [r.sys_eff for r in rows], yerr=[r.sys_eff_se for r in rows], marker="o", label=m
        )
        axes[1].errorbar(
            xs, [r.dilation for r in rows], yerr=[r.dilation_se for r in rows], marker="o", label=m
        )
    for ax, title in zip(axes, ("SysEff", "Dilation"), strict=True):
        ax.set_xticks(list(xs), [lab.replace("set ", "#") for lab in labels])
        ax.set_xlabel("set (Table 2)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
