"""The replicated catalog: job registrations and placement profiles on every replica.

A record is a job's registration (``POST /v1/jobs``: user, group, nodes, priority, a declared
period ``w``/``vol_io``, ``app``), its retirement (``DELETE``: a tombstone), or an
application's placement profile (controller/profiles.py). Its identity is ``(kind, key)``, a
registration and its retirement sharing one, plus the node count for a profile (the
application key is ``(name, nodes)``). Each record carries ``(version, origin)``, ordered as
the policy election orders policies: a change made on replica r takes version = the highest
version this replica has seen in the catalog + 1 and origin = r; a replica holds, per
identity, the record with the highest ``(version, origin)``. That merge is idempotent,
commutative and associative, so every replica that received the same records holds the same
catalog whatever the order they came in, and concurrent changes of one identity on two
replicas resolve to the same winner everywhere. The version is a Lamport clock over the
whole catalog (not per identity), so a change made after a replica saw a retirement always
wins over that retirement, even once the tombstone is gone.

A tombstone is kept ``TOMBSTONE_SECONDS`` after its ``changed_at`` (the origin's wall clock),
then dropped: a replica that was away longer than that and comes back with the registration
in its state brings it back (docs/replicas.md, "The catalog").

Bounds (``common/limits.py``): at most ``MAX_JOBS`` registration records (tombstones
included: the oldest tombstone makes room first) and, in one digest, ``MAX_RECORDS`` records;
every field is checked at the door (``records_problem``) and a bad one is named as on the
wire (``catalog[2].user``). Profiles are bounded by their store (``profile_max_keys``).

:class:`Catalog` owns the registration records (persisted by controller/registrations.py in
``state.json``) and the version clock; the profiles stay with their store, each with its
``(version, origin)``, and are read from it as records. Peers' records arrive through
:meth:`Catalog.receive`: a winning registration or retirement goes to whoever listens on
``adopted`` (``Registrations``: the job table, the trust rule, ``state.json``), a winning
profile into the store.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from burstctl.common.limits import (
    MAX_COUNTER,
    MAX_JOBS,
    MAX_NODES,
    MAX_PRIORITY,
    MAX_RATE,
    identifier_problem,
    period_problem,
)
from burstctl.controller.profiles import MAX_REPLICA_COUNT, AppKey, AppProfile, ProfileStore
from burstctl.controller.rules import MAX_RULES, Rule, rule_problem
from burstctl.controller.signal import Signal
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

log = logging.getLogger(__name__)

REGISTRATION = "registration"
RETIRED = "retired"  # a registration's tombstone
PROFILE = "profile"
RULE = "rule"  # an operator rule (controller/rules.py)
RULE_REMOVED = "rule_removed"  # a rule's tombstone
KINDS = (REGISTRATION, RETIRED, PROFILE, RULE, RULE_REMOVED)
TOMBSTONES = (RETIRED, RULE_REMOVED)
# A retirement is remembered this long after it was made, then forgotten.
TOMBSTONE_SECONDS = 7 * 86_400.0
MAX_REGISTRATIONS = MAX_JOBS
MAX_RULE_RECORDS = 4 * MAX_RULES  # rules and their tombstones
# in one digest: registrations, profiles and rules
MAX_RECORDS = MAX_REGISTRATIONS + MAX_JOBS + MAX_RULE_RECORDS

# What a registration says of its job: the fields of ``POST /v1/jobs`` but the id.
REGISTRATION_FIELDS = ("user", "group", "nodes", "priority", "w", "vol_io", "app")
# What a rule says, on the wire: its fields but the name (the record's key).
RULE_FIELDS = tuple(f for f in Rule.__dataclass_fields__ if f != "name")

Identity = tuple[str, str, int]  # (registration or profile, key, nodes of a profile or 0)


@dataclass(frozen=True, slots=True)
class CatalogRecord:
    """One record (module docstring); the fields of the other kinds keep their defaults."""

    kind: str
    key: str  # job id; application name
    version: int
    origin: str
    changed_at: float  # origin's wall clock, s since the epoch
    nodes: int = 0  # registration: p_i; profile: Q_j (part of its identity)
    user: str = ""
    group: str = ""
    priority: float = 1.0
    w: float = 0.0
    vol_io: float = 0.0
    app: str = ""
    volume_per_phase: float = 0.0
    compute_seconds: float = 0.0
    phases: int = 0
    gaps: int = 0
    bandwidth: tuple[tuple[int, float], ...] = ()  # (n, b_j(n)), n ascending
    rule: Rule | None = None  # a rule's (its name is the key)

    @property
    def identity(self) -> Identity:
        if self.kind == PROFILE:
            return PROFILE, self.key, self.nodes
        if self.kind in (RULE, RULE_REMOVED):
            return RULE, self.key, 0
        return REGISTRATION, self.key, 0

    @property
    def order(self) -> tuple[int, str]:
        """What decides between two records of one identity: the highest wins."""
        return self.version, self.origin

    def profile(self) -> AppProfile:
        return AppProfile(
            volume_per_phase=self.volume_per_phase,
            compute_seconds=self.compute_seconds,
            phases=self.phases,
            gaps=self.gaps,
            bandwidth=dict(self.bandwidth),
            version=self.version,
            origin=self.origin,
            changed_at=self.changed_at,
        )


def profile_record(key: AppKey, profile: AppProfile) -> CatalogRecord:
    name, nodes = key
    return CatalogRecord(
        PROFILE,
        name,
        profile.version,
        profile.origin,
        profile.changed_at,
        nodes=nodes,
        volume_per_phase=profile.volume_per_phase,
        compute_seconds=profile.compute_seconds,
        phases=profile.phases,
        gaps=profile.gaps,
        bandwidth=tuple(sorted(profile.bandwidth.items())),
    )


def newest(records: Iterable[CatalogRecord]) -> dict[Identity, CatalogRecord]:
    """Per identity, the record with the highest ``(version, origin)``: the merge."""
    out: dict[Identity, CatalogRecord] = {}
    for record in records:
        held = out.get(record.identity)
        if held is None or record.order > held.order:
            out[record.identity] = record
    return out


def changed_since(sent: Sequence[CatalogRecord], built: Sequence[CatalogRecord]) -> tuple:
    """The records of ``built`` that ``sent`` does not hold as they are: what a delta carries."""
    if sent is built:
        return ()
    held = {(r.identity, r.order) for r in sent}
    return tuple(r for r in built if (r.identity, r.order) not in held)


def merged(base: Sequence[CatalogRecord], delta: Sequence[CatalogRecord]) -> tuple:
    """``base`` with the records of ``delta`` merged in (a delta applied to its base)."""
    if not delta:
        return tuple(base)
    return tuple(newest([*base, *delta]).values())


# ---------------------------------------------------------------------------
# The check


def records_problem(records: Sequence[CatalogRecord]) -> tuple[str, str] | None:
    """Why ``records`` (a digest's catalog) are malformed, as ``(field, reason)`` with the
    field named as on the wire (``catalog[2].user``), or None."""
    if len(records) > MAX_RECORDS:
        return "catalog", f"more than {MAX_RECORDS} records"
    seen: set[Identity] = set()
    for i, record in enumerate(records):
        problem = _record_problem(record)
        if problem is not None:
            return f"catalog[{i}].{problem[0]}", problem[1]
        if record.identity in seen:
            return f"catalog[{i}].key", f"a second record of {record.kind} {record.key!r}"
        seen.add(record.identity)
    return None


def _record_problem(r: CatalogRecord) -> tuple[str, str] | None:
    if r.kind not in KINDS:
        return "body", "must be a registration, a retirement, a profile or a rule"
    for name in ("key", "origin"):
        problem = identifier_problem(getattr(r, name))
        if problem:
            return name, problem
    if not 1 <= r.version <= MAX_COUNTER:
        return "version", f"must be in [1, 2^63 − 1], got {r.version!r}"
    if not 0.0 <= r.changed_at < math.inf:
        return "changed_at", f"must be finite and >= 0, got {r.changed_at!r}"
    if r.kind in TOMBSTONES:
        return None
    if r.kind == RULE:
        if r.rule is None or r.rule.name != r.key:
            return "rule.name", "must be the record's key"
        problem = rule_problem(r.rule)
        return None if problem is None else (f"rule.{problem[0]}", problem[1])
    if not 1 <= r.nodes <= MAX_NODES:
        return "nodes", f"must be an integer in [1, {MAX_NODES}], got {r.nodes!r}"
    if r.kind == REGISTRATION:
        for name in ("user", "group"):
            problem = identifier_problem(getattr(r, name))
            if problem:
                return name, problem
        if not 0.0 < r.priority <= MAX_PRIORITY:
            return "priority", f"must be in (0, {MAX_PRIORITY:g}], got {r.priority!r}"
        period = period_problem(r.w, r.vol_io)
        if period is not None:
            return period
        if r.app and (problem := identifier_problem(r.app)):
            return "app", problem
        return None
    for name in ("volume_per_phase", "compute_seconds"):
        if not 0.0 <= getattr(r, name) < math.inf:
            return name, f"must be finite and >= 0, got {getattr(r, name)!r}"
    for name in ("phases", "gaps"):
        if not 0 <= getattr(r, name) <= MAX_COUNTER:
            return name, f"must be in [0, 2^63 − 1], got {getattr(r, name)!r}"
    if len(r.bandwidth) > MAX_REPLICA_COUNT:
        return "bandwidth", f"{len(r.bandwidth)} entries, more than {MAX_REPLICA_COUNT}"
    counts = [n for n, _ in r.bandwidth]
    for j, (n, b) in enumerate(r.bandwidth):
        if not 1 <= n <= MAX_REPLICA_COUNT or n in counts[:j]:
            return f"bandwidth_replicas[{j}]", f"must be distinct, in [1, {MAX_REPLICA_COUNT}]"
        if not 0.0 < b <= MAX_RATE:
            return f"bandwidth[{j}]", f"must be in (0, {MAX_RATE:g}] bytes/s, got {b!r}"
    return None


# ---------------------------------------------------------------------------
# The wire


def to_wire(records: Iterable[CatalogRecord]) -> list[pb.CatalogRecord]:
    out = []
    for r in records:
        msg = pb.CatalogRecord(
            key=r.key, version=r.version, origin=r.origin, changed_at=r.changed_at
        )
        if r.kind == REGISTRATION:
            msg.registration.CopyFrom(
                pb.CatalogRegistration(**{f: getattr(r, f) for f in REGISTRATION_FIELDS})
            )
        elif r.kind == RETIRED:
            msg.retired.SetInParent()
        elif r.kind == RULE and r.rule is not None:
            msg.rule.CopyFrom(pb.CatalogRule(**{f: getattr(r.rule, f) for f in RULE_FIELDS}))
        elif r.kind == RULE_REMOVED:
            msg.rule_removed.SetInParent()
        elif r.kind == PROFILE:
            msg.profile.CopyFrom(
                pb.CatalogProfile(
                    nodes=r.nodes,
                    volume_per_phase=r.volume_per_phase,
                    compute_seconds=r.compute_seconds,
                    phases=r.phases,
                    gaps=r.gaps,
                    bandwidth_replicas=[n for n, _ in r.bandwidth],
                    bandwidth=[b for _, b in r.bandwidth],
                )
            )
        out.append(msg)
    return out


def from_wire(messages: Sequence[pb.CatalogRecord]) -> tuple[CatalogRecord, ...]:
    """The records of ``messages``, unchecked: ``records_problem`` is the one check. Past
    ``MAX_RECORDS`` only one more is read (enough for the check to refuse them); a profile's
    bandwidth entries without their count or rate are NaN or 0 (refused by the check)."""
    out = []
    for msg in messages[: MAX_RECORDS + 1]:
        kind = msg.WhichOneof("body") or ""
        head: dict[str, Any] = {
            "key": msg.key,
            "version": msg.version,
            "origin": msg.origin,
            "changed_at": msg.changed_at,
        }
        if kind == REGISTRATION:
            g = msg.registration
            body: dict[str, Any] = {f: getattr(g, f) for f in REGISTRATION_FIELDS}
        elif kind == PROFILE:
            p = msg.profile
            body = {
                "nodes": p.nodes,
                "volume_per_phase": p.volume_per_phase,
                "compute_seconds": p.compute_seconds,
                "phases": p.phases,
                "gaps": p.gaps,
                "bandwidth": tuple(
                    itertools.zip_longest(p.bandwidth_replicas, p.bandwidth, fillvalue=math.nan)
                ),
            }
        elif kind == RULE:
            body = {"rule": Rule(msg.key, **{f: getattr(msg.rule, f) for f in RULE_FIELDS})}
        else:
            body = {}
        out.append(CatalogRecord(kind, **head, **body))
    return tuple(out)


# ---------------------------------------------------------------------------
# One replica's catalog


class Catalog:
    """The catalog of replica ``replica_id``: its registration records and version clock, and
    the profiles of ``profiles`` (module docstring). ``adopted(record, previous)`` fires for
    a peer's registration or retirement that won over what this replica held."""

    def __init__(
        self,
        replica_id: str,
        profiles: ProfileStore,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.replica_id = replica_id
        self.profiles = profiles
        self._wall_clock = wall_clock
        self.registrations: dict[str, CatalogRecord] = {}  # job id -> its record
        self.rules: dict[str, CatalogRecord] = {}  # rule name -> its record (or tombstone)
        # A peer's rule or rule removal won here (after ``settled``'s listeners, once per
        # digest): what applies the rules reads them again.
        self.rules_adopted = Signal()
        self.clock = 0  # the highest version seen in the catalog
        self.adopted = Signal()
        # After a peer's records were taken, all of them: what persists them saves once.
        self.settled = Signal()
        self.received = 0  # peers' records that won here
        self._cache: tuple[tuple[int, int], tuple[CatalogRecord, ...]] | None = None
        self._changes = 0  # bumped when a registration record changes
        self._oldest_tombstone = math.inf  # changed_at of the oldest tombstone held, or less

    # -- local changes ---------------------------------------------------------
    def stamp(self, kind: str, key: str, **body: Any) -> CatalogRecord:
        """A new record of this replica for ``key``, the next version; not held yet (``put``)."""
        return CatalogRecord(kind, key, self.clock + 1, self.replica_id, self._wall_clock(), **body)

    def _store(self, kind: str) -> dict[str, CatalogRecord]:
        return self.rules if kind in (RULE, RULE_REMOVED) else self.registrations

    def put(self, record: CatalogRecord) -> CatalogRecord | None:
        """Holds a registration, rule or tombstone record; the one it replaced."""
        self.clock = max(self.clock, record.version)
        store = self._store(record.kind)
        previous = store.get(record.key)
        store[record.key] = record
        if record.kind in TOMBSTONES:
            self._oldest_tombstone = min(self._oldest_tombstone, record.changed_at)
        self._changes += 1
        self._bound()
        return previous

    def restore(self, key: str, previous: CatalogRecord | None, kind: str = REGISTRATION) -> None:
        """Undoes a ``put`` of a ``kind`` record that could not be persisted (the clock
        keeps its value)."""
        store = self._store(kind)
        if previous is None:
            store.pop(key, None)
        else:
            store[key] = previous
            if previous.kind in TOMBSTONES:
                self._oldest_tombstone = min(self._oldest_tombstone, previous.changed_at)
        self._changes += 1

    def next_stamp(self) -> tuple[int, str, float]:
        """A new version of this replica, for a profile it measured (``PhaseRecorder``)."""
        self.clock += 1
        return self.clock, self.replica_id, self._wall_clock()

    def registered(self) -> list[CatalogRecord]:
        """The live registration records (no tombstones), by job id."""
        return [r for _, r in sorted(self.registrations.items()) if r.kind == REGISTRATION]

    def rule_set(self) -> list[Rule]:
        """The rules in force (no tombstones), by name."""
        return [r.rule for _, r in sorted(self.rules.items()) if r.rule is not None]

    def resume_rules(self, records: Iterable[CatalogRecord]) -> None:
        """The rule records saved in ``state.json`` (after ``resume``)."""
        self.rules = {r.key: r for r in records}
        self.clock = max([self.clock, *(r.version for r in self.rules.values())])
        self._oldest_tombstone = -math.inf
        self.expire()
        self._changes += 1

    def resume(self, records: Iterable[CatalogRecord], clock: int) -> None:
        """The records and clock saved in ``state.json``; expired tombstones are dropped."""
        self.registrations = {r.key: r for r in records}
        self._oldest_tombstone = -math.inf  # look at them all once
        self.clock = max(
            [clock, *(r.version for r in self.registrations.values())]
            + [p.version for _, p in self.profiles.items()]
        )
        self.expire()
        self._changes += 1

    # -- peers -----------------------------------------------------------------
    def receive(self, records: Iterable[CatalogRecord]) -> int:
        """A peer's records (checked): each one newer than this replica holds is taken; how
        many were."""
        taken = rules = 0
        for record in records:
            self.clock = max(self.clock, record.version)
            if record.kind == PROFILE:
                key = (record.key, record.nodes)
                held = self.profiles.get(key)
                if held is not None and (held.version, held.origin) >= record.order:
                    continue
                if not self.profiles.adopt(key, record.profile()):
                    continue
            else:
                if self._expired(record, self._wall_clock()):
                    continue
                previous = self._store(record.kind).get(record.key)
                if previous is not None and previous.order >= record.order:
                    continue
                is_rule = record.kind in (RULE, RULE_REMOVED)
                if previous is None and (self.rules_full() if is_rule else self.full()):
                    log.warning("catalog full: %s %r not taken", record.kind, record.key)
                    continue
                self.put(record)
                if is_rule:
                    rules += 1
                else:
                    self.adopted(record, previous)
            taken += 1
        self.received += taken
        if taken:
            self.settled()
        if rules:
            self.rules_adopted()
        return taken

    def records(self) -> tuple[CatalogRecord, ...]:
        """Every record this replica holds, as a full digest carries them: one tuple while
        nothing changes (a delta compares it by identity first)."""
        self.expire()
        stamp = (self._changes, self.profiles.version)
        if self._cache is not None and self._cache[0] == stamp:
            return self._cache[1]
        records = (
            *(self.registrations[k] for k in sorted(self.registrations)),
            *(self.rules[k] for k in sorted(self.rules)),
            *(profile_record(k, p) for k, p in self.profiles.items() if p.version > 0),
        )
        self._cache = (stamp, records)
        return records

    def stats(self) -> dict[str, int]:
        retired = sum(r.kind == RETIRED for r in self.registrations.values())
        return {
            "registrations": len(self.registrations) - retired,
            "retirements": retired,
            "profiles": len(self.profiles),
            "rules": sum(r.kind == RULE for r in self.rules.values()),
            "clock": self.clock,
            "received": self.received,
        }

    # -- bounds ----------------------------------------------------------------
    @staticmethod
    def _expired(record: CatalogRecord, now: float) -> bool:
        return record.kind in TOMBSTONES and now - record.changed_at > TOMBSTONE_SECONDS

    def expire(self) -> None:
        """Drops the tombstones older than ``TOMBSTONE_SECONDS`` (a look at every record
        only when the oldest tombstone known may have expired: once per exchange it is one
        comparison)."""
        now = self._wall_clock()
        if now - self._oldest_tombstone <= TOMBSTONE_SECONDS:
            return
        stale = [
            (store, k)
            for store in (self.registrations, self.rules)
            for k, r in store.items()
            if self._expired(r, now)
        ]
        for store, key in stale:
            del store[key]
        tombs = [
            r.changed_at
            for r in (*self.registrations.values(), *self.rules.values())
            if r.kind in TOMBSTONES
        ]
        self._oldest_tombstone = min(tombs, default=math.inf)
        if stale:
            self._changes += 1
            log.info("forgot %d retirements older than %g s", len(stale), TOMBSTONE_SECONDS)

    def _bound(self) -> None:
        """At most ``MAX_REGISTRATIONS`` registration records and ``MAX_RULE_RECORDS`` rule
        records: the oldest tombstones make room."""
        for store, bound in (
            (self.registrations, MAX_REGISTRATIONS),
            (self.rules, MAX_RULE_RECORDS),
        ):
            excess = len(store) - bound
            if excess <= 0:
                continue
            tombs = sorted(
                (r for r in store.values() if r.kind in TOMBSTONES), key=lambda r: r.changed_at
            )
            for record in tombs[:excess]:
                del store[record.key]

    def rules_full(self) -> bool:
        """``MAX_RULES`` rules in force, or no room for one more record."""
        held = sum(r.kind == RULE for r in self.rules.values())
        return held >= MAX_RULES or (
            len(self.rules) >= MAX_RULE_RECORDS
            and not any(r.kind == RULE_REMOVED for r in self.rules.values())
        )

    def full(self) -> bool:
        """A new registration would pass the bound with no tombstone to make room."""
        return len(self.registrations) >= MAX_REGISTRATIONS and not any(
            r.kind == RETIRED for r in self.registrations.values()
        )
