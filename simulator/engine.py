"""The fluid discrete-event loop: runs one policy on one prepared window.

Owns the event loop of the reference simulator
(``shared/papers/bandwidth-sharing-reference-simulator.md`` §4, §9) and the
metrics at T (§10; paper eqs. 8–10). Between two decisions every rate is
constant, so the next event is the first phase completion, the policy's own
period (PeriodicGreedyYield's δ) or T. At each decision the engine builds a
``SystemView`` of the applications in I/O and calls the very policy objects
the controller uses (``burstctl.policies``); it never imports the controller.

Units are normalised: B = 1, b_i = min(bw, B)/B, I/O volumes are volume/B and
a phase's full-speed duration is volume/b_i. Progress P grows at rate 1 in
work and β/b_i in I/O (eq. 6's numerator).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from burstctl.policies.base import Policy
from burstctl.policies.registry import PolicyRegistry, default_registry
from burstctl.policies.view import JobView, SystemView
from burstctl.simulator.instance import Window

# Constants of the reference (§ "Constants").
EPS = 1e-10  # ε: rate tolerance, loop end
EPS2 = 1e-9  # ε₂: same-time steps at T, forced switch in v2
DONE = 1e-7  # a phase with q < 1e-7 completes; q < −1e-7 is an error
MAX_REPEATS = 10  # decisions allowed at one instant before giving up
END_TOLERANCE = 1e-8

SWITCH_POLICY = "fair-share"  # v2 runs FairShare on [0, T/2) (§9)
SIM_USER = "sim"
# The order _job_view passes JobView's fields in (a unit test pins it).
JOB_VIEW_FIELDS = (
    "job_id",
    "user",
    "group",
    "nodes",
    "priority",
    "cap",
    "demand",
    "posted_at",
    "volume",
    "remaining",
    "moved",
    "released_at",
    "progress",
    "last_work",
    "mean_volume",
    "index",
)

Windows = Literal["v1", "v2"]


class SimulationError(RuntimeError):
    """The run cannot go on: a policy broke a rate bound or time stopped advancing."""


@dataclass(frozen=True, slots=True)
class SimResult:
    """Metrics of one run at T (§10), plus what identifies the run."""

    policy: str
    instance: str | None
    windows: str
    applications: int  # m
    horizon: float  # T
    delta: float  # δ of the window (used by policies with a ``delta`` parameter)
    min_yield: float  # eq. (8), capped at 1, whole history
    efficiency: float  # eq. (10), weighted by b_i
    utilization: float  # eq. (9), p_i = 1
    utilization_reference: float  # the reference's integer-truncated Utilization (§10)
    pressure: float  # load L (eq. 11)
    events: int  # decisions taken (policy calls)
    wall_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def create_policy(name: str, window: Window, registry: PolicyRegistry | None = None) -> Policy:
    """``registry.create(name)``; a policy whose ``Params`` has ``delta`` gets the window's δ."""
    reg = registry if registry is not None else default_registry()
    cls = reg.get(name)
    params = {"delta": window.delta} if "delta" in cls.Params.model_fields else {}
    return reg.create(name, params)


def simulate(
    window: Window,
    policy: Policy | str,
    *,
    windows: Windows = "v1",
    registry: PolicyRegistry | None = None,
    instance: str | None = None,
    seed: int = 0,
) -> SimResult:
    """Runs ``policy`` on ``window`` and returns the metrics at T."""
    reg = registry if registry is not None else default_registry()
    strategy = create_policy(policy, window, reg) if isinstance(policy, str) else policy
    if windows not in ("v1", "v2"):
        raise ValueError(f"windows must be 'v1' or 'v2', got {windows!r}")
    started = time.perf_counter()
    run = _Run(window, strategy, reg.create(SWITCH_POLICY) if windows == "v2" else None, seed)
    run.loop()
    wall = time.perf_counter() - started
    min_yield, efficiency, utilization, utilization_ref = run.metrics()
    return SimResult(
        policy=strategy.name,
        instance=instance,
        windows=windows,
        applications=len(window.apps),
        horizon=window.horizon,
        delta=window.delta,
        min_yield=min_yield,
        efficiency=efficiency,
        utilization=utilization,
        utilization_reference=utilization_ref,
        pressure=window.load,
        events=run.events,
        wall_seconds=wall,
    )


