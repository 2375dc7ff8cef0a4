"""Prometheus metrics of one replica (``GET /metrics``), read from its state at scrape time.

One ``CollectorRegistry`` per replica (no process-global registry, so several
replicas in one process, as in the tests, never mix their series). Everything
but the decision-latency histogram (``LatencyHistogram``, which the scheduler
observes once per decision) is derived from the job table, the scheduler's
counters and the peer view when Prometheus scrapes, so the hot paths pay
nothing. ``Metrics.stats`` gives the same counters as one dictionary: the
``stats:`` line a replica logs when it stops, which benchmarks read.

A scrape is bounded and kept off the event loop: the job table may hold tens of
thousands of jobs (every made-up job id of a Hello is retained for
``job_retention``), so per-job series exist only for the
``metrics_top_jobs`` jobs with the highest allotted rate (ties: active jobs
first, then the most bytes moved, then the oldest), and every job counts in the
aggregate series. ``Metrics.exposition`` takes on the loop only what is cheap
(the sessions' rates, a C-speed copy of the table's job list, a few counters, then
the fields of the N jobs shown); ranking, sums and the text exposition run in a
worker thread; scrapes that arrive while one is being rendered, or within
``MAX_AGE`` (1 s) of its snapshot, share its result, so concurrent or rapid scrapes
do not multiply the cost: at most about one render a second.

Series (all prefixed ``burstctl_``):

- per job, labels ``job``, ``user``, ``group``, for the top N jobs by rate only:
  ``job_rate_bytes_per_second`` (allotted now), ``job_read_bytes_total``,
  ``job_written_bytes_total``, ``job_moved_bytes_total``, ``job_ops_total``
  (acquire calls), ``job_metadata_ops_total``, ``job_token_wait_seconds_total``,
  ``job_yield`` (eq. 6), ``job_active``; a job that leaves the top N has no
  series in the next scrape;
- over every job of the table, label ``replica``: ``jobs``, ``jobs_by_status``
  (+ label ``status``: ``active``, ``inactive``), ``jobs_in_io``,
  ``jobs_shown`` (jobs with per-job series), ``jobs_rate_bytes_per_second``,
  ``jobs_read_bytes``, ``jobs_written_bytes``, ``jobs_moved_bytes`` (gauges:
  sums over the jobs in the table, they drop when a job leaves it),
  ``other_jobs``, ``other_jobs_rate_bytes_per_second``,
  ``other_jobs_moved_bytes`` (the jobs without per-job series);
- per replica, label ``replica``: ``capacity_bytes_per_second``,
  ``utilisation`` (Σ allotted / B), ``decisions_total``,
  ``decision_latency_seconds`` (histogram), ``sessions``,
  ``clamped_decisions_total``, ``allocation_pushes_total``,
  ``policy_switches_total``, ``policy_info`` (labels ``policy``, ``version``),
  ``metrics_render_seconds`` (the previous scrape's render time);
- per peer, labels ``replica``, ``peer``: ``peer_exchange_age_seconds``,
  ``peer_live``;
- clients in fallback (controller/ghosts.py), label ``replica``: ``fallback_sessions``
  (streams given up without a Goodbye whose clients may pace on), and
  ``fallback_rate_bytes_per_second`` (the rates they, and a restarted predecessor's
  clients, may pace at: counted out of B);
- per rule (docs/rules.md), labels ``replica``, ``rule``: ``rule_rate_bytes_per_second``
  and ``rule_demand_bytes_per_second`` (its jobs here), ``rule_limit_bytes_per_second``
  and ``rule_limited`` (rules with a limit), ``rule_reservation_bytes_per_second`` and
  ``rule_reservation_unmet`` (rules with a reservation: controller/rule_status.py); per
  job shown that a rule binds, labels ``job``, ``user``, ``group``, ``rule``:
  ``job_rule_info`` (1); label ``replica``: ``rules_overcommitted_bytes_per_second``;
- the burst buffer (docs/capacity.md), label ``replica``: ``bb_capacity_bytes`` (S; only
  with ``bb_capacity``), ``bb_used_bytes``, ``bb_pending_bytes``,
  ``drain_rate_bytes_per_second`` (Σ drain streams' rates), ``drained_bytes_total`` (bytes
  drain streams copied to the PFS since start); per job, labels ``job``, ``user``,
  ``group``, for the top N jobs only: ``bb_resident_bytes`` (jobs with bytes on the buffer).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from burstctl.controller.buffer import BufferBooks, JobBuffer
from burstctl.controller.config import ControllerConfig
from burstctl.controller.jobs import JobTable
from burstctl.controller.peers import PeerServicer, PeerSync
from burstctl.controller.records import JobState, JobStatus
from burstctl.controller.rule_status import rule_metrics
from burstctl.controller.rulebook import RuleBook
from burstctl.controller.rules import Rule
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.servicer import ControllerServicer
from burstctl.controller.state import PolicySlot
from burstctl.policies.view import job_cap

# From tens of µs to a second (bench/decision_latency.py measures them).
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1, 1.0)
JOB_LABELS = ["job", "user", "group"]
# A scrape within this many seconds of the last render's snapshot gets that render's
# text: however often /metrics is asked for, it is rendered at most about once a second.
MAX_AGE = 1.0


@dataclass(frozen=True, slots=True)
class _Scalars:
    """What a scrape reads on the loop besides the jobs: a few numbers."""

    replica: str
    now: float
    capacity: float
    sessions: int
    decisions: int
    clamped: int
    pushes: int
    switches: int
    policy: str
    version: int
    render_seconds: float
    peers: list[tuple[str, float, bool]] | None  # (peer, seconds since heard, live)
    bb_size: int | None = None  # the burst buffer (docs/capacity.md)
    bb_used: int = 0
    bb_pending: int = 0
    drain_rate: float = 0.0
    drained: int = 0
    fallback_sessions: int = 0  # controller/ghosts.py: clients that may pace in fallback
    fallback_rate: float = 0.0
    overcommitted: float = 0.0  # Σ reservations above the capacity (controller/rulebook.py)


@dataclass(slots=True)
class _Totals:
    """Sums over every job of the table (computed in the worker thread)."""

    jobs: int = 0
    active: int = 0
    in_io: int = 0
    rate: float = 0.0
    read: int = 0
    written: int = 0
    moved: int = 0
    shown_rate: float = 0.0
    shown_moved: int = 0


@dataclass(frozen=True, slots=True)
class _JobRow:
    labels: list[str]
    rate: float
    read: int
    written: int
    moved: int
    ops: int
    metadata_ops: int
    wait: float
    yield_: float | None
    active: bool
    resident: int = 0  # bytes on the burst buffer


def _rank(
    jobs: list[JobState], rates: dict[str, float], top: int
) -> tuple[list[JobState], _Totals]:
    """The ``top`` jobs by rate (then active, bytes moved, age) and the sums over all.

    Runs in a worker thread: it only reads single attributes of the jobs (each
    read is atomic under the GIL) and iterates no container the loop mutates.
    """
    active_status = JobStatus.ACTIVE
    totals = _Totals(jobs=len(jobs), rate=sum(rates.values()))
    for job in jobs:
        totals.active += job.status is active_status
        totals.in_io += job.io_since is not None
        totals.read += job.bytes_read
        totals.written += job.bytes_written
        totals.moved += job.bytes_moved
    if top <= 0:
        return [], totals
    shown = heapq.nlargest(
        top,
        jobs,
        key=lambda j: (
            rates.get(j.meta.job_id, 0.0),
            j.status is active_status,
            j.bytes_moved,
            -j.index,
        ),
    )
    totals.shown_rate = sum(rates.get(j.meta.job_id, 0.0) for j in shown)
    totals.shown_moved = sum(j.bytes_moved for j in shown)
    return shown, totals


class _Exposition(Collector):
    """One scrape's families, from what was read on the loop; collected in a thread."""

    def __init__(
        self, histogram: list[Metric], s: _Scalars, rows: list[_JobRow], totals: _Totals
    ) -> None:
        self.histogram = histogram
        self.s = s
        self.rows = rows
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        s, t = self.s, self.totals
        replica = s.replica
        yield from self._jobs()
        yield from self.histogram

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"burstctl_{name}", doc, labels=["replica"])
            g.add_metric([replica], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"burstctl_{name}", doc, labels=["replica"])
            c.add_metric([replica], value)
            return c

        yield gauge(
            "capacity_bytes_per_second", "B, the bandwidth this replica shares.", s.capacity
        )
        yield gauge("utilisation", "Sum of allotted rates over B.", t.rate / s.capacity)
        yield gauge("sessions", "Open client sessions.", s.sessions)
        yield gauge("jobs", "Jobs in the table, active or retained.", t.jobs)
        status = GaugeMetricFamily(
            "burstctl_jobs_by_status", "Jobs in the table by status.", labels=["replica", "status"]
        )
        status.add_metric([replica, "active"], t.active)
        status.add_metric([replica, "inactive"], t.jobs - t.active)
        yield status
        yield gauge("jobs_in_io", "Jobs with an open operation (in S(t)).", t.in_io)
        yield gauge("jobs_shown", "Jobs with per-job series (metrics_top_jobs).", len(self.rows))
        yield gauge("jobs_rate_bytes_per_second", "Sum of allotted rates, all jobs.", t.rate)
        yield gauge("jobs_read_bytes", "Bytes of read operations, jobs in the table.", t.read)
        yield gauge(
            "jobs_written_bytes", "Bytes of write operations, jobs in the table.", t.written
        )
        yield gauge("jobs_moved_bytes", "All bytes moved, jobs in the table.", t.moved)
        yield gauge("other_jobs", "Jobs without per-job series.", t.jobs - len(self.rows))
        yield gauge(
            "other_jobs_rate_bytes_per_second",
            "Sum of allotted rates, jobs without per-job series.",
            t.rate - t.shown_rate,
        )
        yield gauge(
            "other_jobs_moved_bytes",
            "Bytes moved, jobs without per-job series.",
            t.moved - t.shown_moved,
        )
        yield counter("decisions", "Allocation decisions made.", s.decisions)
        yield counter("clamped_decisions", "Decisions whose proposal was clamped.", s.clamped)
        yield counter("allocation_pushes", "Allocations sent to sessions.", s.pushes)
        yield counter("policy_switches", "Policy switches applied here.", s.switches)
        yield gauge(
            "metrics_render_seconds", "Seconds the previous /metrics scrape took.", s.render_seconds
        )
        info = GaugeMetricFamily(
            "burstctl_policy_info",
            "The active policy (value 1).",
            labels=["replica", "policy", "version"],
        )
        info.add_metric([replica, s.policy, str(s.version)], 1.0)
        yield info
        if s.bb_size is not None:
            yield gauge("bb_capacity_bytes", "S, the burst buffer's capacity.", s.bb_size)
        yield gauge("bb_used_bytes", "Bytes on the burst buffer or granted to writers.", s.bb_used)
        yield gauge(
            "bb_pending_bytes", "Bytes on the burst buffer not yet on the PFS.", s.bb_pending
        )
        yield gauge("drain_rate_bytes_per_second", "Sum of the drain streams' rates.", s.drain_rate)
        yield counter("drained_bytes", "Bytes drain streams copied to the PFS.", s.drained)
        yield gauge(
            "fallback_sessions",
            "Sessions given up without a Goodbye whose clients may pace in fallback.",
            s.fallback_sessions,
        )
        yield gauge(
            "fallback_rate_bytes_per_second",
            "Rates those clients, and a predecessor's, may pace at (counted out of B).",
            s.fallback_rate,
        )
        yield gauge(
            "rules_overcommitted_bytes_per_second",
            "Sum of the rules' reservations when it passes the capacity, else 0.",
            s.overcommitted,
        )
        if s.peers is not None:
            age = GaugeMetricFamily(
                "burstctl_peer_exchange_age_seconds",
                "Seconds since the peer's last accepted digest.",
                labels=["replica", "peer"],
            )
            live = GaugeMetricFamily(
                "burstctl_peer_live",
                "1 while the peer is in the global view.",
                labels=["replica", "peer"],
            )
            for peer, heard_age, is_live in s.peers:
                age.add_metric([replica, peer], heard_age)
                live.add_metric([replica, peer], 1.0 if is_live else 0.0)
            yield age
            yield live

    def _jobs(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"burstctl_job_{name}", doc, labels=JOB_LABELS)

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"burstctl_job_{name}", doc, labels=JOB_LABELS)

        rate = gauge("rate_bytes_per_second", "Rate allotted now, bytes/s.")
        read = counter("read_bytes", "Bytes of read operations.")
        written = counter("written_bytes", "Bytes of write operations.")
        moved = counter("moved_bytes", "All bytes moved.")
        ops = counter("ops", "Acquire calls.")
        meta_ops = counter("metadata_ops", "Acquire calls of metadata operations.")
        wait = counter("token_wait_seconds", "Seconds acquire calls waited for tokens.")
        yields = gauge("yield", "y_i = P_i / (t - tau_i), eq. (6).")
        active = gauge("active", "1 while the job has a live session.")
        for r in self.rows:
            labels = r.labels
            rate.add_metric(labels, r.rate)
            read.add_metric(labels, r.read)
            written.add_metric(labels, r.written)
            moved.add_metric(labels, r.moved)
            ops.add_metric(labels, r.ops)
            meta_ops.add_metric(labels, r.metadata_ops)
            wait.add_metric(labels, r.wait)
            if r.yield_ is not None:
                yields.add_metric(labels, r.yield_)
            active.add_metric(labels, 1.0 if r.active else 0.0)
        resident = GaugeMetricFamily(
            "burstctl_bb_resident_bytes", "Bytes of the job on the burst buffer.", labels=JOB_LABELS
        )
        for r in self.rows:
            if r.resident:
                resident.add_metric(r.labels, r.resident)
        yield from (rate, read, written, moved, ops, meta_ops, wait, yields, active, resident)


