"""One decision path: a trace replayed through the simulator and through the live
scheduler on a virtual clock gives identical rates at every decision, for every
registered policy.

The live side is the controller's own parts: a ``JobTable`` fed the trace's events
through its client-facing methods (sessions, posts, usage reports, completions), a
``PolicySlot`` and the ``Scheduler``, whose clock and timer are virtual. The
simulator side is ``simulator.trace.SimDecider``. Both are driven by the same fluid
stepping (``simulator.trace.replay``), so as long as their rates agree their
histories agree; the first decision where they differ fails the test.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from burstctl.controller.config import load_config
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobMeta, OpKind, SessionRecord
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.signal import Signal
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.registry import default_registry
from burstctl.policies.view import JobId
from burstctl.simulator.trace import (
    JobInfo,
    SimDecider,
    Step,
    TraceEvent,
    dump_trace,
    load_trace,
    replay,
)

REGISTRY = default_registry()
POLICIES = REGISTRY.names()
MiB = 1 << 20
CAPACITY = 400.0 * MiB
NODE_BANDWIDTH = 64.0 * MiB


class VirtualTimer:
    """The scheduler's clock and timer, advanced by the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self._due: list[tuple[float, int, _Handle]] = []
        self._count = 0

    def __call__(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(callback)
        self._count += 1
        heapq.heappush(self._due, (self.now + delay, self._count, handle))
        return handle

    def next_due(self) -> float | None:
        while self._due and self._due[0][2].cancelled:
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def advance(self, to: float) -> None:
        """Moves the clock to ``to`` and runs what falls due by then, in order."""
        self.now = to
        while (due := self.next_due()) is not None and due <= to:
            _, _, handle = heapq.heappop(self._due)
            handle.callback()


class _Handle:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Outbox:
    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        pass  # what reaches the wire is the session servicer's business, not this test's


class _Targets:
    """The peer exchange as the scheduler sees it: this replica's share of the split."""

    def __init__(self) -> None:
        self.local_targets: Mapping[JobId, float] | None = None
        self.updated = Signal()


class LiveDecider:
    """A lone replica's job table and scheduler, driven through the trace."""

    def __init__(self, policy: str, state_dir: Path) -> None:
        config = load_config(
            capacity=CAPACITY,
            node_bandwidth=NODE_BANDWIDTH,
            push_tolerance=0.0,
            release_delay=0.0,
            state_dir=state_dir,
        )
        self.timer = VirtualTimer()
        self.table = JobTable(
            self.timer, heartbeat_timeout=1e9, job_retention=1e9, demand_headroom=1.1
        )
        slot = PolicySlot(REGISTRY, StateStore(state_dir), (policy, {}), replica_id="r")
        self.targets = _Targets()
        self.scheduler = Scheduler(
            self.table, slot, config, peers=self.targets, clock=self.timer, timer=self.timer
        )
        self.sessions: dict[JobId, SessionRecord] = {}
        self.op: dict[JobId, int] = {}
        self.last = 0.0

    def post(self, t: float, job: JobId, info: JobInfo, volume: int) -> None:
        self.timer.advance(t)
        session = self.sessions.get(job)
        if session is None:
            meta = JobMeta(job, info.user, info.group, info.nodes, info.priority)
            session = self.sessions[job] = self.table.open_session(
                meta, f"client-{job}", "h", outbox=_Outbox()
            )
        self.op[job] = self.op.get(job, 0) + 1
        self.table.post(session, self.op[job], OpKind.WRITE, volume)

    def moved(self, t: float, job: JobId, nbytes: int) -> None:
        self.timer.advance(t)
        # a session paced below what it could use waits on its bucket: it says so
        self.table.usage(self.sessions[job], nbytes, 1, 0.01, t - self.last, True)

    def complete(self, t: float, job: JobId) -> None:
        self.timer.advance(t)
        assert self.table.complete(self.sessions[job], self.op[job])

    def set_targets(self, t: float, targets: Mapping[JobId, float] | None) -> None:
        self.timer.advance(t)
        self.targets.local_targets = targets
        self.targets.updated()

    def decide(self, t: float) -> tuple[dict[JobId, float], float | None]:
        self.timer.advance(t)
        self.last = t
        self.scheduler.rebalance()
        decision = self.scheduler.last
        assert decision is not None
        return decision.rates, self.timer.next_due()


def random_trace(seed: int) -> list[TraceEvent]:
    """Jobs of several users and sizes that alternate work and I/O phases, some of
    unknown volume (ended by the job), and now and then a share of a global split."""
    rng = random.Random(seed)
    events: list[TraceEvent] = []
    for j in range(rng.randint(2, 7)):
        job = f"job{j}"
        info = JobInfo(f"u{rng.randint(0, 2)}", f"g{rng.randint(0, 1)}", rng.choice([1, 2, 8]))
        t = rng.uniform(0.0, 2.0)
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.25:
                events.append(TraceEvent(t, "post", job, 0, info))
                t += rng.uniform(0.05, 1.5)
                events.append(TraceEvent(t, "end", job))
            else:
                events.append(TraceEvent(t, "post", job, rng.randint(1, 200) * MiB, info))
            t += rng.uniform(0.1, 3.0)
    for _ in range(rng.randint(0, 3)):
        share = {f"job{k}": rng.uniform(0.0, 200.0) * MiB for k in rng.sample(range(7), 3)}
        events.append(TraceEvent(rng.uniform(0.0, 8.0), "targets", targets=share))
    events.append(TraceEvent(rng.uniform(0.0, 8.0), "targets", targets=None))
    events.sort(key=lambda e: e.t)  # stable: a job's own events keep their order
    return events


def assert_same(live: list[Step], sim: list[Step]) -> None:
    for k, (a, b) in enumerate(zip(live, sim, strict=False)):
        assert a.t == b.t, f"decision {k}: at {a.t} live, {b.t} simulated"
        assert a.rates == b.rates, f"decision {k} at t = {a.t}: live {a.rates}, sim {b.rates}"
    assert len(live) == len(sim)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(6))
