"""The global view several controller replicas share: digests, their merge, global targets.

Every λ each replica sends its :class:`Digest` to every peer (ThemisIO notes §4,
λ-delayed fairness) and feeds what it receives to :meth:`GlobalView.receive`.
From the live digests every replica computes, with the same deterministic code,
each job's global target (the active policy on one ``SystemView`` of the union
of the jobs, capacity Σ_r B_r) and its split over the replicas
(``controller/split.py``), and applies its own column. See ``docs/replicas.md``,
"The global view".

Pure: no networking and no clock; the caller passes ``now`` (a monotonic clock
of its own) to :meth:`GlobalView.receive` and :meth:`GlobalView.expire`.

Time inside a digest is relative: ``released_at`` and ``posted_at`` are offsets
(≤ 0, seconds) from the instant the sender built the digest, measured on the
sender's own clock. No clock synchronisation between hosts is needed; the merge
treats the digests of one exchange as taken at one common instant (the global
view's ``now`` is 0), which is off by at most the spread of the send instants
within an exchange plus transit time, normally well under λ.

Ordering: a replica's digests are ordered by ``(incarnation, epoch)``. ``epoch``
counts exchanges and restarts from 0 when the process restarts; ``incarnation``
is a start token that must grow with every restart of the same replica id
(e.g. the start time in ns from ``time.time_ns()``, or a counter persisted on
local disk). A higher incarnation replaces the old one whatever its epoch; a
lower one, for a replica id already known, is an impostor or a zombie of a
previous run and is rejected.
"""

from __future__ import annotations

import enum
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from burstctl.controller.split import Edge, ReplicaId, split
from burstctl.policies.base import Policy
from burstctl.policies.registry import PolicyRegistry
from burstctl.policies.view import JobId, JobView, SystemView, job_cap

log = logging.getLogger(__name__)

# Bounds beyond which a value is taken for a bug or an attack, not a measurement.
MAX_RATE = 1e15  # bytes/s: 1 PB/s for one storage server or one job
MAX_NODES = 10_000_000
MAX_JOBS = 100_000
MAX_ID_LENGTH = 256
MAX_COUNTER = 2**63 - 1  # epochs, incarnations, versions: int64 on the wire