class _Run:
    """State of one run; per-application state lives in parallel lists (speed)."""

    def __init__(self, window: Window, policy: Policy, warmup: Policy | None, seed: int) -> None:
        apps = window.apps
        m = len(apps)
        self.window = window
        self.horizon = window.horizon  # T
        self.policy = policy
        self.warmup = warmup  # v2: FairShare until t_c
        self.seed = seed
        width = len(str(max(m - 1, 0)))
        # Zero-padded indices: policies break ties by job id, the reference by index.
        self.ids = [f"{i:0{width}d}" for i in range(m)]
        self.cap = [a.cap for a in apps]  # b_i
        self.tau = [a.released_at for a in apps]  # τ_i
        self.values = [[p.value for p in a.phases] for a in apps]
        self.io = [a.phases[0].io for a in apps]
        self.phase = [0] * m
        self.remaining = [v[0] for v in self.values]  # Q
        self.progress = [a.progress for a in apps]  # P
        self.posted = [a.posted_at for a in apps]  # R
        self.beta = [0.0] * m
        self.work_done = [0.0] * m  # W^(done) of completed work, from t = 0 (or s)
        self.work_began = [0.0] * m  # start of the current work phase (valid in work)
        self.last_work = [0.0] * m
        self.io_total = [0.0] * m  # completed I/O volumes (for the mean)
        self.io_count = [0] * m
        self.credit = [0] * m  # U of the reference (§10), an integer
        self.views: list[JobView | None] = [None] * m  # cache while Q and P do not move
        self.events = 0
        self.t = 0.0
        # v1: s = 0, t_c = 0; v2: t_c = T/2, s = the switch time (§4, §9)
        self.switch_at = self.horizon / 2 if warmup is not None else 0.0  # t_c
        self.start = 0.0  # s
        self.switched = warmup is None
        self.base_efficiency = self._weighted_progress()  # E₀

    def _weighted_progress(self) -> float:
        return math.fsum(b * p for b, p in zip(self.cap, self.progress, strict=True))

    def _job_view(self, i: int) -> JobView:
        volume = self.values[i][self.phase[i]] if self.phase[i] < len(self.values[i]) else 0.0
        count = self.io_count[i]
        q = self.remaining[i]
        b = self.cap[i]
        # Positional (twice as fast as keywords); tests pin JobView's field order.
        return JobView(
            self.ids[i],  # job_id
            SIM_USER,  # user
            SIM_USER,  # group
            1,  # nodes
            1.0,  # priority
            b,  # cap
            b,  # demand
            self.posted[i],  # posted_at R
            volume,  # volume
            q,  # remaining Q
            volume - q,  # moved
            self.tau[i],  # released_at τ
            self.progress[i],  # progress P
            self.last_work[i],  # last_work
            self.io_total[i] / count if count else 0.0,  # mean_volume
            i,  # index
        )

    def _decide(self, policy: Policy, io_apps: list[int]) -> float:
        """Allocates β to the applications in I/O; returns t_d (the policy's next tick)."""
        t = self.t
        views = self.views
        io = self.io
        jobs: dict[str, JobView] = {}
        for i in range(len(views)):
            if io[i]:
                v = views[i]
                if v is None:
                    v = views[i] = self._job_view(i)
                jobs[v.job_id] = v
                io_apps.append(i)
        view = SystemView(
            now=t, capacity=1.0, node_bandwidth=1.0, jobs=jobs, seed=self.seed, horizon=self.horizon
        )
        rates = policy.allocate(view)
        period = policy.period(view)
        self.events += 1
        beta = self.beta
        for job_id, v in jobs.items():
            rate = float(rates.get(job_id, 0.0))
            if not (-EPS <= rate <= v.cap + EPS):  # also rejects NaN
                raise SimulationError(
                    f"{policy.name} gave application {v.index} rate {rate} outside"
                    f" [0, b_i = {v.cap}] at t = {t}"
                )
            beta[v.index] = rate if rate > 0.0 else 0.0
        if period is None:
            return self.horizon
        if not period > 0.0:
            raise SimulationError(f"{policy.name} asked for a period {period} <= 0 at t = {t}")
        return t + period

    def loop(self) -> None:
        T = self.horizon
        io = self.io
        cap = self.cap
        q_left = self.remaining
        prog = self.progress
        beta = self.beta
        views = self.views
        m = len(io)
        inf = math.inf
        # t + Q over work applications, kept up to date by the advance pass below
        work_next = min((q_left[i] for i in range(m) if not io[i]), default=inf)
        counter = 0
        while self.t < T - EPS:
            t = self.t
            if not self.switched and t > self.switch_at - EPS:
                self._switch()
            policy = self.policy if self.switched else self.warmup
            assert policy is not None
            io_apps: list[int] = []
            t_next = min(T, self._decide(policy, io_apps), work_next)
            for i in io_apps:  # first I/O completion at the new rates; β = 0: never
                b = beta[i]
                if b > 0.0:
                    c = t + q_left[i] / b
                    if c < t_next:
                        t_next = c
            if not self.switched and t < self.switch_at - EPS2 and t_next > self.switch_at + EPS2:
                t_next = self.switch_at  # v2: an event is forced at t_c
            dt = t_next - t
            work_next = inf
            for i in range(m):
                if io[i]:
                    b = beta[i]
                    if b != 0.0:
                        q_left[i] -= dt * b
                        prog[i] += dt * b / cap[i]
                        views[i] = None
                    q = q_left[i] / cap[i]
                    if q >= DONE:
                        continue
                    self._check_done(i, q, t_next)
                    self._complete(i, t, t_next)  # now in work: fall through
                    q = q_left[i]
                else:
                    q = q_left[i] - dt
                    q_left[i] = q
                    prog[i] += dt
                    if q < DONE:
                        self._check_done(i, q, t_next)
                        self._complete(i, t, t_next)
                        if io[i]:
                            continue
                        q = q_left[i]
                c = t_next + q  # the next step's t + Q for a work phase
                if c < work_next:
                    work_next = c
            if t_next == t:
                counter += 1
                if t + EPS2 > T:
                    break
                if counter > MAX_REPEATS:
                    raise SimulationError(f"time does not advance at t = {t}")
            else:
                self.t = t_next
                counter = 0
        if abs(self.t - T) > END_TOLERANCE:
            raise SimulationError(f"the run ended at {self.t}, not at T = {T}")

    @staticmethod
    def _check_done(i: int, q: float, now: float) -> None:
        if q < -DONE:
            raise SimulationError(f"application {i} overshot its phase by {-q} at t = {now}")

    def _switch(self) -> None:
        self.switched = True
        self.start = self.t  # s
        self.base_efficiency = self._weighted_progress()  # E₀ at the switch
        # eq. (9) counts W^(done)(T) − W^(done)(s): restart the count at s
        self.work_done = [0.0] * len(self.work_done)
        self.work_began = [self.t] * len(self.work_began)

    def _complete(self, i: int, step_start: float, now: float) -> None:
        """Phase completion at ``now`` in the step that began at ``step_start`` (§4 step 4)."""
        k = self.phase[i]
        values = self.values[i]
        length = values[k] if k < len(values) else 0.0  # ℓ, the kept length
        if self.io[i]:
            self.io_total[i] += length
            self.io_count[i] += 1
        else:
            self.last_work[i] = length
            self.work_done[i] += now - self.work_began[i]
            self._credit(i, step_start, length)
        k += 1
        self.phase[i] = k
        self.posted[i] = now  # R
        if k >= len(values):
            # Kept phases sum to T only up to rounding, so an application can run out
            # of phases a few ulps before T (seen: 9e-10 s at T = 1.8e6). The reference
            # would read a missing value as 0 and loop on zero-length phases; here the
            # application computes until T instead, which no metric can tell apart.
            self.io[i] = False
            self.remaining[i] = math.inf
            self.work_began[i] = now
            self.views[i] = None
            return
        self.remaining[i] = values[k]
        self.io[i] = not self.io[i]
        if not self.io[i]:
            self.work_began[i] = now
        self.views[i] = None

    def _credit(self, i: int, step_start: float, length: float) -> None:
        # The reference's U: an integer, credited from the step's start (§10, quirk 1).
        t_c = self.switch_at
        if step_start > t_c:
            if step_start - length > t_c:
                self.credit[i] = int(self.credit[i] + length)
            else:
                self.credit[i] = int(self.credit[i] + step_start - t_c)

    def metrics(self) -> tuple[float, float, float, float]:
        """(MinYield, Efficiency, Utilization, reference Utilization) at T (§10)."""
        T = self.horizon
        s = self.start
        m = len(self.cap)
        # eq. (8): y_i(T) = P_i(T)/(T − τ_i), capped at 1 as in the reference
        min_yield = min(
            1.0, min(p / (T - tau) for p, tau in zip(self.progress, self.tau, strict=True))
        )
        span = T - s
        # eq. (10), weighted by b_i (reference quirk 2; = p_i on synthetic traces)
        efficiency = (self._weighted_progress() - self.base_efficiency) / (span * sum(self.cap))
        # eq. (9) with p_i = 1: work done in [s, T] over (T − s)·m
        work = math.fsum(
            w if self.io[i] else w + T - self.work_began[i] for i, w in enumerate(self.work_done)
        )
        utilization = work / (span * m)
        credit = 0
        for i in range(m):
            u = self.credit[i]
            k = self.phase[i]
            if not self.io[i] and k < len(self.values[i]):  # in work at T: ℓ − Q of it done
                length = self.values[i][k]
                q = self.remaining[i]
                u = int(T - s) if T - length + q < s else int(u + length - q)
            credit += u
        return min_yield, efficiency, utilization, credit / (span * m)
