"""PerSched, live: periodic jobs get PERSCHED's pattern of I/O windows ([PERSCHED]).

The jobs that declared their period (``SystemView.periodic``: ``w`` seconds of compute and
``vol_io`` bytes per iteration, on ``nodes`` nodes) are PERSCHED's applications: β = nodes,
b = the per-node bandwidth, B = the capacity less a ``reserve`` fraction. Each gets one
``Schedule`` per pattern (its windows over the period, rates in bytes/s, the origin fixed
while the pattern stands) and, as its rate, the pattern's mean rate. Every other job in
S(t) shares the reserve, opportunity-fair (FairShare's water-filling, weights b_i), and
borrows the window time periodic jobs leave unused (``lending.py``). With no periodic job at
all, every job shares all of B as FairShare does.

PERSCHED's search starts from ``live_tmin``, long enough for every job to move its volume
once, and from a longer one while the pattern still leaves a job without an instance.

The pattern is recomputed whenever the set of periodic jobs changes (an arrival, a
departure, a new declaration, a new B or b). With an ``Offload`` (the controller's worker
thread) the computation runs off the decision path; until it lands, jobs of the old pattern
keep their windows and the others, newcomers included, share the reserve. Without one
(the simulator, tests) it runs inside the decision. docs/persched.md, "Live policy".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from burstctl.policies.base import Offload, Policy, PolicyParams
from burstctl.policies.persched.algorithm import (
    MIN_TIME_IO,
    PerSchedResult,
    default_tmin,
    persched,
)
from burstctl.policies.persched.lending import Loan, borrowed, loans, next_change
from burstctl.policies.persched.model import App, Platform, time_io
from burstctl.policies.schedule import Schedule, Window
from burstctl.policies.sharing import water_levels
from burstctl.policies.view import JobId, RowRates, SystemView

GB = 1e9  # PERSCHED's model counts in GB and GB/s; the controller in bytes and bytes/s

# A pattern that leaves a job without an instance is searched again from a T_min this many
# times longer, at most TMIN_TRIES searches in all; a job still left out shares the reserve.
TMIN_GROWTH = 1.5
TMIN_TRIES = 4

# (job, nodes, w, vol_io) of every periodic job, in job order, then (capacity, b)
Key = tuple[tuple[tuple[str, int, float, float], ...], float, float]


class PerSchedParams(PolicyParams):
    reserve: float = Field(
        0.1,
        ge=0.01,
        le=0.9,
        description="fraction of B kept for jobs without a declared period (and newcomers)",
    )
    kprime: float = Field(10.0, ge=1.0, le=100.0, description="PERSCHED's K': T <= K'·T_min")
    epsilon: float = Field(0.01, ge=0.001, le=0.5, description="PERSCHED's period step ε")
    objective: Literal["syseff", "dilation"] = "syseff"
    headroom: float = Field(
        1e-3,
        ge=0.0,
        le=0.1,
        description="the pattern carries vol_io·(1 + headroom) per instance: rounding never "
        "leaves a job's last bytes to its next window",
    )
    lend: bool = Field(
        True,
        description="window time a periodic job leaves unused goes to the jobs of the reserve "
        "until the window's end",
    )
    lend_grace: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="seconds a window must have been open without its job in I/O before it is "
        "lent: a job that late still catches up from its bucket (the default burst_window)",
    )


@dataclass(frozen=True, slots=True)
class Computed:
    """One pattern, as schedules with origin 0, for the periodic jobs of ``key``."""

    key: Key
    result: PerSchedResult | None  # None: nothing computed (``error``, or no job fits)
    schedules: Mapping[JobId, Schedule]  # jobs with at least one window
    error: str | None = None

    def instances(self, job_id: JobId) -> int:
        """n_per of ``job_id`` in the pattern (0: not in it)."""
        if self.result is None:
            return 0
        for entry in self.result.pattern.apps:
            if entry.app.name == job_id:
                return entry.n_per
        return 0


def compute(key: Key, params: PerSchedParams) -> Computed:
    """PERSCHED on the periodic jobs of ``key``: pure, safe to run in a worker thread.

    A job whose transfer is below a pattern's resolution (``MIN_TIME_IO``) is left out (it
    shares the reserve); any error of the computation is returned, not raised."""
    jobs, capacity, node_bandwidth = key
    platform = Platform(B=capacity * (1.0 - params.reserve) / GB, b=node_bandwidth / GB)
    apps = [
        App(job_id, w, vol_io * (1.0 + params.headroom) / GB, float(nodes))
        for job_id, nodes, w, vol_io in jobs
    ]
    apps = [app for app in apps if time_io(app, platform) >= MIN_TIME_IO]
    if not apps:
        return Computed(key, None, {})
    t_min = live_tmin(apps, platform)
    try:
        for _ in range(TMIN_TRIES):
            result = persched(
                apps,
                platform,
                kprime=params.kprime,
                epsilon=params.epsilon,
                tmin=t_min,
                objective=params.objective,
            )
            if all(entry.n_per > 0 for entry in result.pattern.apps):
                break
            t_min *= TMIN_GROWTH
    except (ValueError, ArithmeticError) as exc:
        return Computed(key, None, {}, error=f"{type(exc).__name__}: {exc}")
    period = result.pattern.period
    schedules: dict[JobId, Schedule] = {}
    for entry in result.pattern.apps:
        windows = windows_of(
            [iv for inst in entry.instances for iv in inst.io if iv[2] > 0.0], period
        )
        if windows:
            schedules[entry.app.name] = Schedule(period, windows)
    return Computed(key, result, schedules)


def live_tmin(apps: list[App], platform: Platform) -> float:
    """The T_min the live policy starts PERSCHED's search from: the paper's
    ``max_k (w + time_io)``, and at least ``Σ_k vol_io / B``, the shortest period in which
    every job can move its volume once (a shorter one leaves a job without a window)."""
    return max(default_tmin(apps, platform), sum(app.vol_io for app in apps) / platform.B)


def windows_of(intervals: list[tuple[float, float, float]], period: float) -> tuple[Window, ...]:
    """A pattern's I/O sub-intervals ``(start, end, GB/s)`` (unwrapped, possibly past the
    period) as well-formed windows in bytes/s: starts in ``[0, period)``, sorted, no two
    overlapping (float residue clipped)."""
    placed = []
    for start, end, rate in intervals:
        s = start % period
        placed.append((s, s + (end - start), rate * GB))
    placed.sort()
    windows: list[Window] = []
    for s, e, rate in placed:
        if windows and s < windows[-1].end:
            s = windows[-1].end
        if e - s > 1e-9 and s < period:
            windows.append(Window(s, e, rate))
    if len(windows) > 1 and windows[-1].end - period > windows[0].start:
        last = windows[-1]
        end = windows[0].start + period
        windows[-1] = Window(last.start, end, last.rate)
        if end - last.start <= 1e-9:
            windows.pop()
    return tuple(windows)


@dataclass(frozen=True, slots=True)
class Installed:
    """The pattern in force: its schedules with their origin on the view's clock."""

    computed: Computed
    origin: float
    schedules: Mapping[JobId, Schedule]