class DigestError(ValueError):
    """A digest that must not touch the global view; ``field`` names the bad field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(slots=True)
class JobDigest:
    """One job as one replica sees it at the digest's send instant.

    Treated as immutable but not frozen: a frozen dataclass sets each field
    through ``object.__setattr__``, which made building them ~5× slower, and a
    replica builds about 2J of them per exchange (bench/replica_sync.py).
    """

    job_id: JobId
    user: str
    group: str
    nodes: int  # p_i
    priority: float
    demand: float  # local demand on this replica, bytes/s; 0 without an open operation
    usage_bytes: float  # bytes moved on this replica since its previous digest
    progress: float  # P_i as this replica computed it, seconds (eq. 6)
    released_at: float  # τ_i − t_send ≤ 0, seconds, on the sender's clock
    posted_at: float | None = None  # R_i − t_send ≤ 0 of the open operation here; None: none
    remaining: float | None = None  # V_i of the open operation here, bytes; None: unknown
    open_op: bool = False  # the job has an open operation on this replica
    transferred: float = 0.0  # bytes this job moved on this replica in all (P_i's V part)


@dataclass(frozen=True, slots=True)
class Digest:
    """What one replica tells its peers every λ."""

    replica_id: ReplicaId
    incarnation: int  # start token; grows with every restart (module docstring)
    epoch: int  # exchange counter within one incarnation
    capacity: float  # B_r, bytes/s
    node_bandwidth: float  # b, bytes/s per compute node (b_i = min(p_i · b, B), eq. (1))
    policy: str  # registry name or sharing spec
    policy_params: Mapping[str, Any] = field(default_factory=dict)  # read-only
    policy_version: int = 0  # a switch sets max version seen + 1
    jobs: tuple[JobDigest, ...] = ()


class Status(enum.Enum):
    ACCEPTED = "accepted"
    STALE = "stale"  # older than what is held: ignored
    DUPLICATE = "duplicate"  # the same digest again: ignored
    REJECTED = "rejected"  # invalid or not trusted: ignored, logged


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    reason: str = ""
    field: str | None = None  # for REJECTED by validation: the bad field

    @property
    def accepted(self) -> bool:
        return self.status is Status.ACCEPTED


@dataclass(frozen=True, slots=True)
class ActivePolicy:
    """The policy every replica enforces: highest ``(version, replica_id)`` wins."""

    name: str
    params: Mapping[str, Any]
    version: int
    replica_id: ReplicaId


# ---------------------------------------------------------------------------
# Validation


def validate(digest: Digest) -> None:
    """Raise :class:`DigestError` naming the first bad field of ``digest``."""
    if not isinstance(digest, Digest):
        raise DigestError("digest", f"expected a Digest, got {type(digest).__name__}")
    _identifier("replica_id", digest.replica_id)
    _counter("incarnation", digest.incarnation)
    _counter("epoch", digest.epoch)
    _number("capacity", digest.capacity, low=0.0, high=MAX_RATE)
    _number("node_bandwidth", digest.node_bandwidth, low=0.0, high=MAX_RATE, strict=True)
    _identifier("policy", digest.policy)
    if not isinstance(digest.policy_params, Mapping):
        raise DigestError("policy_params", "must be a mapping")
    for key in digest.policy_params:
        if not isinstance(key, str):
            raise DigestError("policy_params", f"keys must be strings, got {key!r}")
    try:
        json.dumps(dict(digest.policy_params), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DigestError("policy_params", f"must be plain JSON values: {exc}") from None
    _counter("policy_version", digest.policy_version)
    if not isinstance(digest.jobs, tuple):
        raise DigestError("jobs", f"must be a tuple, got {type(digest.jobs).__name__}")
    if len(digest.jobs) > MAX_JOBS:
        raise DigestError("jobs", f"{len(digest.jobs)} jobs, more than {MAX_JOBS}")
    seen: set[str] = set()
    for i, job in enumerate(digest.jobs):
        if not _valid_job(job):
            _validate_job(f"jobs[{i}]", job)
        if job.job_id in seen:
            raise DigestError(f"jobs[{i}].job_id", f"duplicate job id {job.job_id!r}")
        seen.add(job.job_id)


_NUMBER = (float, int)


def _valid_job(job: object) -> bool:
    """The checks of :func:`_validate_job` in one expression, without building field
    names: the common, valid case costs ~1 µs. NaN fails every comparison."""
    return (
        type(job) is JobDigest
        and _valid_id(job.job_id)
        and _valid_id(job.user)
        and _valid_id(job.group)
        and type(job.nodes) is int
        and 1 <= job.nodes <= MAX_NODES
        and type(job.priority) in _NUMBER
        and 0.0 < job.priority <= MAX_RATE
        and type(job.demand) in _NUMBER
        and 0.0 <= job.demand <= MAX_RATE
        and type(job.usage_bytes) in _NUMBER
        and 0.0 <= job.usage_bytes < math.inf
        and type(job.progress) in _NUMBER
        and 0.0 <= job.progress < math.inf
        and type(job.transferred) in _NUMBER
        and 0.0 <= job.transferred < math.inf
        and type(job.released_at) in _NUMBER
        and -math.inf < job.released_at <= 0.0
        and (
            job.posted_at is None
            or (type(job.posted_at) in _NUMBER and -math.inf < job.posted_at <= 0.0)
        )
        and (
            job.remaining is None
            or (type(job.remaining) in _NUMBER and 0.0 <= job.remaining < math.inf)
        )
        and type(job.open_op) is bool
        and (job.open_op or job.demand <= 0.0)
    )


def _valid_id(value: object) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()


def _validate_job(at: str, job: JobDigest) -> None:
    """Raise :class:`DigestError` naming the first bad field of ``job``."""
    if not isinstance(job, JobDigest):
        raise DigestError(at, f"expected a JobDigest, got {type(job).__name__}")
    _identifier(f"{at}.job_id", job.job_id)
    _identifier(f"{at}.user", job.user)
    _identifier(f"{at}.group", job.group)
    if not _is_int(job.nodes) or not 1 <= job.nodes <= MAX_NODES:
        raise DigestError(
            f"{at}.nodes", f"must be an integer in [1, {MAX_NODES}], got {job.nodes!r}"
        )
    _number(f"{at}.priority", job.priority, low=0.0, high=MAX_RATE, strict=True)
    _number(f"{at}.demand", job.demand, low=0.0, high=MAX_RATE)
    _number(f"{at}.usage_bytes", job.usage_bytes, low=0.0, high=math.inf)
    _number(f"{at}.progress", job.progress, low=0.0, high=math.inf)
    _number(f"{at}.transferred", job.transferred, low=0.0, high=math.inf)
    _number(f"{at}.released_at", job.released_at, low=-math.inf, high=0.0)
    if job.posted_at is not None:
        _number(f"{at}.posted_at", job.posted_at, low=-math.inf, high=0.0)
    if job.remaining is not None:
        _number(f"{at}.remaining", job.remaining, low=0.0, high=math.inf)
    if not isinstance(job.open_op, bool):
        raise DigestError(f"{at}.open_op", f"must be a bool, got {job.open_op!r}")
    if job.demand > 0.0 and not job.open_op:
        raise DigestError(f"{at}.demand", "demand > 0 without an open operation")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _identifier(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise DigestError(name, f"must be a string, got {type(value).__name__}")
    if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise DigestError(name, f"must be 1..{MAX_ID_LENGTH} printable characters")


def _counter(name: str, value: object) -> None:
    if not _is_int(value):
        raise DigestError(name, f"must be an integer, got {type(value).__name__}")
    assert isinstance(value, int)
    if not 0 <= value <= MAX_COUNTER:
        raise DigestError(name, f"must be in [0, 2^63 − 1], got {value}")


def _number(name: str, value: object, *, low: float, high: float, strict: bool = False) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise DigestError(name, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise DigestError(name, f"must be finite, got {value!r}")
    if value < low or (strict and value == low):
        raise DigestError(name, f"must be {'>' if strict else '>='} {low}, got {value!r}")
    if value > high:
        raise DigestError(name, f"must be <= {high}, got {value!r}")


# ---------------------------------------------------------------------------
# The view


@dataclass(frozen=True, slots=True)
class PeerState:
    """One peer as this replica holds it (``GlobalView.peer_states``)."""

    replica_id: ReplicaId
    live: bool
    heard_age: float  # seconds since its last accepted digest, receiver's clock
    incarnation: int
    epoch: int
    capacity: float
    policy: str
    policy_version: int
    jobs: int  # jobs in its last digest


@dataclass(slots=True)
class _Peer:
    digest: Digest
    heard_at: float  # receiver's clock, last accepted digest
    live: bool = True


class GlobalView:
    """The latest digest of every peer, as one replica (``self_id``) holds them.

    ``peers``: the replica ids allowed to report (the configured peer list);
    None accepts any id. ``registry``: when given, a digest whose policy this
    replica cannot build is rejected at the door, so an unknown policy never wins.
    """

    def __init__(
        self,
        self_id: ReplicaId,
        *,
        peers: Iterable[ReplicaId] | None = None,
        registry: PolicyRegistry | None = None,
    ) -> None:
        _identifier("self_id", self_id)
        self.self_id = self_id
        self.peers = frozenset(peers) if peers is not None else None
        self._registry = registry
        # kept after expiry, so an old digest cannot bring a peer back from the dead
        self._held: dict[ReplicaId, _Peer] = {}
        self._policy: tuple[tuple[str, str], Policy] | None = None
        self._conflicts: set[tuple[JobId, str, ReplicaId]] = set()
        self._self_checked: Digest | None = None
        self._buildable: set[tuple[str, str]] = set()  # (policy, params JSON) known good

    # -- exchange ---------------------------------------------------------------
    def receive(self, digest: Digest, now: float, *, validated: bool = False) -> Outcome:
        """Merge one peer's digest received at ``now``; never raises for a bad digest.

        ``validated``: the caller already ran :func:`validate` on this very digest
        (``digest_from_proto`` does), so it is not checked twice.
        """
        try:
            if not validated:
                validate(digest)
            self._check_policy(digest)
        except DigestError as exc:
            rid = getattr(digest, "replica_id", "?")
            log.warning("rejected digest from replica %r: %s", rid, exc)
            return Outcome(Status.REJECTED, str(exc), exc.field)
        rid = digest.replica_id
        if rid == self.self_id:
            return self._reject(rid, "replica_id", "a peer claims this replica's own id")
        if self.peers is not None and rid not in self.peers:
            return self._reject(rid, "replica_id", "not a configured peer")
        held = self._held.get(rid)
        if held is not None:
            old = held.digest
            if digest.incarnation < old.incarnation:
                return self._reject(
                    rid,
                    "incarnation",
                    f"incarnation {digest.incarnation} is lower than the known "
                    f"{old.incarnation}: an impostor or a previous run",
                )
            if digest.incarnation == old.incarnation:
                if digest.epoch < old.epoch:
                    return Outcome(Status.STALE, f"epoch {digest.epoch} < held {old.epoch}")
                if digest.epoch == old.epoch:
                    if digest == old:
                        return Outcome(Status.DUPLICATE, f"epoch {digest.epoch} already held")
                    return self._reject(
                        rid, "epoch", f"a different digest for the held epoch {digest.epoch}"
                    )
            if not held.live:
                log.info("replica %r rejoins the global view", rid)
        self._held[rid] = _Peer(digest, now)
        return Outcome(Status.ACCEPTED)

    def _reject(self, rid: ReplicaId, field: str, reason: str) -> Outcome:
        log.warning("rejected digest from replica %r: %s: %s", rid, field, reason)
        return Outcome(Status.REJECTED, f"{field}: {reason}", field)

    def _check_policy(self, digest: Digest) -> None:
        if self._registry is None:
            return
        # Every digest carries the policy; building it (pydantic validation) once per
        # distinct (name, params) is enough. The key is valid JSON: validate() checked.
        key = (digest.policy, json.dumps(dict(digest.policy_params), sort_keys=True))
        if key in self._buildable:
            return
        try:
            self._registry.create(digest.policy, digest.policy_params)
        except (KeyError, ValueError, TypeError) as exc:
            raise DigestError("policy", f"cannot build {digest.policy!r}: {exc}") from None
        if len(self._buildable) >= 64:  # a bound, should peers cycle through many
            self._buildable.clear()
        self._buildable.add(key)

    def expire(self, now: float, interval: float, missed: int) -> list[ReplicaId]:
        """Drop peers silent for more than ``missed`` · ``interval``; the dropped ids.

        Their jobs leave the global view, so their shares fall back to what the
        survivors decide among themselves; a newer digest brings them back.
        """
        if not (math.isfinite(interval) and interval > 0.0):
            raise ValueError(f"interval must be finite and > 0, got {interval!r}")
        if not (_is_int(missed) and missed >= 1):
            raise ValueError(f"missed must be an integer >= 1, got {missed!r}")
        dropped = []
        for rid in sorted(self._held):
            peer = self._held[rid]
            if peer.live and now - peer.heard_at > missed * interval:
                peer.live = False
                dropped.append(rid)
                log.warning("replica %r missed %d exchanges; leaves the global view", rid, missed)
        return dropped

    def live_peers(self) -> list[ReplicaId]:
        return sorted(rid for rid, p in self._held.items() if p.live)

    def peer_states(self, now: float) -> list[PeerState]:
        """Every peer ever heard from, in id order: what the admin views report."""
        return [
            PeerState(
                replica_id=rid,
                live=p.live,
                heard_age=max(0.0, now - p.heard_at),
                incarnation=p.digest.incarnation,
                epoch=p.digest.epoch,
                capacity=p.digest.capacity,
                policy=p.digest.policy,
                policy_version=p.digest.policy_version,
                jobs=len(p.digest.jobs),
            )
            for rid, p in sorted(self._held.items())
        ]

    def highest_policy_version(self) -> int:
        """The highest policy version any peer has reported, live or not (0: none)."""
        return max((p.digest.policy_version for p in self._held.values()), default=0)

    def digests(self, self_digest: Digest | None = None) -> list[Digest]:
        """The live digests (plus ``self_digest``) in replica id order."""
        out = {rid: p.digest for rid, p in self._held.items() if p.live}
        if self_digest is not None:
            if self_digest.replica_id != self.self_id:
                raise ValueError(
                    f"self digest is from {self_digest.replica_id!r}, this view is {self.self_id!r}"
                )
            if self_digest is not self._self_checked:  # the same digest is asked for often
                validate(self_digest)
                self._self_checked = self_digest
            out[self.self_id] = self_digest
        return [out[rid] for rid in sorted(out)]

    # -- policy -------------------------------------------------------------------
    def active_policy(self, self_digest: Digest | None = None) -> ActivePolicy | None:
        """The highest ``(policy_version, replica_id)`` among the live digests and
        ``self_digest``; None when there are none. A replica whose own policy
        differs adopts this one (keeping its version) before its next digest."""
        best = max(
            self.digests(self_digest),
            key=lambda d: (d.policy_version, d.replica_id),
            default=None,
        )
        if best is None:
            return None
        return ActivePolicy(best.policy, best.policy_params, best.policy_version, best.replica_id)

    def _policy_for(self, active: ActivePolicy, registry: PolicyRegistry) -> Policy:
        # One instance per (name, params): a policy that learns online keeps its state.
        key = (active.name, json.dumps(dict(active.params), sort_keys=True))
        if self._policy is None or self._policy[0] != key:
            self._policy = (key, registry.create(active.name, active.params))
        return self._policy[1]

    # -- targets ------------------------------------------------------------------
    def system_view(self, self_digest: Digest) -> SystemView:
        """One view of the union of the live replicas' jobs with capacity Σ_r B_r.

        Per job: metadata (user, group, nodes, priority) from the first replica
        in id order that has it (conflicts are logged once and ignored);
        demand Σ_r d_jr capped at b_i; τ_i and R_i the earliest; V_i the sum
        when every replica knows it; P_i = W_i^(done) + V_i^(transferred)/b_i
        (eq. 6) with the transferred bytes summed over the replicas and the work
        time the largest any replica saw (each replica reports P_i and its
        bytes, so W_i^(done) = P_i − V/b_i with that replica's own b_i). Only jobs
        with an open operation somewhere are in the view (S(t)); ``index`` is the
        job id order.
        """
        digests = self.digests(self_digest)
        capacity = math.fsum(d.capacity for d in digests)
        b = min(d.node_bandwidth for d in digests)
        by_id = {d.replica_id: d for d in digests}
        per_job: dict[JobId, list[tuple[ReplicaId, JobDigest]]] = {}
        for d in digests:
            for job in d.jobs:
                per_job.setdefault(job.job_id, []).append((d.replica_id, job))
        rows: dict[JobId, JobView] = {}
        for index, job_id in enumerate(sorted(per_job)):
            seen = per_job[job_id]
            if not any(j.open_op for _, j in seen):
                continue
            first = seen[0][1]
            cap = job_cap(first.nodes, b, capacity)
            if len(seen) == 1:  # the common case: the values below without the sums
                demand, posted_at = min(cap, first.demand), first.posted_at
                remaining, released_at = first.remaining, first.released_at
            else:
                self._log_conflicts(first, seen[1:])
                demand = min(cap, math.fsum(j.demand for _, j in seen))
                posted = [j.posted_at for _, j in seen if j.posted_at is not None]
                posted_at = min(posted) if posted else None
                open_remaining = [j.remaining for _, j in seen if j.open_op]
                remaining = (
                    math.fsum(r for r in open_remaining if r is not None)
                    if None not in open_remaining
                    else None
                )
                released_at = min(j.released_at for _, j in seen)
            # Positional (twice as fast as keywords, ~1,000 rows per exchange), in
            # JobView's field order (pinned by tests/unit/simulator/test_sim_engine.py).
            rows[job_id] = JobView(
                job_id,
                first.user,
                first.group,
                first.nodes,
                first.priority,
                cap,
                demand,
                posted_at,
                0.0,  # volume: not exchanged (remaining is)
                remaining,
                0.0,  # moved
                released_at,
                self._progress(seen, by_id, cap),
                0.0,  # last_work
                0.0,  # mean_volume
                index,
            )
        return SystemView(now=0.0, capacity=capacity, node_bandwidth=b, jobs=rows)

    @staticmethod
    def _progress(
        seen: list[tuple[ReplicaId, JobDigest]], by_id: dict[ReplicaId, Digest], cap: float
    ) -> float:
        """Global P_i (eq. 6): the largest work time any replica saw plus every
        replica's transferred bytes at the global b_i."""
        work = 0.0
        for rid, j in seen:
            d = by_id[rid]
            local_cap = job_cap(j.nodes, d.node_bandwidth, d.capacity)
            work = max(work, j.progress - (j.transferred / local_cap if local_cap > 0 else 0.0))
        moved = math.fsum(j.transferred for _, j in seen)
        return work + (moved / cap if cap > 0 else 0.0)

    def _log_conflicts(self, first: JobDigest, others: list[tuple[ReplicaId, JobDigest]]) -> None:
        mine = (first.user, first.group, first.nodes, first.priority)
        for rid, job in others:
            if (job.user, job.group, job.nodes, job.priority) == mine:
                continue
            for name in ("user", "group", "nodes", "priority"):
                key = (job.job_id, name, rid)
                if getattr(job, name) != getattr(first, name) and key not in self._conflicts:
                    self._conflicts.add(key)
                    log.warning(
                        "job %r: replica %r reports %s=%r, using %r",
                        job.job_id,
                        rid,
                        name,
                        getattr(job, name),
                        getattr(first, name),
                    )

    def global_targets(self, self_digest: Digest, registry: PolicyRegistry) -> dict[JobId, float]:
        """t_j: the active policy on :meth:`system_view`, in job id order."""
        active = self.active_policy(self_digest)
        assert active is not None  # self_digest is always there
        view = self.system_view(self_digest)
        rates = self._policy_for(active, registry).allocate(view)
        return {j: float(rates.get(j, 0.0)) for j in sorted(view.jobs)}

    def targets(self, self_digest: Digest, registry: PolicyRegistry) -> dict[Edge, float]:
        """x_jr for every job on every live replica it is present on.

        Every replica holding the same digests gets bit-identical results,
        whatever order they arrived in: everything iterates in sorted ids.
        ``self_digest`` must be the digest this replica sent in the same
        exchange, not a fresher one, or its peers compute with different input.
        """
        t = self.global_targets(self_digest, registry)
        digests = self.digests(self_digest)
        capacity = {d.replica_id: float(d.capacity) for d in digests}
        demand = {(j.job_id, d.replica_id): float(j.demand) for d in digests for j in d.jobs}
        return split(t, capacity, demand)
