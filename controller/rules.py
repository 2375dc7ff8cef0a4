"""Operator rules: what one says, the one check of it, and which job it binds.

A rule (docs/rules.md) has a ``name`` (its identity), a ``rank`` and a match: any of
``job``, ``user``, ``group`` and ``app``, each an exact name or a shell-style pattern
(``dd*``, ``u[0-9]``; ``fnmatch``, case-sensitive), all of those given to hold. It sets any
of a ``limit`` and a ``reservation`` (bytes/s, on the bound jobs' total across all
replicas), a ``weight`` (a multiplier on the policy's shares) and ``metadata_ops`` (the
metadata operations per second each bound job may make). A job is bound by the first rule
that matches it in ``(rank, name)`` order, and by no other (as Lustre's TBF rules are
ranked): the rule that binds a job is one name.

A job's app is its registration's (``POST /v1/jobs``), which the catalog holds on every
replica, so every replica binds every job alike from its id, user and group; a job with no
registered app matches no ``app`` pattern.

:func:`rule_problem` is the one check of a rule, for REST bodies, saved state and peers'
records alike, naming the field as the REST body names it (``match.user``, ``limit``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from burstctl.common.limits import MAX_RATE, MAX_TEXT, identifier_problem
from burstctl.common.units import format_rate
from burstctl.policies.rules import Terms

MATCH_KEYS = ("job", "user", "group", "app")
MAX_RULES = 256
MAX_WEIGHT = 1e6
MAX_METADATA_OPS = 1e9
DEFAULT_RANK = 100


@dataclass(frozen=True, slots=True)
class Rule:
    """One operator rule (module docstring). 0 for ``limit``, ``reservation`` and
    ``metadata_ops``: none; ``weight`` 1: none; "" for a match key: any."""

    name: str
    rank: int = DEFAULT_RANK
    job: str = ""
    user: str = ""
    group: str = ""
    app: str = ""
    limit: float = 0.0
    reservation: float = 0.0
    weight: float = 1.0
    metadata_ops: float = 0.0

    @property
    def order(self) -> tuple[int, str]:
        return self.rank, self.name

    def match(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in MATCH_KEYS if getattr(self, k)}

    def matches(self, job_id: str, user: str, group: str, app: str) -> bool:
        for pattern, value in (
            (self.job, job_id),
            (self.user, user),
            (self.group, group),
            (self.app, app),
        ):
            if pattern and not (pattern == value or (value and fnmatchcase(value, pattern))):
                return False
        return True

    def terms(self) -> Terms:
        return Terms(
            self.name,
            limit=self.limit if self.limit > 0.0 else math.inf,
            reservation=self.reservation,
            weight=self.weight,
        )


def rule_problem(rule: Rule) -> tuple[str, str] | None:
    """Why ``rule`` is malformed, as ``(field, reason)``, or None."""
    problem = identifier_problem(rule.name)
    if problem:
        return "name", problem
    if not -(2**31) <= rule.rank < 2**31:
        return "rank", f"must be a 32-bit integer, got {rule.rank!r}"
    if not rule.match():
        return "match", "must name at least one of job, user, group, app"
    for key in MATCH_KEYS:
        pattern = getattr(rule, key)
        if len(pattern) > MAX_TEXT or not pattern.isprintable():
            return f"match.{key}", f"must be at most {MAX_TEXT} printable characters"
    for name in ("limit", "reservation"):
        value = getattr(rule, name)
        if not 0.0 <= value <= MAX_RATE:
            return name, f"must be in [0, {MAX_RATE:g}] bytes/s, got {value!r}"
    if not 0.0 < rule.weight <= MAX_WEIGHT:
        return "weight", f"must be in (0, {MAX_WEIGHT:g}], got {rule.weight!r}"
    if not 0.0 <= rule.metadata_ops <= MAX_METADATA_OPS:
        return "metadata_ops", f"must be in [0, {MAX_METADATA_OPS:g}] ops/s"
    if rule.limit and rule.reservation > rule.limit:
        return "reservation", (
            f"{format_rate(rule.reservation)} is above the rule's limit {format_rate(rule.limit)}"
        )
    if not (rule.limit or rule.reservation or rule.weight != 1.0 or rule.metadata_ops):
        return "limit", "a rule sets at least one of limit, reservation, weight, metadata_ops"
    return None


def ranked(rules: Iterable[Rule]) -> list[Rule]:
    """Rules in the order they bind jobs: ``(rank, name)``."""
    return sorted(rules, key=lambda r: r.order)


class Binder:
    """Which rule binds a job, for a fixed set of rules (ranked once); remembered per
    ``(job, user, group, app)`` for as long as the rules do not change."""

    __slots__ = ("_cache", "rules", "terms")

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = ranked(rules)
        self.terms = {r.name: r.terms() for r in self.rules}
        self._cache: dict[tuple[str, str, str, str], Rule | None] = {}

    def rule_for(self, job_id: str, user: str, group: str, app: str) -> Rule | None:
        key = (job_id, user, group, app)
        try:
            return self._cache[key]
        except KeyError:
            pass
        found = next((r for r in self.rules if r.matches(job_id, user, group, app)), None)
        if len(self._cache) >= 4 * 100_000:  # jobs come and go: never grows without bound
            self._cache.clear()
        self._cache[key] = found
        return found


def reservations_over(rules: Iterable[Rule], capacity: float) -> float:
    """Σ of the rules' reservations when it passes ``capacity``, else 0."""
    total = math.fsum(r.reservation for r in rules)
    return total if total > capacity * (1 + 1e-9) else 0.0
