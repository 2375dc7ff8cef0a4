"""One decision path: the paper's event loop and the live scheduler decide alike.

A window of applications (alternating work and I/O phases, the input of the
bandwidth-sharing paper's simulator, [BWS] §6) runs through the simulator's
event loop (``simulator.bws.fluid.Run``) with every registered policy. At each of
its decisions the live controller's own parts are brought to the same moment on
a virtual clock: a ``JobTable`` hears each application's phases as a client
would say them (a session per job, an operation posted at each I/O phase with
its volume, Usage reports of the bytes the run moved, the completion), and its
``Scheduler`` decides. Then:

- the per-job rates of the live decision equal the run's, at every decision;
- the rates pushed to each session are those the push rules give for the run's
  rates: a change within the push tolerance is not pushed, 0 ↔ non-zero always
  is, a job whose operation completed keeps its rate for the release delay.

Demand varies as it does live: half the jobs always wait on their bucket (their
demand is b_i), the others report what they moved without waiting, so the table
sets their demand to the measured rate times the headroom; the run's policy
reads the same demand in its view.

Units: the run has B = 1; live, B is 2³⁰ bytes/s and every I/O volume a whole
number of MiB, so scaling between the two is exact. What is not exact is that
live the bytes moved are whole bytes and the clock-derived quantities (W^(done),
P_i) are computed from event times rather than stepped: the two views agree to a
relative 1e-6 (checked column by column), and so do the rates, except where a
policy's order turns on values equal in exact arithmetic (two jobs never slowed
both have a yield of exactly 1 in the run, and 1 ± rounding live): there the
policy, as it was before the decision, must give on the live inputs exactly the
live rates. The live controller knows no horizon T, so the run's view is given
none either (the run still ends at T).
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.clock import VirtualTimer

from burstctl.common.limits import MIN_RATE
from burstctl.controller.config import load_config
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobMeta, OpKind, SessionRecord
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.base import Policy
from burstctl.policies.decision import Decision, decide
from burstctl.policies.registry import default_registry
from burstctl.policies.schedule import Schedule
from burstctl.policies.view import FIELDS, JobId, JobView, RowRates, SystemView
from burstctl.simulator.bws.fluid import SIM_USER, Run, app_ids
from burstctl.simulator.bws.instance import Phase, Window, WindowedApp

REGISTRY = default_registry()
POLICIES = REGISTRY.names()
B = float(1 << 30)  # live capacity, bytes/s: a power of two (exact scaling)
MiB = 1 << 20
PUSH_TOLERANCE = 0.02
RELEASE_DELAY = 0.05
HEADROOM = 1.25
REL = 1e-6


def window(seed: int, cap: float) -> Window:
    """3 to 8 applications released at 0, each 3 to 7 phases (I/O or work first), every
    I/O volume a whole number of MiB at B = 2³⁰ bytes/s."""
    rng = random.Random(seed)
    apps = []
    longest = 0.0
    for k in range(rng.randint(3, 8)):
        io = rng.random() < 0.5
        phases = []
        solo = 0.0
        for _ in range(rng.randint(3, 7)):
            if io:
                value = rng.randint(16, 400) / 1024  # volume / B: a whole number of MiB
                solo += value / cap
            else:
                value = rng.uniform(0.05, 0.6)
                solo += value
            phases.append(Phase(io, value, False))
            io = not io
        longest = max(longest, solo)
        apps.append(WindowedApp(f"a{k}", cap, 0.0, 0.0, 0.0, 1.0, tuple(phases), solo, len(phases)))
    # Long enough for contention to play out: every phase ends well before T.
    horizon = 3.0 * longest * len(apps)
    return Window(horizon, tuple(apps), sum(a.solo_phases for a in apps), 1.0, 1.0, 1.0)


@dataclass
class Recorder:
    """A session's outbox: the rates pushed to it, with the (virtual) time."""

    timer: VirtualTimer
    pushes: list[tuple[float, float]] = field(default_factory=list)

    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        self.pushes.append((self.timer.now, rate))


