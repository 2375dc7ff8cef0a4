"""Operator rules inside any policy: reservations, weights and limits on sets of jobs.

An operator's rule (controller/rules.py: matching, storage, replication) binds a set of
jobs, each job to at most one rule (the first that matches it), and may set for the set:

- a **reservation** r: the set gets at least min(r, its demand) whenever it demands;
- a **weight** w: each job's share, as the policy proposes it, is multiplied by w;
- a **limit** L: the set's total is at most L.

:func:`allocate` is the policy's ``allocate`` with the rules applied, whichever policy
(docs/rules.md, "Inside a policy"):

1. The policy shares the capacity among the jobs of S(t) as it always does; the weights
   then scale the shares of the weighted jobs (a weighted water-fill of the same total,
   each job up to its demand: with every weight 1 it gives back the policy's shares).
2. A set whose total is above its limit, or below its reservation (at most its
   demand), is **pinned** there: its jobs share that amount among themselves by
   water-filling their demands, and the policy shares what the pinned sets leave among
   the other jobs, in a view without them (``observed`` False, so a policy that learns
   from the views it is shown does not learn from that partial one). This repeats
   until no set is out of its bounds; then a set pinned at its reservation that the
   policy would now give more (a limit pinned later freed capacity) is unpinned.
3. Reservations that together pass the capacity are scaled down to it in proportion
   (never past B; ``Bindings.overcommitted`` says by how much, and the controller reports
   the rules' reservations over the cluster's capacity: controller/rulebook.py).

Nothing unused is withheld: a pinned set's jobs take what the pin gives them up to their
demand and the rest goes to the others, except what a limit holds back. A set not out of
its bounds is left as the policy proposed it, so a rule that binds nothing costs a pass
over the bound jobs.

``Bindings.budgets``: a replica's part of a limit when it holds its part of a global split
(policies/decision.py: ``blend``; controller/merge.py computes it): the rule's total on
this replica is clamped to it (:func:`clamp`), so the parts of all replicas sum to the
limit.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from burstctl.policies.base import Policy
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId, RowRates, SystemView

# A set's total may pass its bound by this fraction (rounding) before it is pinned.
TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Terms:
    """What one rule sets for its set of jobs: ``limit`` and ``reservation`` in bytes/s
    (inf and 0: none), ``weight`` > 0 (1: none)."""

    name: str
    limit: float = math.inf
    reservation: float = 0.0
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Bindings:
    """Each bound job's rule (``rule_of``: job id → its rule's terms; ``terms``: every
    rule's, by name); ``budgets``: rule name → the most its set may get on this replica (a
    replica's part of a global split)."""

    rule_of: Mapping[JobId, Terms] = field(default_factory=dict)
    terms: Mapping[str, Terms] = field(default_factory=dict)  # every rule's, by name
    budgets: Mapping[str, float] = field(default_factory=dict)

    def binds(self, view: SystemView) -> bool:
        """Whether any job of S(t) in ``view`` is bound to a rule."""
        if not self.rule_of:
            return False
        ids = view.columns.job_id
        rule_of = self.rule_of
        return any(ids[r] in rule_of for r in view.active)

    def sets(self, view: SystemView) -> dict[str, list[int]]:
        """Rule name → the rows of S(t) it binds, in the stable order."""
        out: dict[str, list[int]] = {}
        ids = view.columns.job_id
        for r in view.active:
            terms = self.rule_of.get(ids[r])
            if terms is not None:
                out.setdefault(terms.name, []).append(r)
        return out

    def overcommitted(self, view: SystemView) -> float:
        """Σ of the reservations (each at most its set's demand) of the sets with demand
        in ``view``, when it passes the capacity; 0 otherwise."""
        total = sum(_reserved(self, view).values())
        return total if total > view.capacity * (1 + TOLERANCE) else 0.0


# What a policy's proposal becomes once its bounds are enforced: (row, rate) pairs
# (policies/decision.py passes its own enforcement, the one there is).
Enforce = Callable[[SystemView, RowRates | Mapping[JobId, float]], RowRates]


def allocate(policy: Policy, view: SystemView, bindings: Bindings, enforce: Enforce) -> RowRates:
    """``policy.allocate(view)`` with the rules of ``bindings`` applied (module docstring),
    as (row, rate) pairs enforced by ``enforce``."""
    sets = bindings.sets(view)
    if not sets:
        return enforce(view, policy.allocate(view))
    terms = bindings.terms
    demand = _demand(view)
    reserved = _reserved(bindings, view, sets, demand)
    total_reserved = sum(reserved.values())
    if total_reserved > view.capacity:  # scaled down in proportion: never past B
        scale = view.capacity / total_reserved
        reserved = {name: r * scale for name, r in reserved.items()}
    pins: dict[str, float] = {}
    at_reservation: set[str] = set()
    rates = _shared(policy, view, bindings, sets, pins, demand, enforce)
    for _ in range(2 * len(sets) + 1):
        changed = False
        for name, rows in sets.items():
            if name in pins:
                continue
            total = sum(rates.get(r, 0.0) for r in rows)
            limit = min(terms[name].limit, bindings.budgets.get(name, math.inf))
            if total > limit * (1 + TOLERANCE):
                pins[name] = limit
                changed = True
            elif total < reserved.get(name, 0.0) * (1 - TOLERANCE):
                pins[name] = reserved[name]
                at_reservation.add(name)
                changed = True
        if not changed:
            break
        rates = _shared(policy, view, bindings, sets, pins, demand, enforce)
    for name in sorted(at_reservation):  # the policy may now give more than the reservation
        trial = {n: p for n, p in pins.items() if n != name}
        again = _shared(policy, view, bindings, sets, trial, demand, enforce)
        if sum(again.get(r, 0.0) for r in sets[name]) >= pins[name]:
            pins, rates = trial, again
    return [(r, rate) for r, rate in rates.items() if rate > 0.0]


