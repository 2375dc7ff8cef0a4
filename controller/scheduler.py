"""The scheduler: turns job-table events into allocations and pushes them.

Events (post, completion, usage/demand change, session open/close, policy
switch, peer exchange, periodic tick) only mark the table dirty; one task then
decides for all of them at once, so a burst of events costs one decision. A
decision is: build the ``SystemView``, take the one decision path
(``policies.decision.decide``: the policy proposes, the engine enforces, blended
with this replica's part of the global split when it has peers), split each
job's rate over its sessions, and push an ``Allocation`` to every session whose
rate changed. Leases are renewed at half their length.

Time comes in through ``clock`` and ``timer`` (a policy's period, a session's
release delay), so a test can drive the scheduler on a virtual clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from burstctl.controller.config import ControllerConfig
from burstctl.controller.jobs import JobTable, SessionState
from burstctl.controller.signal import Signal
from burstctl.controller.state import PolicySlot
from burstctl.policies.decision import Decision, decide
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId

log = logging.getLogger(__name__)
decision_log = logging.getLogger("burstctl.decisions")


@dataclass(slots=True)
class SchedulerStats:
    decisions: int = 0
    pushes: int = 0  # allocations sent, renewals included
    pushes_start: int = 0  # from nothing or 0 to a rate: the job may move
    pushes_stop: int = 0  # to 0
    renewals: int = 0
    clamped: int = 0
    # seconds per decision (policy + clamp + split + push), most recent first-in
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Timer(Protocol):
    """Calls ``callback`` once, ``delay`` seconds from now, on the replica's loop."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable: ...


class LoopTimer:
    """The running asyncio loop's timer: the daemon's."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay, callback)


class GlobalTargets(Protocol):
    """This replica's part of the global split (the peer exchange), when it has one."""

    @property
    def local_targets(self) -> Mapping[JobId, float] | None: ...

    @property
    def updated(self) -> Signal: ...