class LatencyHistogram:
    """``burstctl_decision_latency_seconds`` of one replica, in its own registry; the
    scheduler calls ``observe`` with the seconds of each decision."""

    def __init__(self, replica_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.observe = (
            Histogram(
                "burstctl_decision_latency_seconds",
                "Seconds per decision: policy, clamp, split over sessions, pushes.",
                ["replica"],
                buckets=LATENCY_BUCKETS,
                registry=self.registry,
            )
            .labels(replica=replica_id)
            .observe
        )


class Metrics:
    """The scrape of one replica (``exposition``) and its ``stats``, read from its parts."""

    def __init__(
        self,
        config: ControllerConfig,
        latency: LatencyHistogram,
        *,
        table: JobTable,
        slot: PolicySlot,
        scheduler: Scheduler,
        books: BufferBooks,
        servicer: ControllerServicer,
        peers: PeerSync | None,
        peer_servicer: PeerServicer | None,
        rules: RuleBook | None = None,
    ) -> None:
        self.config = config
        self.rules = rules
        self.latency = latency
        self.table = table
        self.slot = slot
        self.scheduler = scheduler
        self.books = books
        self.servicer = servicer
        self.peers = peers
        self.peer_servicer = peer_servicer
        self.render_seconds = 0.0  # of the previous scrape, wall clock from request to text
        self.renders = 0
        self._pending: asyncio.Future[bytes] | None = None
        self._last: tuple[float, bytes] | None = None  # (snapshot time, text)

    async def exposition(self) -> bytes:
        """The Prometheus text of one scrape.

        At most one render runs at a time: a scrape that arrives while one is
        under way gets that one's text, and so does one that arrives less than
        ``MAX_AGE`` seconds after that render's snapshot. A scrape whose client
        goes away does not cancel the render the others wait for.
        """
        last = self._last
        if last is not None and time.monotonic() - last[0] < MAX_AGE:
            return last[1]
        pending = self._pending
        if pending is None:
            pending = self._pending = asyncio.ensure_future(self._render())
            pending.add_done_callback(self._rendered)
        return await asyncio.shield(pending)

    def _rendered(self, future: asyncio.Future[bytes]) -> None:
        if self._pending is future:
            self._pending = None
        if not future.cancelled():
            future.exception()  # retrieved here too: every waiter gets it raised

    async def _render(self) -> bytes:
        snapshot_at = time.monotonic()
        started = time.perf_counter()
        table, books, scheduler, config = self.table, self.books, self.scheduler, self.config
        now = table.clock()
        # On the loop, O(sessions) and a C-speed copy: nothing per job in Python.
        rates: dict[str, float] = {}
        for session in table.sessions.values():
            if session.rate and not session.drain:  # a drain's rate is no rate of the job's
                job_id = session.job.meta.job_id
                rates[job_id] = rates.get(job_id, 0.0) + session.rate
        jobs = list(table.jobs.values())
        buffers = books.jobs()  # O(holders): the buffer's part of the scrape
        stats = scheduler.stats
        peers = None
        if self.peers is not None:
            peers = [
                (p.replica_id, p.heard_age, p.live) for p in self.peers.membership.peer_states(now)
            ]
        scalars = _Scalars(
            replica=config.replica_id,
            now=now,
            capacity=config.capacity,
            sessions=len(table.sessions),
            decisions=stats.decisions,
            clamped=stats.clamped,
            pushes=stats.pushes,
            switches=self.slot.switches,
            policy=self.slot.name,
            version=self.slot.version,
            render_seconds=self.render_seconds,
            peers=peers,
            bb_size=books.size,
            bb_used=books.used,
            bb_pending=sum(b.pending for b in buffers.values()),
            drain_rate=sum(scheduler.drain_rates.values()),
            drained=table.drained_total,
            fallback_sessions=len(scheduler.ghosts),
            fallback_rate=sum(scheduler.ghosts.reserved()),
            overcommitted=self.rules.overcommitted() if self.rules is not None else 0.0,
        )
        # The histogram as of the same moment as the counters: its count is `decisions`.
        histogram = list(self.latency.registry.collect())
        shown, totals = await asyncio.to_thread(_rank, jobs, rates, config.metrics_top_jobs)
        # Back on the loop for the N jobs shown: their fields are read where they change.
        rows = [self._row(job, rates, scalars.now, buffers) for job in shown]
        # The rules' series: a few per rule, and one per job shown that a rule binds.
        ruled = []
        if self.rules is not None and (statuses := list(self.rules.status().values())):
            bound = [(r.labels, rule.name) for r in rows if (rule := self._rule(r.labels[0]))]
            ruled = list(rule_metrics(config.replica_id, statuses, bound))
        body = await asyncio.to_thread(
            generate_latest, _Exposition([*histogram, *ruled], scalars, rows, totals)
        )
        self.render_seconds = time.perf_counter() - started
        self.renders += 1
        self._last = (snapshot_at, body)
        return body

    def _rule(self, job_id: str) -> Rule | None:
        return self.rules.rule_of(job_id) if self.rules is not None else None

    def _row(
        self, job: JobState, rates: dict[str, float], now: float, buffers: dict[str, JobBuffer]
    ) -> _JobRow:
        m = job.meta
        config = self.config
        cap = job_cap(m.nodes, config.node_bandwidth, config.capacity)
        return _JobRow(
            labels=[m.job_id, m.user, m.group],
            rate=rates.get(m.job_id, 0.0),
            read=job.bytes_read,
            written=job.bytes_written,
            moved=job.bytes_moved,
            ops=job.ops_moved,
            metadata_ops=job.metadata_ops,
            wait=job.wait_seconds,
            yield_=job.live_yield(now, cap),
            active=job.status is JobStatus.ACTIVE,
            resident=buffers[m.job_id].resident if m.job_id in buffers else 0,
        )

    def stats(self) -> dict[str, Any]:
        """Counters since start, logged when the replica stops and read by benchmarks."""
        st = self.scheduler.stats
        servicer = self.servicer
        lat = sorted(st.latencies)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        out: dict[str, Any] = {
            "messages": servicer.messages,
            "rejected_sessions": servicer.rejected,
            "refused_sessions": servicer.refused,
            "denied_sessions": servicer.denied,
            "loop_lag_peak_s": servicer.lag.peak,
            "unauthenticated_calls": servicer.gate.refused,
            "decisions": st.decisions,
            "pushes": st.pushes,
            "pushes_start": st.pushes_start,
            "pushes_stop": st.pushes_stop,
            "renewals": st.renewals,
            "held": st.held,
            "hold_expired": st.hold_expired,
            "node_streams": servicer.node_streams,
            "clamped": st.clamped,
            "decision_p50_s": pct(0.50),
            "decision_p99_s": pct(0.99),
            "jobs": len(self.table.jobs),
            "sessions": len(self.table.sessions),
            "policy": self.slot.name,
            "policy_version": self.slot.version,
        }
        if self.peers is not None and self.peer_servicer is not None:
            out["sync"] = {
                **self.peers.stats(),
                "digests_received": self.peer_servicer.received,
                "digests_rejected": self.peer_servicer.rejected,
            }
        return out
