"""ThemisIO's statistical-token fair sharing: job-, user-, size-, priority-fair and compositions.

The ThemisIO paper ([THEMIS] §2.2.2, §3, §4.1) names a policy by its *sharing
entities*, from the root down: ``user>size`` splits the resource evenly among
users, then each user's part among that user's jobs in proportion to their node
counts. A spec is a path of levels joined by ``>``:

- ``group``, ``user``: an even split among the distinct groups (users) present
  under the parent; a user seen under two groups is two entities there;
- ``job``: an even split among the jobs under the parent;
- ``size``: among the jobs under the parent in proportion to nodes p_i;
- ``priority``: among the jobs under the parent in proportion to priority.

``job``, ``size`` and ``priority`` pick jobs, so a spec ends with exactly one of
them; ``user``/``group`` may come before it, each at most once, in either order.
The paper's "user-fair" is ``user>job`` (the paper serves a user's requests in
FIFO order; as rates, its jobs share evenly).

A job's token share is its column of the chain product of the transition
matrices, eq. (1); each column of T^i has one non-zero entry, so the product is
the product of the shares along the job's path in the tree, which is how it is
computed here. Opportunity fairness: only jobs with demand build the tree
(idle entities drop out at every level, not only at the leaves), and rates come
from a capped water-filling down the tree: each node's bandwidth is split among
its children by their weights, each child capped at its subtree's demand, so
what a job cannot use goes to its siblings first, then up. Σ rates = min(B,
Σ demand), and rates = B × share when nobody is capped.

A child whose weight is not a positive finite number (priority 0) gets a share
only when none of its siblings has a positive weight, and, as a rate, only what
its positive-weight siblings leave. The controller never sends such jobs.

``draw`` is the paper's worker draw for a request-grant mode and the simulator:
the same tree over the jobs with pending requests, one uniform number in
[0, 1), the job whose segment holds it.
"""

from __future__ import annotations

import functools
import math
import random
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import ClassVar

from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId, JobView, SystemView

# The sharing entities, in the order error messages list them.
LEVELS = ("job", "user", "group", "size", "priority")
# Levels that split among jobs: a spec ends with one of them.
JOB_LEVELS = frozenset({"job", "size", "priority"})

# user/group level → the entity a job belongs to there (an even split among entities)
_GROUPING: dict[str, Callable[[JobView], str]] = {
    "user": attrgetter("user"),
    "group": attrgetter("group"),
}
# job, size or priority level → a job's weight among its siblings
_JOB_WEIGHT: dict[str, Callable[[JobView], float]] = {
    "job": lambda job: 1.0,
    "size": lambda job: float(job.nodes),  # size-fair: ∝ p_i
    "priority": lambda job: job.priority,
}

_STABLE_ORDER = attrgetter("index", "job_id")


class SpecError(ValueError):
    """A sharing spec that is not a valid path of levels; the message names the level."""


def parse_spec(spec: str) -> tuple[str, ...]:
    """``"group > user > size"`` → ``("group", "user", "size")``; SpecError names the bad level.

    Case and blanks around ``>`` are ignored; ``">".join(result)`` is the canonical spelling.
    """
    levels: list[str] = []
    for position, raw in enumerate(spec.split(">"), start=1):
        level = raw.strip().lower()
        if not level:
            raise SpecError(f"bad sharing spec {spec!r}: level {position} is empty")
        if level not in LEVELS:
            raise SpecError(
                f"bad sharing spec {spec!r}: level {position} {raw.strip()!r} is not a "
                f"sharing entity ({', '.join(LEVELS)})"
            )
        if level in levels:
            raise SpecError(
                f"bad sharing spec {spec!r}: level {position} {level!r} repeats "
                f"level {levels.index(level) + 1}"
            )
        if levels and levels[-1] in JOB_LEVELS:
            raise SpecError(
                f"bad sharing spec {spec!r}: level {position} {level!r} comes after "
                f"{levels[-1]!r} (level {position - 1}), which already splits among jobs; "
                "a spec ends at its job, size or priority level"
            )
        levels.append(level)
    if levels[-1] not in JOB_LEVELS:
        raise SpecError(
            f"bad sharing spec {spec!r}: level {len(levels)} {levels[-1]!r} does not pick "
            f"a job; end the spec with job, size or priority, e.g. "
            f"{'>'.join([*levels, 'job'])!r}"
        )
    return tuple(levels)


