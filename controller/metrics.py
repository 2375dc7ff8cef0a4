"""Prometheus metrics of one replica (``GET /metrics``), read from its state at scrape time.

One ``CollectorRegistry`` per ``Replica`` (no process-global registry, so several
replicas in one process, as in the tests, never mix their series). Everything
but the decision-latency histogram is derived from the job table, the
scheduler's counters and the peer view when Prometheus scrapes, so the hot
paths pay nothing; the histogram is observed once per decision.

Series (all prefixed ``burstctl_``):

- per job, labels ``job``, ``user``, ``group``: ``job_rate_bytes_per_second``
  (allotted now), ``job_read_bytes_total``, ``job_written_bytes_total``,
  ``job_moved_bytes_total``, ``job_ops_total`` (acquire calls),
  ``job_metadata_ops_total``, ``job_token_wait_seconds_total``, ``job_yield``
  (eq. 6), ``job_active``;
- per replica, label ``replica``: ``capacity_bytes_per_second``,
  ``utilisation`` (Σ allotted / B), ``decisions_total``,
  ``decision_latency_seconds`` (histogram), ``sessions``, ``jobs``,
  ``clamped_decisions_total``, ``allocation_pushes_total``,
  ``policy_switches_total``, ``policy_info`` (labels ``policy``, ``version``);
- per peer, labels ``replica``, ``peer``: ``peer_exchange_age_seconds``,
  ``peer_live``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from burstctl.controller.jobs import JobStatus
from burstctl.policies.view import job_cap

if TYPE_CHECKING:
    from burstctl.controller.app import Replica

# From tens of µs to a second (bench/decision_latency.py measures them).
LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1, 1.0)
JOB_LABELS = ["job", "user", "group"]


class Metrics:
    """The registry of one replica, its latency histogram and its scrape-time collector."""

    def __init__(self, replica: Replica) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.decision_latency = Histogram(
            "burstctl_decision_latency_seconds",
            "Seconds per decision: policy, clamp, split over sessions, pushes.",
            ["replica"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        ).labels(replica=replica.config.replica_id)
        self.registry.register(_StateCollector(replica))


class _StateCollector(Collector):
    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    def collect(self) -> Iterator[Metric]:
        svc = self.replica
        replica = svc.config.replica_id
        now = svc.clock()
        yield from self._jobs(now)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"burstctl_{name}", doc, labels=["replica"])
            g.add_metric([replica], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"burstctl_{name}", doc, labels=["replica"])
            c.add_metric([replica], value)
            return c

        capacity = svc.config.capacity
        allotted = sum(s.rate or 0.0 for s in svc.table.sessions.values())
        stats = svc.scheduler.stats
        yield gauge("capacity_bytes_per_second", "B, the bandwidth this replica shares.", capacity)
        yield gauge("utilisation", "Sum of allotted rates over B.", allotted / capacity)
        yield gauge("sessions", "Open client sessions.", len(svc.table.sessions))
        yield gauge("jobs", "Jobs in the table, active or retained.", len(svc.table.jobs))
        yield counter("decisions", "Allocation decisions made.", stats.decisions)
        yield counter("clamped_decisions", "Decisions whose proposal was clamped.", stats.clamped)
        yield counter("allocation_pushes", "Allocations sent to sessions.", stats.pushes)
        yield counter("policy_switches", "Policy switches applied here.", svc.slot.switches)
        info = GaugeMetricFamily(
            "burstctl_policy_info",
            "The active policy (value 1).",
            labels=["replica", "policy", "version"],
        )
        info.add_metric([replica, svc.slot.name, str(svc.slot.version)], 1.0)
        yield info
        if svc.peer_sync is not None:
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
            for p in svc.peer_sync.membership.peer_states(now):
                age.add_metric([replica, p.replica_id], p.heard_age)
                live.add_metric([replica, p.replica_id], 1.0 if p.live else 0.0)
            yield age
            yield live

    def _jobs(self, now: float) -> Iterator[Metric]:
        svc = self.replica

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
        b, capacity = svc.config.node_bandwidth, svc.config.capacity
        for job in svc.table.jobs.values():
            m = job.meta
            labels = [m.job_id, m.user, m.group]
            rate.add_metric(labels, sum(s.rate or 0.0 for s in job.sessions.values()))
            read.add_metric(labels, job.bytes_read)
            written.add_metric(labels, job.bytes_written)
            moved.add_metric(labels, job.bytes_moved)
            ops.add_metric(labels, job.ops_moved)
            meta_ops.add_metric(labels, job.metadata_ops)
            wait.add_metric(labels, job.wait_seconds)
            elapsed = now - job.first_seen
            if elapsed > 0:
                yields.add_metric(
                    labels, job.progress(now, job_cap(m.nodes, b, capacity)) / elapsed
                )
            active.add_metric(labels, 1.0 if job.status is JobStatus.ACTIVE else 0.0)
        yield from (rate, read, written, moved, ops, meta_ops, wait, yields, active)