class Live:
    """A lone replica (job table, policy slot, scheduler) on a virtual clock, told each
    application's phases as its client would tell them."""

    def __init__(self, policy: str, window: Window, state_dir: Path, push_tolerance: float) -> None:
        cap = window.apps[0].cap
        config = load_config(
            capacity=B,
            node_bandwidth=cap * B,  # one node per job: b_i = cap · B
            push_tolerance=push_tolerance,
            release_delay=RELEASE_DELAY,
            state_dir=state_dir,
        )
        self.timer = VirtualTimer()
        self.table = JobTable(
            self.timer, heartbeat_timeout=1e9, job_retention=1e9, demand_headroom=HEADROOM
        )
        slot = PolicySlot(REGISTRY, StateStore(state_dir), (policy, {}), replica_id="r")
        self.scheduler = Scheduler(self.table, slot, config, clock=self.timer, timer=self.timer)
        self.ids = app_ids(len(window.apps))
        self.outboxes = [Recorder(self.timer) for _ in self.ids]
        self.sessions: list[SessionRecord] = [
            self.table.open_session(
                JobMeta(job_id, SIM_USER, SIM_USER, 1, 1.0), f"client-{job_id}", "h", outbox=out
            )
            for job_id, out in zip(self.ids, self.outboxes, strict=True)
        ]
        m = len(self.ids)
        self.open_phase: list[int | None] = [None] * m  # the run's phase the open op is
        self.volume = [0] * m  # bytes of the open operation
        self.reported = [0] * m  # bytes of it reported so far
        self.reported_at = [0.0] * m
        self.completed_at: list[float | None] = [None] * m
        self.op_id = [0] * m

    def catch_up(self, run: Run, now: float) -> None:
        """Brings the table to the run's state at ``now``, the time of its decision: Usage
        reports of the bytes its open operations moved, then completions and posts of the
        phases that ended and began."""
        self.timer.run_to(now)
        for i, session in enumerate(self.sessions):
            k, io = run.phase[i], run.io[i]
            open_k = self.open_phase[i]
            if open_k is not None:
                ongoing = io and open_k == k
                left = max(0, min(self.volume[i], round(run.remaining[i] * B))) if ongoing else 0
                self._report(i, self.volume[i] - left, now)
                if not ongoing:
                    assert self.table.complete(session, self.op_id[i])
                    self.open_phase[i] = None
                    self.completed_at[i] = now
            if io and self.open_phase[i] is None:
                self.op_id[i] += 1
                self.volume[i] = round(run.values[i][k] * B)
                self.table.post(session, self.op_id[i], OpKind.WRITE, self.volume[i])
                self.open_phase[i] = k
                self.reported[i] = 0
                self.reported_at[i] = now

    def _report(self, i: int, moved: int, now: float) -> None:
        interval = now - self.reported_at[i]
        if interval <= 0.0:
            return
        session = self.sessions[i]
        # Even jobs always want more than they get (they wait on their bucket); odd ones
        # use what they are given and wait only when given nothing.
        waiting = i % 2 == 0 or not session.rate
        self.table.usage(
            session, moved - self.reported[i], 1, interval if waiting else 0.0, interval, waiting
        )
        self.reported[i] = moved
        self.reported_at[i] = now

    def decide(self) -> Decision:
        self.scheduler.rebalance()
        decision = self.scheduler.last
        assert decision is not None
        return decision


@dataclass
class Step:
    t: float
    run: dict[JobId, float]  # the run's rates, B = 1
    live: dict[JobId, float]  # the live decision's, in B
    in_s: frozenset[JobId]  # S(t): the jobs with an open operation
    below_cap: int  # jobs of S(t) whose demand is below b_i
    inputs: list[str]  # the columns where the two views differ by more than REL
    explained: bool  # the rates differ, and the policy on the live inputs gives the live ones


# What a policy reads in bytes (scaled by B between the two sides); the rest is seconds,
# counts and names.
IN_BYTES = ("cap", "demand", "volume", "remaining", "moved", "mean_volume")


def scaled(job: JobView) -> JobView:
    """A live row in the run's units (B = 1)."""
    return job._replace(
        **{
            name: None if getattr(job, name) is None else getattr(job, name) / B
            for name in IN_BYTES
        }
    )