def is_spec(name: str) -> bool:
    """Whether a policy name is meant as a sharing spec: a path with ``>`` or one level name."""
    return ">" in name or name.strip().lower() in LEVELS


# ---------------------------------------------------------------------------
# The sharing tree


@dataclass(slots=True)
class _Node:
    """A sharing entity: the root, a group, a user, or a job (a leaf)."""

    weight: float = 1.0  # relative to its siblings; > 0 and finite, or 0
    demand: float = 0.0  # Σ demand of the jobs below
    job: JobView | None = None
    children: dict[str, _Node] = field(default_factory=dict)


def _tree(levels: tuple[str, ...], jobs: Iterable[JobView]) -> _Node:
    """The hierarchy of ``jobs`` under ``levels``; children keep the jobs' order."""
    root = _Node()
    weight_of = _JOB_WEIGHT[levels[-1]]
    groupings = [_GROUPING[level] for level in levels[:-1]]
    for job in jobs:
        node = root
        node.demand += job.demand
        for entity_of in groupings:
            key = entity_of(job)
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node()
            node = child
            node.demand += job.demand
        weight = weight_of(job)
        if not (weight > 0.0 and math.isfinite(weight)):
            weight = 0.0
        node.children[job.job_id] = _Node(weight=weight, demand=job.demand, job=job)
    return root


def _row(node: _Node) -> list[float]:
    """The node's row of T^i restricted to its children: weights over their sum (Σ = 1)."""
    weights = [child.weight for child in node.children.values()]
    total = sum(weights)
    if total > 0.0:
        return [w / total for w in weights]
    return [1.0 / len(weights)] * len(weights)  # only zero weights: an even split


def _shares(node: _Node, share: float, out: dict[JobId, float]) -> None:
    if node.job is not None:
        out[node.job.job_id] = share
        return
    for child, fraction in zip(node.children.values(), _row(node), strict=True):
        # The job's column of ∏_{i=0}^{N−1} T^i, eq. (1): each column of T^i has
        # one non-zero entry, so the product is the product along the path.
        _shares(child, share * fraction, out)


def _split(node: _Node, bandwidth: float) -> dict[str, float]:
    """Capped water-filling of ``bandwidth`` among the node's children."""
    children = node.children
    ceilings = {key: child.demand for key, child in children.items()}
    weights = {key: child.weight for key, child in children.items()}
    return _capped_split(ceilings, weights, bandwidth)


def _flat(level: str, jobs: list[JobView], bandwidth: float) -> dict[JobId, float]:
    """``_fill(_tree((level,), jobs), bandwidth, out)`` for a one-level spec, without
    the tree: the root's split among the jobs is the whole allocation."""
    weight_of = _JOB_WEIGHT[level]
    ceilings = {job.job_id: job.demand for job in jobs}
    weights = {}
    for job in jobs:
        weight = weight_of(job)
        weights[job.job_id] = weight if weight > 0.0 and math.isfinite(weight) else 0.0
    return _capped_split(ceilings, weights, bandwidth)


def _capped_split(
    ceilings: dict[str, float], weights: dict[str, float], bandwidth: float
) -> dict[str, float]:
    """Water-filling of ``bandwidth`` by weight under the ceilings; zero weights only
    share what the weighted ones leave."""
    rates = water_fill(ceilings, weights, bandwidth)
    scavengers = [key for key, weight in weights.items() if weight == 0.0]
    if scavengers:  # zero weights: only what the weighted siblings leave, evenly
        weighted_demand = sum(ceilings[key] for key, w in weights.items() if w > 0.0)
        if weighted_demand < bandwidth:
            rates.update(
                water_fill(
                    {key: ceilings[key] for key in scavengers},
                    dict.fromkeys(scavengers, 1.0),
                    bandwidth - weighted_demand,
                )
            )
    return rates


def _fill(node: _Node, bandwidth: float, out: dict[JobId, float]) -> None:
    if node.job is not None:
        out[node.job.job_id] = bandwidth
        return
    rates = _split(node, bandwidth)
    for key, child in node.children.items():
        _fill(child, rates[key], out)


# ---------------------------------------------------------------------------
# The draw


