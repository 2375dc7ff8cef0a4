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
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from burstctl.controller.config import ControllerConfig
from burstctl.controller.jobs import JobTable, SessionState
from burstctl.policies.base import Policy
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId, SystemView

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


def clamp(view: SystemView, proposed: Mapping[JobId, float]) -> tuple[dict[JobId, float], bool]:
    """Enforces what every policy promises: finite, ≥ 0, ≤ b_i, Σ ≤ B, only active jobs."""
    rates: dict[JobId, float] = {}
    fixed = False
    total = 0.0
    get = proposed.get
    for job_id, job in view.jobs.items():
        rate = get(job_id, 0.0)
        # `0 <= rate <= cap` is False for NaN too; the common case costs one comparison.
        if not 0.0 <= rate <= job.cap or job.demand <= 0.0:
            fixed = fixed or rate != 0.0
            rate = job.cap if rate > job.cap and job.demand > 0.0 else 0.0
        rates[job_id] = rate
        total += rate
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
        self._nonzero: set[SessionState] = set()  # sessions whose pushed rate is > 0
        self._recheck_pending = False
        self._round = 0  # decision number; sessions served in a decision carry it
        self._period_timer: asyncio.TimerHandle | None = None
        # With peers: this replica's rate for each job of the global view (PeerSync.column)
        self.global_column: Callable[[], Mapping[JobId, float] | None] | None = None
        # Called with each decision's latency in seconds (the metrics histogram).
        self.observe_latency: Callable[[float], None] | None = None

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
        policy = self._policy()
        view = self.table.view(self.config.capacity, self.config.node_bandwidth)
        column = self.global_column() if self.global_column is not None else None
        proposed = policy.allocate(view) if column is None else self._global(view, policy, column)
        rates, fixed = clamp(view, proposed)
        if fixed:
            self.stats.clamped += 1
            log.warning("policy %s proposed an infeasible allocation; clamped", policy.name)
        now = self._clock()
        self._round += 1
        stamp = self._round
        jobs = self.table.jobs
        offer = self._offer
        tolerance = self.config.push_tolerance
        for job_id, rate in rates.items():
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
            asyncio.get_running_loop().call_later(recheck, self._recheck)
        for s in self.table.new_sessions:
            if s.rate is None:
                self._offer(s, 0.0, now)
        self.table.new_sessions.clear()
        period = policy.period(view)
        if period is not None:  # the policy wants to decide again even without an event
            if self._period_timer is not None:
                self._period_timer.cancel()
            self._period_timer = asyncio.get_running_loop().call_later(period, self.request)
        self.stats.decisions += 1
        latency = time.perf_counter() - started
        self.stats.latencies.append(latency)
        if self.observe_latency is not None:
            self.observe_latency(latency)
        if decision_log.isEnabledFor(logging.DEBUG):
            # One JSON object per decision: the contending jobs of S(t) and what they got.
            decision_log.debug(
                "%s",
                json.dumps(
                    {
                        "decision": stamp,
                        "policy": policy.name,
                        "capacity": view.capacity,
                        "global": column is not None,
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

    @staticmethod
    def _global(
        view: SystemView, policy: Policy, column: Mapping[JobId, float]
    ) -> dict[JobId, float]:
        """This replica's rates when it holds a column of the global split.

        Jobs in the global view get their column rate (at most b_i). Jobs that
        started an operation here since the last exchange get their local fair
        share, what the local policy gives them on the whole local view, until
        the next exchange puts them in the global view; the column rates shrink
        in proportion to make room. Capacity still left (a job's local demand fell
        since the exchange) is water-filled over unmet local demand, so the
        replica stays work-conserving between exchanges.
        """
        rates = {j: min(column[j], job.cap) for j, job in view.jobs.items() if j in column}
        newer = [j for j in view.jobs if j not in column]
        if newer:
            local = policy.allocate(view)
            fresh = {j: local.get(j, 0.0) for j in newer}
            room = max(0.0, view.capacity - sum(fresh.values()))
            held = sum(rates.values())
            if held > room:
                rates = {j: r * (room / held) for j, r in rates.items()}
            rates.update(fresh)
        left = view.capacity - sum(rates.values())
        if left > 0.0:
            unmet = {}
            for j, job in view.jobs.items():
                want = min(job.demand, job.cap) - rates.get(j, 0.0)
                if want > 0.0:
                    unmet[j] = want
            if unmet:
                extra = water_fill(unmet, dict.fromkeys(unmet, 1.0), left)
                for j, r in extra.items():
                    rates[j] = rates.get(j, 0.0) + r
        return rates

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
        outbox.offer(rate, burst, session.epoch, self.config.lease, self._policy().name)
        self.stats.pushes += 1