def test_live_scheduler_and_simulator_decide_alike(policy: str, seed: int, tmp_path: Path) -> None:
    trace = random_trace(seed)
    until = max(e.t for e in trace) + 20.0
    live = replay(trace, LiveDecider(policy, tmp_path), until=until)
    sim = replay(trace, SimDecider(REGISTRY.create(policy), CAPACITY, NODE_BANDWIDTH), until=until)
    assert_same(live, sim)
    assert len(sim) > 5 and any(step.rates for step in sim)  # it decided something


def test_periods_fire_at_the_same_times(tmp_path: Path) -> None:
    """PeriodicGreedyYield's δ: the live scheduler's timer and the simulator agree."""
    trace = random_trace(3)
    until = max(e.t for e in trace) + 5.0
    policy = REGISTRY.create("periodic-greedy-yield", {"delta": 0.25})
    sim = replay(trace, SimDecider(policy, CAPACITY, NODE_BANDWIDTH), until=until)
    live_decider = LiveDecider("fair-share", tmp_path)
    live_decider.scheduler.slot.switch("periodic-greedy-yield", {"delta": 0.25})
    live = replay(trace, live_decider, until=until)
    assert_same(live, sim)
    # at least one decision came from the period alone (no event at that time)
    event_times = {e.t for e in trace}
    assert any(s.t not in event_times for s in sim)


def test_a_recorded_trace_round_trips_and_replays(tmp_path: Path) -> None:
    trace = random_trace(1)
    path = tmp_path / "trace.jsonl"
    dump_trace(trace, path)
    assert load_trace(path) == trace
    until = max(e.t for e in trace) + 10.0
    policy = "group-user-size-fair"
    live = replay(load_trace(path), LiveDecider(policy, tmp_path), until=until)
    sim = replay(trace, SimDecider(REGISTRY.create(policy), CAPACITY, NODE_BANDWIDTH), until=until)
    assert_same(live, sim)


class _Unblended(SimDecider):
    """A decision path that forgets the split's targets."""

    def set_targets(self, t: float, targets: Mapping[JobId, float] | None) -> None:
        pass


def test_a_difference_in_the_decision_path_is_seen(tmp_path: Path) -> None:
    """The comparison can fail: a side that does not blend the split's targets is caught."""
    a, b = JobInfo("u", "g", 8), JobInfo("v", "g", 8)
    trace = [
        TraceEvent(0.0, "post", "a", 900 * MiB, a),
        TraceEvent(0.0, "post", "b", 900 * MiB, b),
        TraceEvent(0.5, "targets", targets={"a": 100.0 * MiB, "b": 300.0 * MiB}),
    ]
    live = replay(trace, LiveDecider("fair-share", tmp_path), until=5.0)
    unblended = _Unblended(REGISTRY.create("fair-share"), CAPACITY, NODE_BANDWIDTH)
    with pytest.raises(AssertionError, match=r"decision 1 at t = 0\.5"):
        assert_same(live, replay(trace, unblended, until=5.0))
    assert live[1].rates == {"a": 100.0 * MiB, "b": 300.0 * MiB}