@dataclass(frozen=True, slots=True)
class _Lent:
    """What a decision lends: on ``view``, the ``loans`` and the borrowers' schedules."""

    view: SystemView
    loans: tuple[Loan, ...]
    borrowed: Mapping[JobId, Schedule]
    borrowers: bool  # some job shares the reserve (it could borrow)


class PerSchedLive(Policy):
    """Jobs with a declared period get PERSCHED's windows; the others share the reserve."""

    name = "persched"
    Params = PerSchedParams
    keeps_state = True  # the pattern of the periodic jobs of its views

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self._offload: Offload | None = None
        self.installed: Installed | None = None
        self._pending: Key | None = None  # the key a computation is running for
        self._landing: Computed | None = None  # computed off the decision path, not installed
        self.recomputations = 0  # computations started
        self.last_error: str | None = None
        self._lent: _Lent | None = None  # the loans of the latest decision

    def use_offload(self, offload: Offload | None) -> None:
        self._offload = offload

    # -- the pattern ---------------------------------------------------------------
    def _refresh(self, view: SystemView) -> None:
        key = _key(view)
        if key is None:
            return
        installed = self.installed
        if installed is not None and installed.computed.key == key:
            return
        if self._pending is not None:
            return  # one computation at a time; its result is checked against the key
        self._pending = key
        self.recomputations += 1
        params = self._params()
        if self._offload is None:
            self._landed(compute(key, params), view.now)
        else:
            self._offload(lambda: compute(key, params), self._done)

    def _done(self, computed: Any) -> None:
        """On the decision path, before the decision the offload asks for."""
        self._landed(computed if isinstance(computed, Computed) else None, None)

    def _landed(self, computed: Computed | None, now: float | None) -> None:
        """A computation is over; its pattern is installed at the next decision whose view
        has the same periodic jobs (``now``: at once, the computation ran in the decision)."""
        self._pending = None
        if computed is None:
            return
        self.last_error = computed.error
        self._landing = computed
        if now is not None:
            self._install(computed, now)

    def _install(self, computed: Computed, now: float) -> None:
        self._landing = None
        schedules = {
            j: Schedule(s.period, s.windows, origin=now) for j, s in computed.schedules.items()
        }
        self.installed = Installed(computed, now, schedules)

    def _current(self, view: SystemView) -> Installed | None:
        key = _key(view)
        landing = self._landing
        if landing is not None:
            if landing.key == key:
                self._install(landing, view.now)
            else:
                self._landing = None  # stale: the set changed while it was computed
        self._refresh(view)
        return self.installed if key is not None else None

    # -- the decision -------------------------------------------------------------------
    def allocate(self, view: SystemView) -> RowRates:
        installed = self._current(view)
        columns = view.columns
        demand = columns.demand
        cap = columns.cap
        self._lent = None
        # FairShare's water-filling (weights b_i), sums and ties in the stable order
        if not view.periodic:
            return water_levels(view.active, demand, cap, view.capacity)
        params = self._params()
        ids = columns.job_id
        rates: RowRates = []
        shared = []
        for r in view.active:
            schedule = installed.schedules.get(ids[r]) if installed is not None else None
            if schedule is not None:
                rates.append((r, schedule.mean_rate()))
            else:
                shared.append(r)
        reserve = view.capacity * params.reserve
        made: tuple[Loan, ...] = ()
        # Loans on a replica's own view only: a merged view's now is its exchange, not a time
        # on a clock its windows run by (docs/persched.md, "Not done yet").
        if installed is not None and shared and params.lend and view.observed:
            made = loans(installed.schedules, view.now, view, params.lend_grace)
        lent, schedules = borrowed(view, shared, reserve, made)
        rates.extend(lent)
        self._lent = _Lent(view, made, schedules, bool(shared))
        return rates

    def schedules(self, view: SystemView) -> Mapping[JobId, Schedule]:
        installed = self.installed if view.periodic else None
        if installed is None:
            return {}
        jobs = view.jobs
        mine = {j: s for j, s in installed.schedules.items() if j in jobs and jobs[j].active}
        lent = self._lent
        if lent is not None and lent.view is view:
            mine.update(lent.borrowed)
        return mine

    def between(self, view: SystemView) -> Mapping[JobId, Schedule]:
        """A periodic job between iterations holds its windows of the pattern in force, less
        the one it lends now (``policies/persched/lending.py``)."""
        installed = self.installed if view.periodic else None
        if installed is None:
            return {}
        held = dict(installed.schedules)
        lent = self._lent
        if lent is not None and lent.view is view:
            held.update((loan.lender, loan.kept) for loan in lent.loans)
        return held

    def period(self, view: SystemView) -> float | None:
        """Decide again when a loan may start or must end (only with jobs to lend to)."""
        installed = self.installed if view.periodic else None
        lent = self._lent
        params = self._params()
        if installed is None or lent is None or lent.view is not view or not lent.borrowers:
            return None
        if not params.lend:
            return None
        return next_change(installed.schedules, view.now, view, params.lend_grace)

    def _params(self) -> PerSchedParams:
        assert isinstance(self.params, PerSchedParams)
        return self.params


def _key(view: SystemView) -> Key | None:
    if not view.periodic:
        return None
    jobs = tuple(sorted((job_id, p.nodes, p.w, p.vol_io) for job_id, p in view.periodic.items()))
    return jobs, view.capacity, view.node_bandwidth


def predicted_iteration(installed: Installed, job_id: JobId) -> float:
    """T / n_per of ``job_id`` in the pattern in force (``inf`` if it has no instance)."""
    n = installed.computed.instances(job_id)
    result = installed.computed.result
    return math.inf if n == 0 or result is None else result.pattern.period / n