class Scheduler:
    """Owns the decision loop of one replica."""

    def __init__(
        self,
        table: JobTable,
        slot: PolicySlot,
        config: ControllerConfig,
        *,
        peers: GlobalTargets | None = None,
        clock: Callable[[], float] = time.monotonic,
        timer: Timer | None = None,
        observe_latency: Callable[[float], None] | None = None,
    ) -> None:
        self.table = table
        self.slot = slot  # the active policy: its one live instance decides
        self.config = config
        self._peers = peers
        self._clock = clock
        self._timer: Timer = timer if timer is not None else LoopTimer()
        self._observe_latency = observe_latency
        self._dirty = asyncio.Event()
        self.stats = SchedulerStats()
        self.last: Decision | None = None  # the latest decision, as enforced
        self._nonzero: set[SessionState] = set()  # sessions whose pushed rate is > 0
        self._recheck_pending = False
        self._round = 0  # decision number; sessions served in a decision carry it
        self._period_timer: Cancellable | None = None
        table.changed.connect(self.request)
        slot.changed.connect(self.request)
        if peers is not None:
            peers.updated.connect(self.request)

    def request(self) -> None:
        """Asks for a decision soon; cheap, called at every event."""
        self._dirty.set()

    async def run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                self.rebalance()
            except Exception:  # a policy bug must not stop the controller
                log.exception("decision failed; keeping previous allocations")
            # Let pending events land so the next decision covers all of them.
            await asyncio.sleep(0)

    async def tick(self, period: float) -> None:
        """Periodic decisions (PeriodicGreedyYield's δ); only when configured."""
        while True:
            await asyncio.sleep(period)
            self.request()

    async def renew_leases(self) -> None:
        lease = self.config.lease
        while True:
            await asyncio.sleep(lease / 4)
            now = self._clock()
            for session in list(self.table.sessions.values()):
                if session.rate is not None and now - session.pushed_at >= lease / 2:
                    self._push(session, session.rate, now)
                    self.stats.renewals += 1

    def rebalance(self) -> None:
        started = time.perf_counter()
        policy = self.slot.policy
        view = self.table.view(self.config.capacity, self.config.node_bandwidth)
        targets = self._peers.local_targets if self._peers is not None else None
        decision = self.last = decide(policy, view, targets)
        rates = decision.rates
        if decision.clamped:
            self.stats.clamped += 1
            log.warning("policy %s proposed an infeasible allocation; clamped", policy.name)
        now = self._clock()
        self._round += 1
        stamp = self._round
        jobs = self.table.jobs
        offer = self._offer
        tolerance = self.config.push_tolerance
        for job_id in view.jobs:
            rate = rates.get(job_id, 0.0)
            sessions = jobs[job_id].sessions
            if len(sessions) == 1:
                for s in sessions.values():  # _offer inlined: this loop is the hot one
                    s.decided = stamp
                    old = s.rate
                    if old == rate or (old and rate and abs(rate - old) <= tolerance * old):
                        continue
                    self._push(s, rate, now)
            else:  # split the job's rate over its sessions by their demand
                cap = view.jobs[job_id].cap
                demand = {
                    sid: s.demand(cap, self.table.demand_headroom) for sid, s in sessions.items()
                }
                split = water_fill(demand, dict.fromkeys(demand, 1.0), rate)
                for sid, s in sessions.items():
                    s.decided = stamp
                    offer(s, split[sid], now)
        # Sessions outside S(t) that still hold a rate, and new ones, get 0. A
        # session whose operation just completed keeps its rate for the release
        # delay: it cannot use it without posting again (which triggers a new
        # decision), and a job that cycles quickly is spared two pushes per cycle.
        release = self.config.release_delay
        recheck = 0.0
        for s in [s for s in self._nonzero if s.decided != stamp]:
            idle_for = now - s.idle_since if s.idle_since is not None and not s.ops else release
            if idle_for < release:
                recheck = max(recheck, release - idle_for)
            else:
                self._offer(s, 0.0, now)
        if recheck and not self._recheck_pending:
            self._recheck_pending = True
            self._timer.call_later(recheck, self._recheck)
        for s in self.table.new_sessions:
            if s.rate is None:
                self._offer(s, 0.0, now)
        self.table.new_sessions.clear()
        period = decision.period
        if period is not None:  # the policy wants to decide again even without an event
            if self._period_timer is not None:
                self._period_timer.cancel()
            self._period_timer = self._timer.call_later(period, self.request)
        self.stats.decisions += 1
        latency = time.perf_counter() - started
        self.stats.latencies.append(latency)
        if self._observe_latency is not None:
            self._observe_latency(latency)
        if decision_log.isEnabledFor(logging.DEBUG):
            # One JSON object per decision: the contending jobs of S(t) and what they got.
            decision_log.debug(
                "%s",
                json.dumps(
                    {
                        "decision": stamp,
                        "policy": policy.name,
                        "capacity": view.capacity,
                        "global": targets is not None,
                        "jobs": [
                            {
                                "job": j,
                                "nodes": v.nodes,
                                "cap": round(v.cap),
                                "demand": round(v.demand),
                                "rate": round(rates.get(j, 0.0)),
                            }
                            for j, v in view.jobs.items()
                        ],
                    },
                    sort_keys=True,
                ),
            )

    def _recheck(self) -> None:
        self._recheck_pending = False
        self.request()

    def _offer(self, session: SessionState, rate: float, now: float) -> None:
        """Pushes ``rate`` unless it is what the session holds, within the push tolerance.

        0 ↔ non-zero is always pushed (the job starts or stops); the first
        allocation of a session (held rate None) too.
        """
        old = session.rate
        if old == rate or (old and rate and abs(rate - old) <= self.config.push_tolerance * old):
            return
        self._push(session, rate, now)

    def _push(self, session: SessionState, rate: float, now: float) -> None:
        outbox = session.outbox
        if outbox is None or session.closed:
            self._nonzero.discard(session)
            return
        if rate > 0:
            self._nonzero.add(session)
        else:
            self._nonzero.discard(session)
        if rate != session.rate:  # not a renewal
            if rate == 0:
                self.stats.pushes_stop += 1
            elif not session.rate:
                self.stats.pushes_start += 1
        session.rate = rate
        session.epoch += 1
        session.pushed_at = now
        burst = max(float(self.config.min_burst), rate * self.config.burst_window) if rate else 0.0
        outbox.offer(rate, burst, session.epoch, self.config.lease, self.slot.policy.name)
        self.stats.pushes += 1
