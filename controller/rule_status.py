"""Who is throttled, and by which rule: each rule's state as of the latest decision.

For every rule in force: the jobs of S(t) it binds here, their allotted rate and their
demand (each job's up to its cap), whether its **limit binds** (the set is allotted its
limit, or this replica's part of it, and wants more) and whether its **reservation is
unmet** (the set demands at least min(reservation, demand) and is allotted less: the
reservations in force passed the capacity and were scaled down, or a capacity fell). With
peers the limit and the reservation are global: a replica reads them on the global view
its last exchange decided (``RuleBook.observe_global``), where its own part would mislead.

Read by ``/v1/jobs`` (per job: ``rule``, ``limited_by``, ``reservation_met``), ``GET
/v1/rules``, ``burstctl top`` and ``/metrics`` (``burstctl_rule_*``, ``burstctl_job_rule_info``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from burstctl.controller.rules import Rule
from burstctl.policies.rules import Bindings
from burstctl.policies.view import JobId, SystemView

# A set within this fraction of its bound is at it (rates are rounded on the way).
AT_BOUND = 1e-3


@dataclass(frozen=True, slots=True)
class RuleStatus:
    rule: Rule
    jobs: int = 0  # jobs of S(t) it binds here
    rate: float = 0.0  # bytes/s allotted to them here
    demand: float = 0.0  # bytes/s they want here (each up to its cap)
    limited: bool = False  # its limit binds
    unmet: bool = False  # its reservation is not met

    @property
    def reservation_met(self) -> bool | None:
        return None if not self.rule.reservation else not self.unmet


def sums(
    bindings: Bindings | None, view: SystemView, rates: Mapping[JobId, float]
) -> dict[str, tuple[int, float, float]]:
    """Rule name → (jobs, Σ rate, Σ demand) over the jobs of S(t) in ``view`` it binds."""
    out: dict[str, tuple[int, float, float]] = {}
    if bindings is None:
        return out
    columns = view.columns
    ids, demand, cap = columns.job_id, columns.demand, columns.cap
    for r in view.active:
        terms = bindings.rule_of.get(ids[r])
        if terms is not None:
            n, rate, want = out.get(terms.name, (0, 0.0, 0.0))
            out[terms.name] = (n + 1, rate + rates.get(ids[r], 0.0), want + min(demand[r], cap[r]))
    return out


def statuses(
    rules: Iterable[Rule],
    here: Mapping[str, tuple[int, float, float]],
    budgets: Mapping[str, float],
    everywhere: Mapping[str, tuple[int, float, float]] | None,
) -> dict[str, RuleStatus]:
    """Each rule's status from its sums ``here`` (this replica's decision, with its
    ``budgets``: its parts of the limits) and ``everywhere`` (the global view's decision;
    None without peers)."""
    out = {}
    for rule in rules:
        jobs, rate, demand = here.get(rule.name, (0, 0.0, 0.0))
        seen = (jobs, rate, demand) if everywhere is None else everywhere.get(rule.name)
        _, g_rate, g_demand = seen if seen is not None else (0, 0.0, 0.0)
        limited = bool(rule.limit) and _at(g_rate, g_demand, rule.limit)
        if rule.limit and everywhere is not None and rule.name in budgets:
            # between exchanges this replica holds the set to its part of the limit
            limited = limited or _at(rate, demand, budgets[rule.name])
        want = min(rule.reservation, g_demand)
        unmet = bool(rule.reservation) and g_rate < want * (1 - AT_BOUND)
        out[rule.name] = RuleStatus(rule, jobs, rate, demand, limited, unmet)
    return out


def _at(rate: float, demand: float, bound: float) -> bool:
    """A set allotted ``rate`` of its ``demand`` is held at ``bound``."""
    return demand > rate * (1 + AT_BOUND) and rate >= bound * (1 - AT_BOUND)


def rule_metrics(
    replica: str, rules: Iterable[RuleStatus], bound: Iterable[tuple[list[str], str]]
) -> Iterator[Metric]:
    """The ``burstctl_rule_*`` families (label ``replica``, ``rule``) and
    ``burstctl_job_rule_info`` for ``bound``: (job labels, rule name) of the jobs shown."""
    labels = ["replica", "rule"]
    rate = GaugeMetricFamily(
        "burstctl_rule_rate_bytes_per_second", "Allotted to the rule's jobs here.", labels=labels
    )
    demand = GaugeMetricFamily(
        "burstctl_rule_demand_bytes_per_second", "What the rule's jobs want here.", labels=labels
    )
    limit = GaugeMetricFamily(
        "burstctl_rule_limit_bytes_per_second", "The rule's limit, all replicas.", labels=labels
    )
    reservation = GaugeMetricFamily(
        "burstctl_rule_reservation_bytes_per_second",
        "The rule's reservation, all replicas.",
        labels=labels,
    )
    limited = GaugeMetricFamily(
        "burstctl_rule_limited", "1 while the rule's limit binds.", labels=labels
    )
    unmet = GaugeMetricFamily(
        "burstctl_rule_reservation_unmet",
        "1 while the rule's jobs demand its reservation and get less.",
        labels=labels,
    )
    for s in rules:
        key = [replica, s.rule.name]
        rate.add_metric(key, s.rate)
        demand.add_metric(key, s.demand)
        if s.rule.limit:
            limit.add_metric(key, s.rule.limit)
            limited.add_metric(key, 1.0 if s.limited else 0.0)
        if s.rule.reservation:
            reservation.add_metric(key, s.rule.reservation)
            unmet.add_metric(key, 1.0 if s.unmet else 0.0)
    info = GaugeMetricFamily(
        "burstctl_job_rule_info",
        "1 for a job bound to a rule.",
        labels=["job", "user", "group", "rule"],
    )
    for job_labels, name in bound:
        info.add_metric([*job_labels, name], 1.0)
    yield from (rate, demand, limit, reservation, limited, unmet, info)
