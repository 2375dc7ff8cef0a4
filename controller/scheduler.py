"""The scheduler: turns job-table events into allocations and pushes them.

Events (post, completion, usage/demand change, session open/close, policy
switch, peer exchange, periodic tick) only mark the table dirty; one task then
decides for all of them at once, so a burst of events costs one decision; after a
decision it lets events gather for three times what the decision cost (at most
50 ms), so under load decisions come on a cadence and take at most a quarter of
the loop. A decision is: build the ``SystemView``, take the one decision path
(``policies.decision.decide``: the policy proposes, ``decide`` enforces, blended
with this replica's part of the global split when it has peers), split each
job's rate over its sessions, and push an ``Allocation`` to every session whose
rate changed. Leases are renewed at half their length.

Two rules keep the rates in force at the clients within B (1 + push tolerance)
(docs/protocol.md, "Decreases before increases"): a rate below ``MIN_RATE`` is
pushed as 0 (a residue of rounding, not an allotment), and an increase is offered
only once every decrease offered before it has been acknowledged by its client,
or, past a bound, only as far as it fits beside the rates the clients of the
decreases not yet acknowledged may still pace at.

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
from typing import Protocol, runtime_checkable

from burstctl.common.limits import MIN_RATE
from burstctl.controller.buffer import BufferBooks
from burstctl.controller.config import ControllerConfig
from burstctl.controller.ghosts import Ghosts
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import SessionRecord, WindowsOutbox
from burstctl.controller.rulebook import RuleBook
from burstctl.controller.signal import Signal
from burstctl.controller.state import PolicySlot
from burstctl.policies.base import Policy
from burstctl.policies.decision import Decision, Share, decide
from burstctl.policies.schedule import Schedule
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId

log = logging.getLogger(__name__)
decision_log = logging.getLogger("burstctl.decisions")

# Longest every increase waits for the decreases offered before it to be acknowledged, in
# seconds (and at most an eighth of the lease): then the increases that fit beside the rates
# still possibly in force go out, and the others wait for more acknowledgements. A client that
# does not acknowledge (it stopped reading, or is slow) holds back only what does not fit.
INCREASE_HOLD_MAX = 0.25

# The most of the event loop's time decisions take under load: after a decision that took d
# seconds, the next one waits d (1 / DECISION_SHARE - 1), at most DECISION_GAP_MAX seconds,
# and covers every event that came meanwhile.
DECISION_SHARE = 0.25
DECISION_GAP_MAX = 0.05

# rate, burst, epoch, lease, policy, pattern of windows (None: a plain rate)
Offer = tuple[float, float, int, float, str, Schedule | None]


@dataclass(slots=True)
class SchedulerStats:
    decisions: int = 0
    pushes: int = 0  # allocations sent, renewals included
    pushes_start: int = 0  # from nothing or 0 to a rate: the job may move
    pushes_stop: int = 0  # to 0
    renewals: int = 0
    clamped: int = 0
    held: int = 0  # increases held back until the decreases before them were acknowledged
    hold_expired: int = 0  # holds that reached their bound: only what fit went out then
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


@runtime_checkable
class Acknowledging(Protocol):
    """An outbox that tells when its client reports an offered allocation in force."""

    def applied(self, epoch: int) -> asyncio.Future[None]: ...


_OUTBOX_KINDS: dict[type, tuple[bool, bool]] = {}


def _outbox_kind(kind: type) -> tuple[bool, bool]:
    """Whether outboxes of a class carry windows and acknowledge: the protocols checked once
    per class, not per push (a protocol check walks the class's attributes)."""
    known = _OUTBOX_KINDS.get(kind)
    if known is None:
        known = _OUTBOX_KINDS[kind] = (
            issubclass(kind, WindowsOutbox),
            issubclass(kind, Acknowledging),
        )
    return known


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
        books: BufferBooks | None = None,
        ghosts: Ghosts | None = None,
        rules: RuleBook | None = None,
    ) -> None:
        self.table = table
        self.rules = rules  # the operator's rules (controller/rulebook.py), applied in decide
        # Sessions gone without a Goodbye whose clients may still pace: decisions share the
        # capacity less their rates (controller/ghosts.py).
        self.ghosts = ghosts if ghosts is not None else Ghosts(retention=0.0)
        # The burst buffer's books (controller/buffer.py): SystemView.buffer, when S is set.
        self.books = books
        self.slot = slot  # the active policy: its one live instance decides
        self.config = config
        self._peers = peers
        self._clock = clock
        self._timer: Timer = timer if timer is not None else LoopTimer()
        self._observe_latency = observe_latency
        self._dirty = asyncio.Event()
        self.stats = SchedulerStats()
        self.last: Decision | None = None  # the latest decision, as enforced
        self._nonzero: set[SessionRecord] = set()  # sessions whose pushed rate is > 0
        self._recheck_pending = False
        self._round = 0  # decision number; sessions served in a decision carry it
        self._period_timer: Cancellable | None = None
        # Decreases before increases: increases waiting to be offered, and the
        # acknowledgements of the decreases offered before them they wait for.
        self._held: dict[SessionRecord, Offer] = {}
        # what each held increase waits for: the decreases offered up to that number (None:
        # those of the decision under way, numbered when it ends). Decreases offered later
        # only make more room, so an increase never waits for them.
        self._held_after: dict[SessionRecord, int | None] = {}
        self._decreases = 0  # decreases offered so far, numbered in order
        # each decrease not yet acknowledged: its session, the rate offered before it (what
        # the client may still pace at until it applies the decrease), and its number
        self._unapplied: dict[asyncio.Future[None], tuple[SessionRecord, float, int]] = {}
        self._deciding = False
        self._release_task: asyncio.Task[None] | None = None
        self._hold_max = min(INCREASE_HOLD_MAX, config.lease / 8)
        table.changed.connect(self.request)
        slot.changed.connect(self.request)
        slot.worked.connect(self.request)  # a policy's offloaded work landed
        if peers is not None:
            peers.updated.connect(self.request)
        if books is not None:
            books.changed.connect(self.request)  # the fill moved by a step: dpsac reads it
        if rules is not None:
            rules.changed.connect(self.request)

    def request(self) -> None:
        """Asks for a decision soon; cheap, called at every event."""
        self._dirty.set()

    async def run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            started = time.perf_counter()
            try:
                self.rebalance()
            except Exception:  # a policy bug must not stop the controller
                log.exception("decision failed; keeping previous allocations")
            # Let pending events land so the next decision covers all of them: for a moment
            # proportional to what this one cost, so that under load (many sessions, many
            # events) decisions come on a cadence and take at most DECISION_SHARE of the loop,
            # and with few sessions at once.
            spent = time.perf_counter() - started
            await asyncio.sleep(min(DECISION_GAP_MAX, spent * (1 / DECISION_SHARE - 1)))

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
                    self._push(session, session.rate, now, session.schedule)
                    self.stats.renewals += 1
            self._release_held()
            if self.ghosts.expire():  # their rates are free again
                self.request()

    def rebalance(self) -> None:
        """One decision; its decreases are offered at once, its increases after them."""
        self._deciding = True
        try:
            self._decide()
        finally:
            self._deciding = False
            self._release_held()

    def _decide(self) -> None:
        started = time.perf_counter()
        policy = self.slot.policy
        buffer = self.books.view() if self.books is not None else None
        away, drains_away = self.ghosts.reserved()
        capacity = max(0.0, self.config.capacity - away)
        view = self.table.view(capacity, self.config.node_bandwidth, buffer=buffer)
        targets = self._peers.local_targets if self._peers is not None else None
        budgets = targets.budgets if isinstance(targets, Share) else None
        bindings = self.rules.bindings(view, budgets) if self.rules is not None else None
        decision = self.last = decide(policy, view, targets, bindings)
        if self.rules is not None:
            self.rules.decided(decision, bindings)
        rates = decision.rates
        schedules = decision.schedules
        for job_id, reason in decision.refused:
            log.warning(
                "policy %s proposed a malformed schedule for job %s (%s); not sent",
                policy.name,
                job_id,
                reason,
            )
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
            if rate < MIN_RATE:  # a residue (capacity − Σ, rounded) is no allotment
                rate = 0.0
            sessions = jobs[job_id].sessions
            schedule = schedules.get(job_id) if schedules else None
            if len(sessions) == 1:
                for s in sessions.values():  # _offer inlined: this loop is the hot one
                    s.decided = stamp
                    old = s.rate
                    if (
                        old == rate or (old and rate and abs(rate - old) <= tolerance * old)
                    ) and s.schedule == schedule:
                        continue
                    self._push(s, rate, now, schedule)
            else:  # split the job's rate over its sessions by their demand
                cap = view.jobs[job_id].cap
                demand = {
                    sid: s.demand(cap, self.table.demand_headroom) for sid, s in sessions.items()
                }
                split = water_fill(demand, dict.fromkeys(demand, 1.0), rate)
                for sid, s in sessions.items():
                    s.decided = stamp
                    part = split[sid]
                    # each session paces to the job's windows at its share of their rates
                    mine = None if schedule is None or not rate else schedule.scaled(part / rate)
                    offer(s, part, now, mine)
        if self.table.draining:
            self._drain(stamp, now, drains_away)
        # Sessions outside S(t) that still hold a rate, and new ones, get 0. A
        # session whose operation just completed keeps its rate for the release
        # delay: it cannot use it without posting again (which triggers a new
        # decision), and a job that cycles quickly is spared two pushes per cycle.
        release = self.config.release_delay
        # A policy that paces to patterns, on its own decision or a part of a global one: its
        # periodic jobs keep their windows between iterations (own decision: the policy's).
        keeps_windows = type(policy).schedules is not Policy.schedules and (
            targets is None or (isinstance(targets, Share) and bool(targets.schedules))
        )
        between = policy.between(view) if keeps_windows and targets is None else {}
        totals: dict[JobId, float] = {}  # each job's rate over its sessions, before these pushes
        recheck = 0.0
        for s in [s for s in self._nonzero if s.decided != stamp]:
            if keeps_windows and s.schedule is not None and s.job.meta.job_id in view.periodic:
                # A periodic job between its windows (computing: no operation open, so no
                # demand and no schedule in this decision) keeps those it holds: its next
                # window comes without a round trip; the policy may change them meanwhile.
                held = between.get(job_id := s.job.meta.job_id)
                if held is not None:  # the session's share of them, as in the decisions
                    total = totals.get(job_id)
                    if total is None:
                        total = totals[job_id] = sum(o.rate or 0.0 for o in s.job.sessions.values())
                    mine = held.scaled(s.rate / total) if total and s.rate else held
                    self._offer(s, mine.mean_rate(), now, mine)
                continue
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

    def _drain(self, stamp: int, now: float, away: float) -> None:
        """The drain streams' rates (docs/capacity.md, "Drains"): the PFS bandwidth B
        (``pfs_bandwidth``; unset: the capacity B) water-filled over the jobs with a drain
        stream by their demand, equal weights, then each job's share over its drain streams
        the same way, less ``away`` (the ghosts' drain rates). Apart from the policy's decision:
        drains are no rows of S(t)."""
        total = max(0.0, (self.config.pfs_bandwidth or self.config.capacity) - away)
        headroom = self.table.demand_headroom
        jobs = self.table.jobs
        demands: dict[JobId, dict[int, float]] = {}
        for job_id in self.table.draining:
            job = jobs.get(job_id)
            if job is not None and job.drains:
                demands[job_id] = {sid: s.demand(total, headroom) for sid, s in job.drains.items()}
        wanted = {j: min(total, sum(d.values())) for j, d in demands.items()}
        shares = water_fill(wanted, dict.fromkeys(wanted, 1.0), total)
        for job_id, demand in demands.items():
            split = water_fill(demand, dict.fromkeys(demand, 1.0), shares[job_id])
            for sid, s in jobs[job_id].drains.items():
                s.decided = stamp
                self._offer(s, split.get(sid, 0.0), now)

    @property
    def drain_rates(self) -> dict[JobId, float]:
        """The rates in force of each job's drain streams, summed (``/v1/capacity``)."""
        rates: dict[JobId, float] = {}
        for job_id in self.table.draining:
            job = self.table.jobs.get(job_id)
            if job is not None:
                rates[job_id] = sum(s.rate or 0.0 for s in job.drains.values())
        return rates

    def _recheck(self) -> None:
        self._recheck_pending = False
        self.request()

    def _offer(
        self, session: SessionRecord, rate: float, now: float, schedule: Schedule | None = None
    ) -> None:
        """Pushes ``rate`` (and ``schedule``) unless it is what the session holds, within the
        push tolerance.

        0 ↔ non-zero is always pushed (the job starts or stops); the first
        allocation of a session (held rate None) too, and a change of schedule. A rate below
        ``MIN_RATE`` is 0, without a schedule.
        """
        if rate < MIN_RATE:
            rate, schedule = 0.0, None
        old = session.rate
        if (
            old == rate or (old and rate and abs(rate - old) <= self.config.push_tolerance * old)
        ) and session.schedule == schedule:
            return
        self._push(session, rate, now, schedule)

    def _push(
        self, session: SessionRecord, rate: float, now: float, schedule: Schedule | None = None
    ) -> None:
        outbox = session.outbox
        if outbox is None or session.closed:
            self._nonzero.discard(session)
            self._unhold(session)
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
        if not rate:
            schedule = None
        session.rate = rate
        session.schedule = schedule
        session.epoch += 1
        session.pushed_at = now
        # A pattern's bucket refills at its windows' rates: its depth follows the peak.
        peak = rate if schedule is None else schedule.peak_rate()
        burst = max(float(self.config.min_burst), peak * self.config.burst_window) if rate else 0.0
        offer = (rate, burst, session.epoch, self.config.lease, self.slot.policy.name, schedule)
        self.stats.pushes += 1
        # An increase, at some instant: the mean rate, or a window's above what may be in force.
        up = rate > session.offered or peak > max(session.offered, session.offered_peak)
        if up and (self._deciding or self._unapplied):
            # An increase: offered once the decreases before it are applied (_release_held).
            self._held[session] = offer
            self._held_after[session] = None if self._deciding else self._decreases
            return
        self._unhold(session)
        self._deliver(session, offer)

    def _unhold(self, session: SessionRecord) -> None:
        self._held.pop(session, None)
        self._held_after.pop(session, None)

    def _deliver(self, session: SessionRecord, offer: Offer) -> None:
        outbox = session.outbox
        assert outbox is not None
        lowered = offer[0] < session.offered
        before = session.offered
        session.offered = offer[0]
        rate, burst, epoch, lease, policy, schedule = offer
        session.offered_peak = schedule.peak_rate() if schedule is not None else 0.0
        windows, acknowledging = _outbox_kind(type(outbox))
        if schedule is not None and windows:
            outbox.offer_windows(rate, burst, epoch, lease, policy, schedule)
        else:  # a plain rate; an outbox that knows no windows gets the pattern's mean rate
            outbox.offer(rate, burst, epoch, lease, policy)
        if lowered and acknowledging:
            applied = outbox.applied(offer[2])
            if not applied.done():
                self._decreases += 1
                self._unapplied[applied] = (session, before, self._decreases)

    def _release_held(self) -> None:
        """Offers the held increases now, or once the decreases before them are applied (past
        a bound, those that fit beside the rates the clients may still pace at)."""
        if not self._held:
            return
        for session, after in self._held_after.items():
            if after is None:  # held by the decision that just ended: after all its decreases
                self._held_after[session] = self._decreases
        self._prune_applied()
        self._deliver_ready()
        if self._held and (self._release_task is None or self._release_task.done()):
            self.stats.held += len(self._held)
            self._release_task = asyncio.get_running_loop().create_task(
                self._release_after_acknowledgements(), name="scheduler-increases"
            )

    def _prune_applied(self) -> None:
        self._unapplied = {f: v for f, v in self._unapplied.items() if not f.done()}

    async def _release_after_acknowledgements(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._hold_max
        expired = False
        while self._held:
            self._prune_applied()
            self._deliver_ready()
            if not self._held or not self._unapplied:
                break
            left = deadline - loop.time()
            if left > 0:
                # the acknowledgements first
                await asyncio.wait(
                    self._unapplied, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                continue
            if not expired:
                expired = True
                self.stats.hold_expired += 1
                log.debug(
                    "%d decrease(s) not acknowledged after %.3fs; offering the increases that"
                    " fit beside them",
                    len(self._unapplied),
                    self._hold_max,
                )
            self._deliver_fitting()
            if not self._held:
                return
            # an acknowledgement, or another look a bound later: a decision since may have
            # made room, or added decreases this wait does not watch
            if self._unapplied:
                await asyncio.wait(
                    self._unapplied, timeout=self._hold_max, return_when=asyncio.FIRST_COMPLETED
                )
        self._deliver_ready()

    def _deliver_ready(self) -> None:
        """Offers the held increases whose decreases are all acknowledged (those offered
        before them: later ones do not hold them)."""
        oldest = min((number for _, _, number in self._unapplied.values()), default=None)
        for session, offer in list(self._held.items()):
            after = self._held_after.get(session)
            if oldest is not None and (after is None or after >= oldest):
                continue  # a decrease before it is not acknowledged yet
            self._unhold(session)
            if not session.closed and session.outbox is not None and offer[2] == session.epoch:
                self._deliver(session, offer)

    def _deliver_fitting(self) -> None:
        """Offers the held increases that fit, in the order they were decided, beside the
        rates the clients may pace at now: a session's offered rate, or the higher rate it had
        before a decrease it has not acknowledged yet. Drain streams count against the PFS
        bandwidth, the others against the capacity, each with the push tolerance."""
        possibly: dict[SessionRecord, float] = {}
        for session, before, _ in self._unapplied.values():
            possibly[session] = max(possibly.get(session, 0.0), before)
        in_force = [0.0, 0.0]  # (application streams, drain streams)
        for session in self.table.sessions.values():
            if session.closed:
                continue
            in_force[session.drain] += max(session.offered, possibly.get(session, 0.0))
        # a rate within the push tolerance of the decided one is not pushed again: held rates
        # may be up to 1 / (1 − tolerance) of the decided ones
        slack = 1.0 / (1.0 - self.config.push_tolerance)
        away = self.ghosts.reserved()
        room = [
            self.config.capacity * slack - in_force[0] - away[0],
            (self.config.pfs_bandwidth or self.config.capacity) * slack - in_force[1] - away[1],
        ]
        for session, offer in list(self._held.items()):
            if session.closed or session.outbox is None or offer[2] != session.epoch:
                self._unhold(session)  # superseded or gone
                continue
            now_at = max(session.offered, possibly.get(session, 0.0))
            more = offer[0] - now_at
            if more <= room[session.drain]:
                room[session.drain] -= max(more, 0.0)
                self._unhold(session)
                self._deliver(session, offer)