def differences(run: JobView, live: JobView) -> list[str]:
    """The fields of a row where the run's and the live (scaled) values differ."""
    out = []
    for name, a, b in zip(FIELDS, run, live, strict=True):
        if isinstance(a, float) and isinstance(b, float):
            if not math.isclose(a, b, rel_tol=REL, abs_tol=REL):
                out.append(f"{run.job_id}.{name}: {a} {b}")
        elif a != b:
            out.append(f"{run.job_id}.{name}: {a!r} {b!r}")
    return out


class Mirror(Policy):
    """The run's policy, seen through the live controller: at each of the run's
    decisions it catches the live side up, lets it decide, gives the run's view the
    demand the live table derived, then decides with the policy on the run's view and
    proposes that decision (already enforced: the run's own enforcing keeps it)."""

    name = "mirror"

    def __init__(self, inner: Policy, live: Live) -> None:
        super().__init__()
        self.inner = inner
        self.live = live
        self.run: Run | None = None
        self.steps: list[Step] = []
        self._decision: Decision | None = None

    def allocate(self, view: SystemView) -> RowRates:
        run = self.run
        assert run is not None
        view.horizon = None  # type: ignore[misc]  # (see the module docstring)
        live = self.live
        live.catch_up(run, view.now)
        decision = live.decide()
        columns = run.columns
        demand = columns.demand
        for r in view.rows:
            job = decision.view.jobs[columns.job_id[r]]
            if demand[r] != job.demand / B:
                demand[r] = job.demand / B  # type: ignore[index]
                columns.views[r] = None  # its JobView, if one was built, is stale
        rows = {j: scaled(v) for j, v in decision.view.jobs.items()}
        inputs = [
            d for r in view.rows for d in differences(columns.job(r), rows[columns.job_id[r]])
        ]
        before = copy.deepcopy(self.inner)
        mine = self._decision = decide(self.inner, view)
        rates = {j: rate / B for j, rate in decision.rates.items()}
        explained = False
        if not same_rates(mine.rates, rates):
            # Values equal in exact arithmetic (two yields of exactly 1 in the run) are
            # equal live only to rounding, and an order may turn on them. Explained if the
            # policy, as it was, decides on the live inputs what the live side decided.
            on_live = SystemView(
                now=view.now, capacity=1.0, node_bandwidth=1.0, jobs=rows, seed=view.seed
            )
            explained = same_rates(decide(before, on_live).rates, rates)
        self.steps.append(
            Step(
                view.now,
                mine.rates,
                rates,
                frozenset(decision.view.jobs),
                sum(j.demand < j.cap for j in decision.view.jobs.values()),
                inputs,
                explained,
            )
        )
        return list(mine.served)

    def schedules(self, view: SystemView) -> dict[JobId, Schedule]:
        assert self._decision is not None
        return dict(self._decision.schedules)

    def period(self, view: SystemView) -> float | None:
        assert self._decision is not None
        return self._decision.period


def run_both(
    policy: str,
    window: Window,
    state_dir: Path,
    *,
    run_policy: str | None = None,
    push_tolerance: float = PUSH_TOLERANCE,
) -> tuple[Mirror, Live]:
    """Runs ``window`` through the event loop (with ``run_policy``, by default the same
    policy) and the live scheduler (``policy``) side by side."""
    live = Live(policy, window, state_dir, push_tolerance)
    mirror = Mirror(REGISTRY.create(run_policy or policy), live)
    run = mirror.run = Run(window, mirror, None, 0)
    run.columns.demand = list(run.cap)  # its own column: the live table's demand goes in
    run.loop()
    return mirror, live


def same_rates(run: dict[JobId, float], live: dict[JobId, float]) -> bool:
    jobs = {j for j, r in run.items() if r >= MIN_RATE / B} | {
        j for j, r in live.items() if r >= MIN_RATE / B
    }
    return all(
        math.isclose(run.get(j, 0.0), live.get(j, 0.0), rel_tol=REL, abs_tol=REL) for j in jobs
    )


@dataclass
class Held:
    """How often the push rules kept a session's rate: a change within the tolerance,
    a completed job's rate kept for the release delay."""

    tolerance: int = 0
    release: int = 0