@dataclass(frozen=True, slots=True)
class Segments:
    """The paper's split of [0, 1): job k owns [ends[k−1], ends[k]), of length its share."""

    job_ids: tuple[JobId, ...]
    ends: tuple[float, ...]

    @classmethod
    def of(cls, shares: dict[JobId, float]) -> Segments:
        ends: list[float] = []
        total = 0.0
        last = -1  # the last job with a positive share owns up to exactly 1
        for k, share in enumerate(shares.values()):
            total += share
            ends.append(total)
            if share > 0.0:
                last = k
        if last >= 0:
            ends[last:] = [1.0] * (len(ends) - last)
        return cls(tuple(shares), tuple(ends))

    def pick(self, r: float) -> JobId:
        """The job whose segment holds ``r`` ∈ [0, 1)."""
        return self.job_ids[bisect_right(self.ends, r)]

    def draw(self, rng: random.Random) -> JobId:
        return self.pick(rng.random())


# ---------------------------------------------------------------------------
# The policies


class StatisticalTokens(Policy):
    """One sharing spec; get the class for a spec with ``policy_class(spec)``.

    ``name`` is the canonical spec (``"group>user>size"``), ``levels`` its levels.
    """

    levels: ClassVar[tuple[str, ...]]
    reads = frozenset({"user", "group", "nodes", "priority", "demand"})  # the tree, demands

    def allocate(self, view: SystemView) -> dict[JobId, float]:
        rates: dict[JobId, float] = {}
        active = view.active_jobs()
        if not active:
            return rates
        if len(self.levels) == 1:  # job-, size- or priority-fair: no tree needed
            return _flat(self.levels[0], active, view.capacity)
        _fill(_tree(self.levels, active), view.capacity, rates)
        return rates

    def shares(self, view: SystemView) -> dict[JobId, float]:
        """The token share of every job with demand, eq. (1); Σ = 1 (none: empty).

        In tree order (the paper's segment order): depth first, entities in the
        order of their first job in the view's stable order (``index``, then id).
        """
        return self._shares_of(view.active_jobs())

    def segments(self, view: SystemView, pending: Collection[JobId]) -> Segments:
        """Segments over the jobs of ``view`` that are in ``pending``, in tree order.

        The tree is pruned to those jobs and the product recomputed (§3 and §4.1
        leave a draw on an empty queue open; this reading is in docs/references.md),
        so a user whose other jobs have nothing pending keeps the user's whole share.
        Demand is not looked at: a pending request is the demand here.
        """
        wanted = pending if isinstance(pending, set | frozenset) else set(pending)
        jobs = sorted((j for j in view.jobs.values() if j.job_id in wanted), key=_STABLE_ORDER)
        return Segments.of(self._shares_of(jobs))

    def draw(
        self, view: SystemView, pending: Collection[JobId], rng: random.Random
    ) -> JobId | None:
        """The job whose next request a worker serves: one ``rng.random()`` on the
        segments of ``segments(view, pending)``; None when no pending job is in ``view``."""
        segments = self.segments(view, pending)
        return segments.draw(rng) if segments.job_ids else None

    def _shares_of(self, jobs: list[JobView]) -> dict[JobId, float]:
        shares: dict[JobId, float] = {}
        if jobs:
            _shares(_tree(self.levels, jobs), 1.0, shares)
        return shares

    def __repr__(self) -> str:
        return f"StatisticalTokens({self.name!r})"

    def __reduce__(self) -> tuple[object, ...]:
        # the class is made at run time: pickle the spec, not a class path
        return (_restore, (self.name, self.params))


def _restore(spec: str, params: PolicyParams) -> StatisticalTokens:
    return policy_class(spec)(params)


def policy_class(spec: str) -> type[StatisticalTokens]:
    """The policy class of a sharing spec, one per canonical spec; SpecError if invalid."""
    return _class_for(parse_spec(spec))


@functools.cache
def _class_for(levels: tuple[str, ...]) -> type[StatisticalTokens]:
    class Spec(StatisticalTokens):
        name = ">".join(levels)

    Spec.levels = levels
    Spec.__name__ = Spec.__qualname__ = f"StatisticalTokens[{Spec.name}]"
    return Spec


# The registered names (policies/registry.py); any other valid spec works too.
JobFair = policy_class("job")
UserFair = policy_class("user>job")
GroupFair = policy_class("group>job")
SizeFair = policy_class("size")
PriorityFair = policy_class("priority")
UserSizeFair = policy_class("user>size")
GroupSizeFair = policy_class("group>size")
GroupUserFair = policy_class("group>user>job")
GroupUserSizeFair = policy_class("group>user>size")
