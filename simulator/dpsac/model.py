"""The DPSAC simulator's platform and loop: a burst buffer in front of a PFS ([DPSAC] §5).

Owns the model of a run: the applications, the partitions, one step, the metrics
(``Result``) and the loop (``Simulation``) that asks a scheduler (``methods``) for its
grants; the choices the paper leaves open are in docs/simulator.md, "DPSAC".

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

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from burstctl.simulator.dpsac.workloads import (
    B_PFS,
    S_BUFFER,
    AppKind,
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