def clamp(rates: dict[JobId, float], bindings: Bindings) -> dict[JobId, float]:
    """``rates`` with each rule's total within its limit and its budget on this replica:
    a set above scaled down in proportion (what it gives back is left unallotted)."""
    totals: dict[str, float] = {}
    for job_id, rate in rates.items():
        terms = bindings.rule_of.get(job_id)
        if terms is not None:
            totals[terms.name] = totals.get(terms.name, 0.0) + rate
    scale: dict[str, float] = {}
    terms_of = bindings.terms
    for name, total in totals.items():
        bound = min(terms_of[name].limit, bindings.budgets.get(name, math.inf))
        if total > bound * (1 + TOLERANCE):
            scale[name] = bound / total
    if not scale:
        return rates
    out = {}
    for job_id, rate in rates.items():
        terms = bindings.rule_of.get(job_id)
        out[job_id] = rate * scale.get(terms.name, 1.0) if terms is not None else rate
    return out


def budgets(
    bindings: Bindings,
    rates: Mapping[JobId, float],
    here: Mapping[JobId, float],
    capacity: float,
    total_capacity: float,
) -> dict[str, float]:
    """Each limited rule's budget on one replica of a global split: what the split gives
    its jobs there (``here``, of the global ``rates``) plus that replica's part, pro rata to
    its ``capacity`` of the ``total_capacity``, of the limit the split leaves unused. The
    budgets of all replicas sum to the limit, so topping jobs up between exchanges never
    takes a set past it together."""
    used: dict[str, float] = {}
    mine: dict[str, float] = {}
    for job_id, rate in rates.items():
        terms = bindings.rule_of.get(job_id)
        if terms is not None and terms.limit < math.inf:
            used[terms.name] = used.get(terms.name, 0.0) + rate
            mine[terms.name] = mine.get(terms.name, 0.0) + here.get(job_id, 0.0)
    part = capacity / total_capacity if total_capacity > 0.0 else 0.0
    return {
        name: mine.get(name, 0.0) + max(0.0, t.limit - used.get(name, 0.0)) * part
        for name, t in bindings.terms.items()
        if t.limit < math.inf
    }


def _demand(view: SystemView) -> dict[int, float]:
    columns = view.columns
    return {r: min(columns.demand[r], columns.cap[r]) for r in view.active}


def _reserved(
    bindings: Bindings,
    view: SystemView,
    sets: dict[str, list[int]] | None = None,
    demand: dict[int, float] | None = None,
) -> dict[str, float]:
    """Rule name → its reservation, at most its set's demand (0s left out)."""
    sets = bindings.sets(view) if sets is None else sets
    demand = _demand(view) if demand is None else demand
    terms = bindings.terms
    out = {}
    for name, rows in sets.items():
        r = min(terms[name].reservation, sum(demand[row] for row in rows))
        if r > 0.0:
            out[name] = r
    return out


def _shared(
    policy: Policy,
    view: SystemView,
    bindings: Bindings,
    sets: dict[str, list[int]],
    pins: dict[str, float],
    demand: dict[int, float],
    enforce: Enforce,
) -> dict[int, float]:
    """Row → rate: each pinned set's pin water-filled over its jobs' demands, and the
    policy's shares (weighted) of what the pins leave over the other jobs."""
    rates: dict[int, float] = {}
    pinned_rows: set[int] = set()
    for name, amount in pins.items():
        rows = sets[name]
        pinned_rows.update(rows)
        ceilings = {r: demand[r] for r in rows}
        rates.update(water_fill(ceilings, dict.fromkeys(rows, 1.0), amount))
    if pins:
        rows = [r for r in view.rows if r not in pinned_rows]
        active = [r for r in view.active if r not in pinned_rows]
        left = max(0.0, view.capacity - sum(rates.values()))
        sub = SystemView.of_columns(
            view.now,
            left,
            view.node_bandwidth,
            view.columns,
            rows,
            active,
            seed=view.seed,
            horizon=view.horizon,
            observed=False,
            periodic=view.periodic,
            buffer=view.buffer,
        )
    else:
        sub = view
    shares = dict(enforce(sub, policy.allocate(sub)))
    weighted = {r: t.weight for r in shares if (t := _terms_of(bindings, view, r)) is not None}
    if any(w != 1.0 for w in weighted.values()):
        weights = {r: rate * weighted.get(r, 1.0) for r, rate in shares.items()}
        ceilings = {r: demand[r] for r in shares}
        shares = water_fill(ceilings, weights, sum(shares.values()))
    rates.update(shares)
    return rates


def _terms_of(bindings: Bindings, view: SystemView, row: int) -> Terms | None:
    return bindings.rule_of.get(view.columns.job_id[row])