def expected_pushes(
    steps: list[Step], job: JobId, live: Live, held_back: Held
) -> list[tuple[float, float]]:
    """The push rules (docs/protocol.md) applied to the live decisions' rates for
    ``job``'s one session (equal to the run's, checked apart): what the scheduler should
    have pushed, when."""
    i = live.ids.index(job)
    held: float | None = None
    idle_since: float | None = None
    pushes = []
    was_in = False
    for step in steps:
        if was_in and job not in step.in_s:
            idle_since = step.t  # its operation completed at this decision's time
        was_in = job in step.in_s
        if job in step.in_s:
            rate = step.live.get(job, 0.0) * B
            rate = 0.0 if rate < MIN_RATE else rate
            if held == rate:
                continue
            if held and rate and abs(rate - held) <= PUSH_TOLERANCE * held:
                held_back.tolerance += 1
                continue
        elif held is None:
            rate = 0.0  # a new session is told 0
        elif held and idle_since is not None and step.t - idle_since >= RELEASE_DELAY:
            rate = 0.0
        else:
            held_back.release += bool(held)
            continue
        held = rate
        pushes.append((step.t, rate))
    assert live.completed_at[i] is None or idle_since is not None
    return pushes


def assert_equivalent(mirror: Mirror, live: Live) -> Held:
    """Fails at the first decision, or the first push, where the two differ; how often the
    push rules held a rate back."""
    steps = mirror.steps
    held_back = Held()
    for k, step in enumerate(steps):
        assert not step.inputs, f"decision {k} at t = {step.t}: the views differ: {step.inputs}"
        assert step.explained or same_rates(step.run, step.live), (
            f"decision {k} at t = {step.t}: run {step.run}, live {step.live}"
        )
    for job, out in zip(live.ids, live.outboxes, strict=True):
        want = expected_pushes(steps, job, live, held_back)
        got = out.pushes
        assert [t for t, _ in got] == [t for t, _ in want], f"job {job}: pushed at other times"
        for (t, a), (_, b) in zip(got, want, strict=True):
            assert math.isclose(a, b, rel_tol=REL, abs_tol=REL * B), f"job {job} at {t}: {a} {b}"
    return held_back


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("seed", "cap"), [(1, 1.0), (4, 0.5), (5, 0.25)])
def test_the_paper_event_loop_and_the_live_scheduler_decide_alike(
    policy: str, seed: int, cap: float, tmp_path: Path
) -> None:
    mirror, live = run_both(policy, window(seed, cap), tmp_path)
    assert_equivalent(mirror, live)
    steps = mirror.steps
    assert sum(bool(s.run) for s in steps) > 5  # it decided something
    # a difference explained by rounding (a tie) is the exception
    assert sum(s.explained for s in steps) <= len(steps) // 4, "mostly ties"


def test_the_trace_varies_demand_and_exercises_the_push_rules(tmp_path: Path) -> None:
    """What the comparison is meant to cover happens in it: demand below b_i, rate
    changes within the push tolerance, completed jobs kept at their rate."""
    mirror, live = run_both("deficit-com", window(5, 0.25), tmp_path)
    held_back = assert_equivalent(mirror, live)
    assert sum(s.below_cap for s in mirror.steps) > 0
    assert held_back.tolerance > 0 and held_back.release > 0


def test_a_difference_is_seen(tmp_path: Path) -> None:
    """The comparison can fail: another policy live, or other push rules, are caught."""
    trace = window(4, 0.5)
    mirror, live = run_both("fair-share", trace, tmp_path / "a", run_policy="size-fair")
    assert_equivalent(mirror, live)  # the same rates: one node per job
    mirror, live = run_both("fair-share", trace, tmp_path / "b", run_policy="fcfs")
    with pytest.raises(AssertionError, match=r"decision \d+ at t = "):
        assert_equivalent(mirror, live)
    mirror, live = run_both("fair-share", trace, tmp_path / "c", push_tolerance=0.0)
    with pytest.raises(AssertionError, match="pushed at other times"):
        assert_equivalent(mirror, live)
