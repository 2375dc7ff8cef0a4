"""The scheduler: turns job-table events into allocations and pushes them.

Events (post, completion, usage/demand change, session open/close, policy
switch, periodic tick) only mark the table dirty; one task then decides for
all of them at once, so a burst of events costs one decision. A decision is:
build the ``SystemView``, ask the policy (which *proposes*), clamp (the engine
*enforces*: finite, ≥ 0, ≤ b_i, Σ ≤ B), split each job's rate over its
sessions, and push an ``Allocation`` to every session whose rate changed.
Leases are renewed at half their length.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from burstctl.controller.config import ControllerConfig
from burstctl.controller.jobs import JobTable, SessionState
from burstctl.policies.base import Policy
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId, SystemView
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

log = logging.getLogger(__name__)
decision_log = logging.getLogger("burstctl.decisions")


@dataclass(slots=True)
class SchedulerStats:
    decisions: int = 0
    pushes: int = 0
    renewals: int = 0
    clamped: int = 0
    # seconds per decision (policy + clamp + split + push), most recent first-in
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))


def clamp(view: SystemView, proposed: Mapping[JobId, float]) -> tuple[dict[JobId, float], bool]:
    """Enforces what every policy promises: finite, ≥ 0, ≤ b_i, Σ ≤ B, only active jobs."""
    rates: dict[JobId, float] = {}
    fixed = False
    for job in view.jobs.values():
        rate = proposed.get(job.job_id, 0.0) if job.active else 0.0
        if not math.isfinite(rate) or rate < 0.0:
            rate, fixed = 0.0, True
        elif rate > job.cap:
            rate, fixed = job.cap, True
        rates[job.job_id] = rate
    total = sum(rates.values())
    if total > view.capacity * (1 + 1e-9):
        scale = view.capacity / total
        rates = {j: r * scale for j, r in rates.items()}
        fixed = True
    return rates, fixed


class Scheduler:
    """Owns the decision loop of one replica."""

    def __init__(
        self,
        table: JobTable,
        config: ControllerConfig,
        policy: Callable[[], Policy],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self.config = config
        self._policy = policy
        self._clock = clock
        self._dirty = asyncio.Event()
        self.stats = SchedulerStats()
        self.last_rates: dict[JobId, float] = {}
        self.decided = asyncio.Condition()

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
            async with self.decided:
                self.decided.notify_all()
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
        policy = self._policy()
        view = self.table.view(self.config.capacity, self.config.node_bandwidth)
        rates, fixed = clamp(view, policy.allocate(view))
        if fixed:
            self.stats.clamped += 1
            log.warning("policy %s proposed an infeasible allocation; clamped", policy.name)
        now = self._clock()
        for job_id, job in self.table.jobs.items():
            if not job.sessions:
                continue
            rate = rates.get(job_id, 0.0)
            sessions = list(job.sessions.values())
            if len(sessions) == 1:
                self._offer(sessions[0], rate, now)
                continue
            cap = view.jobs[job_id].cap if job_id in view.jobs else 0.0
            demand = {s.sid: s.demand(cap, self.table.demand_headroom) for s in sessions}
            split = water_fill(demand, dict.fromkeys(demand, 1.0), rate)
            for s in sessions:
                self._offer(s, split[s.sid], now)
        self.last_rates = rates
        self.stats.decisions += 1
        self.stats.latencies.append(time.perf_counter() - started)
        if decision_log.isEnabledFor(logging.DEBUG):
            contending = {j: round(r) for j, r in rates.items() if view.jobs[j].active}
            decision_log.debug("policy=%s rates=%s", policy.name, contending)

    def _offer(self, session: SessionState, rate: float, now: float) -> None:
        old = session.rate
        if old is not None:
            if old == rate:
                return
            tolerance = self.config.push_tolerance
            if tolerance and old > 0 and rate > 0 and abs(rate - old) <= tolerance * old:
                return
        self._push(session, rate, now)

    def _push(self, session: SessionState, rate: float, now: float) -> None:
        outbox = session.outbox
        if outbox is None or session.closed:
            return
        session.rate = rate
        session.epoch += 1
        session.pushed_at = now
        burst = max(float(self.config.min_burst), rate * self.config.burst_window) if rate else 0.0
        outbox.offer(
            pb.ServerMessage(
                allocation=pb.Allocation(
                    rate=rate,
                    burst=burst,
                    epoch=session.epoch,
                    lease_seconds=self.config.lease,
                    policy=self._policy().name,
                    replica_id=self.config.replica_id,
                )
            )
        )
        self.stats.pushes += 1
