"""Which peers are in the global view, with their latest digests.

``Membership`` takes every digest a peer sends (:meth:`Membership.receive`),
applies a delta to the digest it holds of that peer when that digest is the
delta's base (``controller/delta.py``), keeps the newest of each replica by
``(incarnation, sequence)``, refuses impostors (a lower incarnation for a known
id, a different digest for a held sequence, an id that is not a configured
peer) and digests whose policy this replica could not build, and drops a peer
silent for k·λ (:meth:`expire`); a newer digest brings it back.
``io_changed`` fires when an accepted digest changes which of its sender's jobs
have an open operation (S(t) moved there). It also says which policy wins the
election (:meth:`elected`): the highest ``(policy_version, policy_origin)``
among the live digests and this replica's own.

Pure: no networking and no clock; the caller passes ``now``, a monotonic clock
of its own.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np

from burstctl.common.limits import identifier_problem
from burstctl.controller.delta import apply
from burstctl.controller.digest import Digest, DigestError, ReplicaId, validate
from burstctl.controller.signal import Signal
from burstctl.policies.registry import PolicyRegistry

log = logging.getLogger(__name__)

# Distinct (policy, params) a membership remembers as buildable; a bound, should
# peers cycle through many.
_BUILDABLE_CACHE = 64


class Status(enum.Enum):
    ACCEPTED = "accepted"
    STALE = "stale"  # older than what is held: ignored
    DUPLICATE = "duplicate"  # the same digest again: ignored
    UNKNOWN_BASE = "unknown_base"  # a delta on a digest not held: ignored, a full one wanted
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
class PeerState:
    """One peer as this replica holds it (``Membership.peer_states``)."""

    replica_id: ReplicaId
    live: bool
    heard_age: float  # seconds since its last accepted digest, receiver's clock
    incarnation: int
    sequence: int
    capacity: float
    policy: str
    policy_version: int
    jobs: int  # jobs in its last digest


@dataclass(slots=True)
class _Peer:
    digest: Digest
    heard_at: float  # receiver's clock, last accepted digest
    live: bool = True


class Membership:
    """The latest digest of every peer, as one replica (``self_id``) holds them.

    ``peers``: the replica ids allowed to report; None accepts any id. A set is read
    at every digest, not copied: the peer exchange passes the set it keeps of the
    replicas that answered on a configured address, which grows as they answer.
    ``registry``: when given, a digest whose policy this replica cannot build is
    rejected at the door, so an unknown policy never wins the election.
    """

    def __init__(
        self,
        self_id: ReplicaId,
        *,
        peers: AbstractSet[ReplicaId] | Iterable[ReplicaId] | None = None,
        registry: PolicyRegistry | None = None,
    ) -> None:
        problem = identifier_problem(self_id)
        if problem:
            raise DigestError("self_id", problem)
        self.self_id = self_id
        self.peers: AbstractSet[ReplicaId] | None = (
            peers if isinstance(peers, AbstractSet) or peers is None else frozenset(peers)
        )
        self._registry = registry
        # kept after expiry, so an old digest cannot bring a peer back from the dead
        self._held: dict[ReplicaId, _Peer] = {}
        self._buildable: set[tuple[str, str]] = set()  # (policy, params JSON) known good
        self._self_checked: Digest | None = None
        self.io_changed = Signal()

    def receive(self, digest: Digest, now: float, *, validated: bool = False) -> Outcome:
        """Takes one peer's digest received at ``now``; never raises for a bad digest.

        ``validated``: the caller already ran :func:`validate` on this very digest
        (``digest.from_proto`` does), so it is not checked twice. A delta is held as
        the full digest it makes of its base; with no base held, or a malformed one,
        what is held does not change.
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
        if digest.base_sequence:
            base = held.digest if held is not None else None
            if base is None or (base.incarnation, base.sequence) != (
                digest.incarnation,
                digest.base_sequence,
            ):
                if base is not None and (digest.incarnation, digest.sequence) <= (
                    base.incarnation,
                    base.sequence,
                ):
                    return Outcome(Status.STALE, f"sequence {digest.sequence} <= held")
                return Outcome(
                    Status.UNKNOWN_BASE, f"delta on sequence {digest.base_sequence}, not held"
                )
            try:
                digest = apply(base, digest)
            except DigestError as exc:
                return self._reject(rid, exc.field, exc.message)
        elif (
            held is not None
            and digest.jobs is not held.digest.jobs
            and digest.jobs == held.digest.jobs
        ):
            # one object while the jobs do not change: what tells the exchange so, cheaply
            digest = dataclasses.replace(digest, jobs=held.digest.jobs)
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
                if digest.sequence < old.sequence:
                    return Outcome(
                        Status.STALE, f"sequence {digest.sequence} < held {old.sequence}"
                    )
                if digest.sequence == old.sequence:
                    if digest == old:
                        return Outcome(Status.DUPLICATE, f"sequence {digest.sequence} held")
                    return self._reject(
                        rid, "sequence", f"a different digest for the held sequence {old.sequence}"
                    )
            if not held.live:
                log.info("replica %r rejoins the global view", rid)
        self._held[rid] = _Peer(digest, now)
        if _open_jobs_differ(held.digest if held is not None else None, digest):
            self.io_changed()
        return Outcome(Status.ACCEPTED)

    def _reject(self, rid: ReplicaId, field: str, reason: str) -> Outcome:
        log.warning("rejected digest from replica %r: %s: %s", rid, field, reason)
        return Outcome(Status.REJECTED, f"{field}: {reason}", field)

    def _check_policy(self, digest: Digest) -> None:
        if self._registry is None:
            return
        # Every digest carries the policy; validating it once per distinct (name,
        # params) is enough. The key is valid JSON: validate() checked the params.
        key = (digest.policy, json.dumps(dict(digest.policy_params), sort_keys=True))
        if key in self._buildable:
            return
        try:
            self._registry.validate(digest.policy, digest.policy_params)
        except (KeyError, ValueError, TypeError) as exc:
            raise DigestError("policy", f"cannot build {digest.policy!r}: {exc}") from None
        if len(self._buildable) >= _BUILDABLE_CACHE:
            self._buildable.clear()
        self._buildable.add(key)

    def expire(self, now: float, interval: float, missed: int) -> list[ReplicaId]:
        """Drops peers silent for more than ``missed`` · ``interval``; the dropped ids.

        Their jobs leave the global view, so their shares fall back to what the
        survivors decide among themselves; a newer digest brings them back.
        """
        if not (math.isfinite(interval) and interval > 0.0):
            raise ValueError(f"interval must be finite and > 0, got {interval!r}")
        if not (isinstance(missed, int) and not isinstance(missed, bool) and missed >= 1):
            raise ValueError(f"missed must be an integer >= 1, got {missed!r}")
        dropped = []
        for rid in sorted(self._held):
            peer = self._held[rid]
            if peer.live and now - peer.heard_at > missed * interval:
                peer.live = False
                dropped.append(rid)
                log.warning("replica %r missed %d exchanges; leaves the global view", rid, missed)
        return dropped

    def last_heard(self, rid: ReplicaId) -> tuple[Digest, float] | None:
        """The newest digest held of peer ``rid``, live or not, and when it was
        accepted (the caller's clock); None for a replica never heard from."""
        peer = self._held.get(rid)
        return None if peer is None else (peer.digest, peer.heard_at)

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
                sequence=p.digest.sequence,
                capacity=p.digest.capacity,
                policy=p.digest.policy,
                policy_version=p.digest.policy_version,
                jobs=len(p.digest.jobs),
            )
            for rid, p in sorted(self._held.items())
        ]

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

    def holders(self, wanted: set[str] | None = None) -> dict[str, list[ReplicaId]]:
        """Job id -> the live peers whose last digest lists it, for the ``wanted`` jobs (None:
        every job); one pass over the digests, not one per job."""
        where: dict[str, list[ReplicaId]] = {}
        for d in self.digests():
            ids = d.jobs.job_id if wanted is None else wanted.intersection(d.jobs.job_id)
            for job_id in ids:
                where.setdefault(job_id, []).append(d.replica_id)
        return where

    def elected(self, self_digest: Digest) -> Digest:
        """The digest whose policy every replica enforces: the highest
        ``(policy_version, policy_origin)`` among the live digests and ``self_digest``."""
        return max(self.digests(self_digest), key=lambda d: d.election_key)


def _open_jobs_differ(old: Digest | None, new: Digest) -> bool:
    """Whether ``new`` lists other jobs with an open operation than ``old`` (None: none)."""
    if old is None:
        return bool(new.jobs.open_op.any())
    a, b = old.jobs, new.jobs
    if a is b:
        return False
    if a.job_id == b.job_id:  # the usual case: the same jobs, one C-level compare
        return not np.array_equal(a.open_op, b.open_op)
    return {j for j, o in zip(a.job_id, a.open_op.tolist(), strict=True) if o} != {
        j for j, o in zip(b.job_id, b.open_op.tolist(), strict=True) if o
    }
