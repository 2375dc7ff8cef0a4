"""The rules in force on a replica: changed through the admin API, held in the replicated
catalog, saved with the replica's state, and bound to the jobs the policy decides.

A change made here (``put``, ``remove``) is a catalog record of this replica (a newer
``(version, origin)`` wins on every replica: controller/catalog.py), saved in
``state.json`` before it counts; a peer's rule that wins here arrives through the catalog
(``Catalog.rules_adopted``) and is saved the same way. ``resume`` takes the saved rules
back at start, before any peer is heard, so the rules survive a restart and reach a
replica started after they were added (from its peers' first digests).

**Admission** (``put``): the reservations of all the rules in force must fit in the
cluster's capacity (Σ B_r of the replicas in the view, given by the caller), and the
reservations of the rules whose bound jobs all run here in this replica's B; otherwise
``Overcommitted`` (REST: 409) names the sum, and nothing changed. A capacity that falls
later (a replica gone from the view) can leave the rules in force overcommitted:
``overcommitted`` reports it (``GET /v1/rules``, the log; ``/metrics``: the unmet
reservations), and the decision scales the reservations down to the capacity
(policies/rules.py) rather than drop one.

``bindings(view)``: the rule of each job of S(t) and the terms the decision applies
(policies/rules.py), None while there is no rule (a decision then pays nothing).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Collection, Iterable, Mapping

from burstctl.common.units import format_rate
from burstctl.controller.catalog import REGISTRATION, RULE, RULE_REMOVED, Catalog, CatalogRecord
from burstctl.controller.jobs import JobTable
from burstctl.controller.rule_status import RuleStatus, statuses, sums
from burstctl.controller.rules import Binder, Rule, reservations_over, rule_problem
from burstctl.controller.signal import Signal
from burstctl.controller.state import SavedRule, StateStore
from burstctl.policies.decision import Decision
from burstctl.policies.rules import Bindings
from burstctl.policies.view import SystemView

log = logging.getLogger(__name__)


class Overcommitted(Exception):
    """A change whose reservations would not fit; the message names the sum."""


class RuleBook:
    """The rules of ``catalog`` in force on this replica (module docstring); ``changed``
    fires after every change, local or a peer's."""

    def __init__(
        self, catalog: Catalog, store: StateStore, table: JobTable, capacity: float
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._table = table
        self.capacity = capacity
        self.binder = Binder(())
        self.version = 0  # bumped by every change of the rules in force
        self.changed = Signal()
        # rule name → (jobs, rate, demand) on the global view of the last exchange
        self.everywhere: dict[str, tuple[int, float, float]] | None = None
        self._last: tuple[Decision, Bindings | None] | None = None
        self.cluster = capacity  # Σ B_r of the replicas in the view (with peers: exchanged)
        self._status: tuple[tuple[object, ...], dict[str, RuleStatus]] | None = None
        catalog.rules_adopted.connect(self._adopted)

    # -- reading ---------------------------------------------------------------
    def rules(self) -> list[Rule]:
        """The rules in force, in the order they bind jobs."""
        return list(self.binder.rules)

    def get(self, name: str) -> Rule | None:
        return next((r for r in self.binder.rules if r.name == name), None)

    def rule_of(self, job_id: str) -> Rule | None:
        """The rule that binds a job of the table (or a registered one), or None."""
        if not self.binder.rules:
            return None
        state = self._table.jobs.get(job_id)
        meta = state.meta if state is not None else self._table.registered.get(job_id)
        if meta is None:
            return None
        return self.binder.rule_for(job_id, meta.user, meta.group, self._app(job_id, meta.app))

    def bindings(
        self, view: SystemView, budgets: Mapping[str, float] | None = None
    ) -> Bindings | None:
        """The rule of every job of S(t) in ``view`` (a replica's own, or merged from the
        digests: the same binding everywhere), with ``budgets`` (a replica's parts of the
        limits); None without rules."""
        binder = self.binder
        if not binder.rules:
            return None
        columns = view.columns
        ids, users, groups = columns.job_id, columns.user, columns.group
        rule_of = {}
        for r in view.active:
            job_id = ids[r]
            rule = binder.rule_for(job_id, users[r], groups[r], self._app(job_id, ""))
            if rule is not None:
                rule_of[job_id] = binder.terms[rule.name]
        return Bindings(rule_of, binder.terms, budgets or {})

    def observe_global(
        self, view: SystemView, rates: Mapping[str, float], bindings: Bindings | None
    ) -> None:
        """The global view's decision of the last exchange (controller/peers.py); its
        capacity is the cluster's (Σ B_r of the replicas in the view)."""
        self.everywhere = sums(bindings, view, rates)
        self._cluster(view.capacity)

    def alone(self) -> None:
        """No peer in the view: the rules hold on this replica's decisions only."""
        self.everywhere = None
        self._cluster(self.capacity)

    def _cluster(self, capacity: float) -> None:
        if capacity != self.cluster:
            before = self.overcommitted()
            self.cluster = capacity
            if self.overcommitted() and not before:
                self._warn()

    def decided(self, decision: Decision, bindings: Bindings | None) -> None:
        """This replica's latest decision, with the bindings it applied (the scheduler)."""
        self._last = (decision, bindings)

    def status(self) -> dict[str, RuleStatus]:
        """Each rule's state as of this replica's latest decision
        (controller/rule_status.py)."""
        if not self.binder.rules:
            return {}
        key = (self._last, self.everywhere, self.version)
        if self._status is not None:
            (last, everywhere, version), held = self._status
            if last is key[0] and everywhere is key[1] and version == key[2]:
                return held
        here: dict[str, tuple[int, float, float]] = {}
        budgets: Mapping[str, float] = {}
        if self._last is not None:
            decision, bindings = self._last
            here = sums(bindings, decision.view, decision.rates)
            budgets = bindings.budgets if bindings is not None else {}
        out = statuses(self.binder.rules, here, budgets, self.everywhere)
        self._status = (key, out)
        return out

    def _app(self, job_id: str, claimed: str) -> str:
        record = self._catalog.registrations.get(job_id)
        if record is not None and record.kind == REGISTRATION:
            return record.app
        return claimed

    def overcommitted(self) -> float:
        """Σ of the reservations in force when it passes the cluster's capacity, else 0."""
        return reservations_over(self.binder.rules, self.cluster)

    # -- changes ---------------------------------------------------------------
    def put(
        self,
        rule: Rule,
        cluster_capacity: float | None = None,
        elsewhere: Collection[str] = (),
    ) -> bool:
        """Adds or replaces ``rule`` (checked: ValueError names the field); True when it
        is new. Overcommitted when the reservations would not fit in ``cluster_capacity``
        (default: this replica's), or those of rules binding only jobs of this replica that
        are not ``elsewhere`` (on a peer) in its capacity (module docstring)."""
        problem = rule_problem(rule)
        if problem is not None:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        after = {r.name: r for r in self.binder.rules}
        new = rule.name not in after
        after[rule.name] = rule
        self._admit(after.values(), cluster_capacity, elsewhere)
        if new and self._catalog.rules_full():
            raise Overcommitted(f"{len(after) - 1} rules: no room for another")
        self._change(self._catalog.stamp(RULE, rule.name, rule=rule))
        return new

    def remove(self, name: str) -> bool:
        """Removes rule ``name``; False when there is none."""
        if self.get(name) is None:
            return False
        self._change(self._catalog.stamp(RULE_REMOVED, name))
        return True

    def _admit(
        self, rules: Iterable[Rule], cluster_capacity: float | None, elsewhere: Collection[str]
    ) -> None:
        rules = list(rules)
        capacity = self.capacity if cluster_capacity is None else cluster_capacity
        total = reservations_over(rules, capacity)
        if total:
            raise Overcommitted(
                f"the reservations sum to {format_rate(total)}, above the capacity "
                f"{format_rate(capacity)}"
            )
        here = [r for r in rules if r.reservation and self._only_here(r, elsewhere)]
        total = reservations_over(here, self.capacity)
        if total:
            raise Overcommitted(
                f"the reservations of rules whose jobs run on this replica only sum to "
                f"{format_rate(total)}, above its capacity {format_rate(self.capacity)}"
            )

    def _only_here(self, rule: Rule, elsewhere: Collection[str]) -> bool:
        """Whether ``rule`` binds jobs of this replica's table now, none of them also on a
        peer (``elsewhere``)."""
        binder = Binder([rule])
        bound = [
            j
            for j, s in self._table.jobs.items()
            if binder.rule_for(j, s.meta.user, s.meta.group, self._app(j, s.meta.app))
        ]
        return bool(bound) and not any(j in elsewhere for j in bound)

    def _change(self, record: CatalogRecord) -> None:
        catalog = self._catalog
        previous = catalog.put(record)
        try:
            self._save()
        except OSError:
            catalog.restore(record.key, previous, record.kind)
            raise
        self._refresh()

    def _adopted(self) -> None:
        try:
            self._save()
        except OSError as exc:  # applied all the same: peers hold them, the next save keeps them
            log.error("could not save the rules from the peers: %s", exc)
        self._refresh()

    def _refresh(self) -> None:
        self.binder = Binder(self._catalog.rule_set())
        self.version += 1
        if self.overcommitted():
            self._warn()
        self.changed()

    def _warn(self) -> None:
        log.warning(
            "the reservations in force sum to %s, above the capacity %s: they are scaled "
            "down to it in proportion (GET /v1/rules)",
            format_rate(self.overcommitted()),
            format_rate(self.cluster),
        )

    # -- state.json --------------------------------------------------------------
    def resume(self, saved: Iterable[SavedRule]) -> None:
        records = []
        for s in saved:
            head = dict(key=s.name, version=max(1, s.version), origin=s.origin or "-")
            if s.removed:
                records.append(CatalogRecord(RULE_REMOVED, **head, changed_at=s.changed_at))
                continue
            body = s.model_dump(exclude={"version", "origin", "changed_at", "removed"})
            rule = Rule(**body)
            if rule_problem(rule) is not None:
                log.error(
                    "saved rule %r is malformed (%s); not resumed", s.name, rule_problem(rule)
                )
                continue
            records.append(CatalogRecord(RULE, **head, changed_at=s.changed_at, rule=rule))
        self._catalog.resume_rules(records)
        self._refresh()

    def _save(self) -> None:
        saved = []
        for name, r in sorted(self._catalog.rules.items()):
            fields = {} if r.rule is None else dataclasses.asdict(r.rule)
            saved.append(
                SavedRule(
                    **{**fields, "name": name},
                    version=r.version,
                    origin=r.origin,
                    changed_at=r.changed_at,
                    removed=r.kind == RULE_REMOVED,
                )
            )
        self._store.update(rules=saved, catalog_clock=self._catalog.clock)


def cluster_capacity(own: float, peers: Iterable[float]) -> float:
    """Σ B_r over this replica and the peers in its view."""
    return math.fsum([own, *peers])
