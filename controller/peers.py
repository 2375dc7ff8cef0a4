"""Replica-to-replica sync: the ``Peer`` service and the exchange loop.

Every λ (``sync_interval``), early (at least λ/4 after the previous one) when a
local job starts or ends an I/O phase, and at once after a policy change, a
replica builds its digest (``controller/digest.py``) from its job table and
policy slot and sends it to every configured peer (``controller/peer_link.py``:
one long-lived ``burstctl.v1.Peer/Sync`` stream per peer, each digest written
within λ, as a delta on the previous one where the peer holds it,
``controller/delta.py``). What it receives goes to its ``Membership``. After
each exchange it expires peers silent for k·λ and, when at least one peer is
live, merges the digests, decides the global targets with the slot's policy and
keeps its own share of their split for the scheduler (``local_targets``). With
a policy that names the view fields it reads, none of them a time
(``Policy.reads``), and digests equal to those of the previous computation in
the columns those fields and the split come from, it keeps the share it has.
See ``docs/replicas.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from burstctl.common.channels import ChannelSecurity
from burstctl.common.limits import MAX_JOBS
from burstctl.controller.buffer import BufferBooks
from burstctl.controller.catalog import Catalog
from burstctl.controller.delta import advance
from burstctl.controller.digest import (
    Digest,
    DigestError,
    same_columns,
)
from burstctl.controller.digest_wire import from_proto
from burstctl.controller.jobs import JobTable
from burstctl.controller.local_digest import build_digest
from burstctl.controller.membership import Membership, Status
from burstctl.controller.merge import (
    Conflict,
    Merged,
    ceilings,
    columns_read,
    merge,
    split_targets,
)
from burstctl.controller.patterns import GlobalPattern, Part
from burstctl.controller.peer_link import PEER_SERVICE_NAME, REPLICA_ID_KEY, Outgoing, PeerLink
from burstctl.controller.rulebook import RuleBook
from burstctl.controller.signal import Signal
from burstctl.controller.state import PolicySlot
from burstctl.policies.base import Policy
from burstctl.policies.decision import Share, decide
from burstctl.policies.persched.live import PerSchedLive, PerSchedParams
from burstctl.policies.rules import budgets as budgets_of
from burstctl.policies.view import JobId
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

log = logging.getLogger(__name__)

# An early exchange (poke) comes at least this fraction of λ after the previous one.
EARLY_GAP = 0.25


class _Malformed:
    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _decode_digest(data: bytes) -> pb.Digest | _Malformed:
    try:
        return pb.Digest.FromString(data)
    except DecodeError as exc:
        return _Malformed(exc)


# ---------------------------------------------------------------------------
# Receiving side


class DigestTooLarge(DigestError):
    """A digest with more jobs than ``max_digest_jobs``: RESOURCE_EXHAUSTED on Exchange."""


class PeerServicer:
    """``burstctl.v1.Peer``: hands received digests to ``membership``; the policy of an
    accepted one goes to ``slot`` (adopted when it is newer), its catalog records to
    ``catalog``. A digest of more than ``max_jobs`` jobs is rejected before it is even
    converted."""

    def __init__(
        self,
        membership: Membership,
        slot: PolicySlot | None,
        replica_id: str,
        clock: Callable[[], float] = time.monotonic,
        max_jobs: int = MAX_JOBS,
        catalog: Catalog | None = None,
    ) -> None:
        self.membership = membership
        self.replica_id = replica_id
        self.max_jobs = max_jobs
        self._slot = slot
        self._catalog = catalog
        self._clock = clock
        self.received = 0
        self.rejected = 0

    def rpc_handlers(self) -> grpc.GenericRpcHandler:
        # By hand, like the Controller service: an undecodable digest reaches the
        # handler (INVALID_ARGUMENT for Exchange, a rejected reply on a Stream).
        exchange = grpc.unary_unary_rpc_method_handler(
            self.exchange,
            request_deserializer=_decode_digest,
            response_serializer=pb.ExchangeReply.SerializeToString,
        )
        stream = grpc.stream_stream_rpc_method_handler(
            self.stream,
            request_deserializer=_decode_digest,
            response_serializer=pb.ExchangeReply.SerializeToString,
        )
        # Sync and the earlier version's Stream are one method: a replica of that
        # version sends full digests only, which Sync takes as they are.
        return grpc.method_handlers_generic_handler(
            PEER_SERVICE_NAME, {"Exchange": exchange, "Sync": stream, "Stream": stream}
        )

    async def exchange(
        self, request: pb.Digest | _Malformed, context: grpc.aio.ServicerContext
    ) -> pb.ExchangeReply:
        try:
            return self._receive(request, context)
        except DigestError as exc:
            too_large = isinstance(exc, DigestTooLarge)
            code = (
                grpc.StatusCode.RESOURCE_EXHAUSTED
                if too_large
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            await context.abort(code, str(exc))
            raise AssertionError("unreachable") from None  # abort raises

    async def stream(
        self,
        requests: AsyncIterator[pb.Digest | _Malformed],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ExchangeReply]:
        """The digests of one peer for as long as it keeps the stream.

        This replica's id goes out once, in the initial metadata; an accepted
        digest gets no reply (a reply per digest would double the gRPC events
        of an exchange), any other outcome (rejected, stale, duplicate,
        unknown_base) a reply, after which the sender's next digest is a full one.
        """
        await context.send_initial_metadata(((REPLICA_ID_KEY, self.replica_id),))
        async for request in requests:
            try:
                reply = self._receive(request, context)
            except DigestError as exc:
                reply = pb.ExchangeReply(
                    replica_id=self.replica_id,
                    status=Status.REJECTED.value,
                    field=exc.field,
                    reason=str(exc),
                )
            if reply.status != Status.ACCEPTED.value:
                yield reply

    def _receive(
        self, request: pb.Digest | _Malformed, context: grpc.aio.ServicerContext
    ) -> pb.ExchangeReply:
        """Merges one digest into the view; raises :class:`DigestError` for a malformed
        one (logged and counted here)."""
        self.received += 1
        try:
            if isinstance(request, _Malformed):
                raise DigestError("digest", f"not a valid burstctl.v1.Digest ({request.error})")
            if (n := len(request.jobs.job_id)) > self.max_jobs:
                raise DigestTooLarge(
                    "jobs", f"{n} jobs, more than max_digest_jobs = {self.max_jobs}"
                )
            digest = from_proto(request)
        except DigestError as exc:
            self.rejected += 1
            log.warning("malformed digest from %s: %s", context.peer(), exc)
            raise
        outcome = self.membership.receive(digest, self._clock(), validated=True)
        if outcome.status is Status.REJECTED:
            self.rejected += 1
        elif outcome.accepted and self._slot is not None:
            try:
                self._slot.adopt(
                    digest.policy, digest.policy_params, digest.policy_version, digest.policy_origin
                )
            except Exception:  # the digest is held; the exchange retries the election
                log.exception("could not adopt the policy of replica %r", digest.replica_id)
        if outcome.accepted and self._catalog is not None and digest.catalog:
            try:
                self._catalog.receive(digest.catalog)
            except Exception:  # the sender's next full digest carries them again
                log.exception("could not take the catalog of replica %r", digest.replica_id)
        return pb.ExchangeReply(
            replica_id=self.replica_id,
            status=outcome.status.value,
            field=outcome.field or "",
            reason=outcome.reason,
        )


# ---------------------------------------------------------------------------
# Sending side


@dataclass(frozen=True, slots=True)
class HeldBack:
    """A peer dropped from the global view whose sessions may still hold its rates.

    ``column``: its rate per job in the last split computed while it was live;
    ``until``: when the lease of its last allocations has surely expired (the
    exchange loop's clock). Until then the survivors count ``column`` as used by
    those jobs and split only the rest of their targets and caps.
    """

    digest: Digest
    column: dict[JobId, float]
    until: float


class PeerSync:
    """The exchange loop of one replica.

    ``local_targets`` is this replica's rate for every job of the global view
    (after the last exchange with at least one live or held-back peer), as a
    :class:`~burstctl.policies.decision.Share` with each job's ceiling, or None:
    the local policy decides alone. ``updated`` fires after every exchange.

    ``lease``: the allocation lease of the replicas (config ``lease``). A peer
    that goes silent is dropped from the view after ``missed``·λ, but its
    sessions may still pace at the rates it last pushed until their lease
    runs out, and a ``keep-last`` client keeps it ``keep`` seconds more (config
    ``fallback_grace``) before it moves to its share of the dead replica's fallback budget
    (within that replica's capacity, which leaves the view with it); so its column
    of the last split stays counted (:class:`HeldBack`) until λ + ``lease`` +
    ``keep`` + λ after its last digest (the last push came at most about λ after
    it; one λ more of margin for transit). ``lease`` None: not held back.
    """

    def __init__(
        self,
        table: JobTable,
        slot: PolicySlot,
        *,
        replica_id: str,
        addresses: list[str],
        interval: float,
        missed: int,
        capacity: float,
        node_bandwidth: float,
        lease: float | None = None,
        keep: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        security: ChannelSecurity | None = None,
        books: BufferBooks | None = None,
        catalog: Catalog | None = None,
        rules: RuleBook | None = None,
    ) -> None:
        self.table = table
        self.rules = rules  # the operator's rules: global limits and reservations
        self.books = books  # the burst buffer's books, sent in the digests
        self.pattern = GlobalPattern(replica_id)  # persched's pattern across the replicas
        self.catalog = catalog  # registrations and profiles, sent in the digests
        self.slot = slot
        self.replica_id = replica_id
        self.interval = interval
        self.missed = missed
        self.capacity = capacity
        self.node_bandwidth = node_bandwidth
        self.links = [PeerLink(a, interval, security) for a in addresses]
        # Only replicas that answered on a configured address may report (kept by `_allowed`).
        self._answered: set[str] = set()
        self.membership = Membership(replica_id, peers=self._answered, registry=slot.registry)
        self._clock = clock
        self.incarnation = time.time_ns()  # grows with every restart (digest.py)
        self.sequence = 0
        self.lease = lease
        self.keep = keep
        self.local_targets: Share | None = None
        self.held_back: dict[str, HeldBack] = {}
        # The last split and the live replicas whose column a hold-back may still take.
        self._split: tuple[Merged, np.ndarray, set[str]] | None = None
        self.exchanges = 0
        self.updated = Signal()
        self._usage_seen: dict[JobId, int] = {}
        self.sent: Digest | None = None  # the digest the peers hold of this replica
        # What the last share was computed from: the policy, the digests, the held back.
        self._inputs: tuple[Policy, list[Digest], list[HeldBack]] | None = None
        self._rules_seen = 0  # the rules' version the share was computed with
        self.reused = 0  # exchanges that kept the previous share (same inputs)
        self._conflicts: set[tuple[JobId, str, str]] = set()  # logged once each
        self._wake: asyncio.Event | None = None  # set by poke(); made in run()'s loop
        self._urgent: asyncio.Event | None = None  # set by send_now()
        table.io_changed.connect(self.poke)
        # A peer's S(t) moved: this replica's share changes with it, so it exchanges and
        # recomputes soon (EARLY_GAP after its previous exchange), not up to λ later.
        self.membership.io_changed.connect(self.poke)
        slot.changed.connect(self.send_now)

    def _allowed(self) -> None:
        answered = {link.replica_id for link in self.links if link.replica_id is not None}
        if answered != self._answered:
            self._answered.clear()
            self._answered.update(answered)

    def poke(self, *_change: object) -> None:
        """The local S(t) changed (a job started or ended an I/O phase: the table's
        ``io_changed``): exchange soon, not at the end of the interval, so peers learn of it
        within about λ/4. The same when a peer's digest shows its S(t) changed
        (``Membership.io_changed``): this replica recomputes its share within about λ/4."""
        if self._wake is not None:
            self._wake.set()

    def send_now(self) -> None:
        """The policy changed: exchange at once, so peers hear of it without waiting."""
        if self._urgent is not None and self._wake is not None:
            self._urgent.set()
            self._wake.set()

    def digest(self) -> Digest:
        """This replica's next digest as built from its table (its sequence number is
        taken); what it sends is the sent view ``advance`` makes of it."""
        self.sequence += 1
        slot = self.slot
        return build_digest(
            self.table,
            replica_id=self.replica_id,
            incarnation=self.incarnation,
            sequence=self.sequence,
            capacity=self.capacity,
            node_bandwidth=self.node_bandwidth,
            policy=(slot.name, slot.params, slot.version, slot.origin),
            usage_seen=self._usage_seen,
            now=self._clock(),
            buffer=self.books.view() if self.books is not None else None,
            pattern=self.pattern.announce(),
            catalog=self.catalog.records() if self.catalog is not None else (),
        )

    async def run(self) -> None:
        self._wake = wake = asyncio.Event()
        self._urgent = urgent = asyncio.Event()
        while True:
            started = self._clock()
            wake.clear()  # what changes from now on goes into a later digest
            urgent.clear()
            try:
                await self.exchange_once()
            except Exception:  # a bug here must not stop the controller
                log.exception("digest exchange failed")
            # Every λ, or earlier after a poke, but never within EARLY_GAP·λ of the
            # previous exchange (job churn costs at most 1/EARLY_GAP exchanges per λ),
            # unless the policy changed.
            gap = EARLY_GAP * self.interval - (self._clock() - started)
            if gap > 0 and not urgent.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(urgent.wait(), gap)
            left = self.interval - (self._clock() - started)
            if left > 0 and not wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), left)

    async def exchange_once(self) -> None:
        digest, delta = advance(self.sent, self.digest())
        self.sent = digest
        outgoing = Outgoing(digest, delta)  # encoded once for every peer
        sent = await asyncio.gather(
            *(link.send(outgoing, self.interval) for link in self.links), return_exceptions=True
        )
        for link, outcome in zip(self.links, sent, strict=True):
            if isinstance(outcome, Exception):  # a bug in one link must not cost the others
                link.failures += 1
                log.error("exchange with %s failed", link.address, exc_info=outcome)
        self._allowed()
        now = self._clock()
        for rid in self.membership.expire(now, self.interval, self.missed):
            self._hold_back(rid)
        live = self.membership.live_peers()
        for rid in sorted(self.held_back):
            if rid in live:
                del self.held_back[rid]
            elif now >= self.held_back[rid].until:
                del self.held_back[rid]
                log.info("the leases of replica %r have expired; its share is split again", rid)
        self.exchanges += 1
        share = self._share(digest) if live or self.held_back else None
        if share is None and self.rules is not None:  # alone: the rules on this view only
            self.rules.alone()
        if share is None or share is not self.local_targets:
            self.local_targets = share
            self.updated()
        else:
            self.reused += 1

    def _hold_back(self, rid: str) -> None:
        """Peer ``rid`` just left the view: keep its last column until its leases expire."""
        column = None
        if self._split is not None and rid in self._split[2]:
            merged, x, live = self._split
            live.discard(rid)
            column = merged.share(x, rid)  # read only when a peer leaves: no dict per exchange
        heard = self.membership.last_heard(rid)
        if self.lease is None or column is None or heard is None:
            return
        last, heard_at = heard
        until = heard_at + self.interval + self.lease + self.keep + self.interval
        self.held_back[rid] = HeldBack(last, column, until)
        log.warning(
            "replica %r left the global view; its sessions' rates stay counted for %.1f s",
            rid,
            max(0.0, until - self._clock()),
        )

    def _share(self, digest: Digest) -> Share:
        """This replica's part of the global split computed from ``digest`` (the one it
        sent in this exchange, so that its peers compute with the same input); the
        previous one, itself, when nothing it depends on changed."""
        elected = self.membership.elected(digest)
        if elected is not digest:  # normally adopted when it arrived
            self.slot.adopt(
                elected.policy, elected.policy_params, elected.policy_version, elected.policy_origin
            )
        digests = self.membership.digests(digest)
        held = [self.held_back[rid] for rid in sorted(self.held_back)]
        policy = self.slot.merged
        inputs = (policy, digests, held)
        rules = self.rules.version if self.rules is not None else 0
        if self.local_targets is not None and self._same_inputs(inputs, rules):
            return self.local_targets
        self._inputs, self._rules_seen = inputs, rules
        if self.held_back:  # their jobs and capacity are still in use: in the view
            digests = sorted([*digests, *(h.digest for h in held)], key=lambda d: d.replica_id)
        merged = merge(digests, self._split[0].layout if self._split is not None else None)
        self._log(merged.conflicts)
        bindings = self.rules.bindings(merged.view) if self.rules is not None else None
        targets = decide(policy, merged.view, rules=bindings).rates
        if self.rules is not None:
            self.rules.observe_global(merged.view, targets, bindings)
        part = self._pattern_part(policy, digests)
        fixed = {rid: h.column for rid, h in self.held_back.items()}
        x = split_targets(merged, targets, fixed)
        self._split = (merged, x, {rid for rid in merged.replicas if rid not in fixed})
        share = merged.share(x, self.replica_id)
        ceiling = merged.share(ceilings(merged, x), self.replica_id)
        # Jobs in the global view: those that had an open operation here when the
        # digest was built. Newer ones keep the local decision.
        jobs = digest.jobs
        covered = {j for j, o in zip(jobs.job_id, jobs.open_op.tolist(), strict=True) if o}
        rates = {j: rate for j, rate in share.items() if j in covered and math.isfinite(rate)}
        total = math.fsum(d.capacity for d in digests)
        budgets = budgets_of(bindings, targets, share, self.capacity, total) if bindings else None
        if part is None:
            return Share(rates, {j: max(ceiling[j], rates[j]) for j in rates}, budgets=budgets)
        return self._with_pattern(rates, ceiling, part, budgets)

    def _pattern_part(self, policy: Policy, digests: list[Digest]) -> Part | None:
        """This replica's part of the global pattern of a policy that paces to patterns
        (controller/patterns.py); None for any other policy."""
        if not isinstance(policy, PerSchedLive):
            self.pattern = GlobalPattern(self.replica_id)
            return None
        installed = policy.installed
        heard = {}
        for d in digests:
            last = self.membership.last_heard(d.replica_id)
            if last is not None:
                heard[d.replica_id] = last[1]
        reserve = policy.params.reserve if isinstance(policy.params, PerSchedParams) else 0.0
        return self.pattern.part(
            installed.computed.key if installed is not None else None,
            installed.schedules if installed is not None else {},
            digests,
            heard,
            self._clock(),
            self.capacity * (1.0 - reserve),
        )

    def _with_pattern(
        self,
        rates: dict[JobId, float],
        ceiling: dict[JobId, float],
        part: Part,
        budgets: dict[str, float] | None,
    ) -> Share:
        """The share with this replica's windows: a job of the pattern gets its part of its
        windows, or nothing while the replicas do not agree on the pattern yet (never a plain
        rate out of step with the windows); the others share what the windows' peak leaves."""
        policy = self.slot.merged
        installed = policy.installed if isinstance(policy, PerSchedLive) else None
        patterned = set(installed.schedules) if installed is not None else set()
        others = {j: r for j, r in rates.items() if j not in patterned}
        room = max(0.0, self.capacity - part.peak)
        total = math.fsum(others.values())
        if total > room:
            others = {j: r * (room / total) for j, r in others.items()}
        held = {**dict.fromkeys(patterned - set(part.schedules), 0.0), **others}
        ceilings = {j: min(max(ceiling.get(j, r), r), r + room) for j, r in held.items()}
        return Share(held, ceilings, part.schedules, part.peak, budgets)

    def _same_inputs(self, inputs: tuple[Policy, list[Digest], list[HeldBack]], rules: int) -> bool:
        """The share computed from ``self._inputs`` holds for ``inputs`` and the rules'
        version ``rules``: the same rules, the same policy
        object, one that names the view fields it reads (``Policy.reads``), none of them
        a time, and the same digests in the columns those fields and the split come
        from (``merge.columns_read``), but for their sequences and send instants."""
        last = self._inputs
        policy, digests, held = inputs
        if last is None or last[0] is not policy or rules != self._rules_seen:
            return False
        columns = columns_read(policy.reads)
        if columns is None:
            return False
        before, held_before = last[1], last[2]
        return (
            len(before) == len(digests)
            and all(same_columns(a, b, columns) for a, b in zip(before, digests, strict=True))
            and len(held_before) == len(held)
            and all(a is b for a, b in zip(held_before, held, strict=True))
        )

    def _log(self, conflicts: tuple[Conflict, ...]) -> None:
        for c in conflicts:
            key = (c.job_id, c.field, c.replica_id)
            if key not in self._conflicts:
                self._conflicts.add(key)
                log.warning(
                    "job %r: replica %r reports %s=%r, using %r",
                    c.job_id,
                    c.replica_id,
                    c.field,
                    c.value,
                    c.used,
                )

    def stats(self) -> dict[str, Any]:
        """The exchange as this replica sees it: what stats() and the admin views report."""
        now = self._clock()
        return {
            "sync_interval_s": self.interval,
            "exchanges": self.exchanges,
            "shares_kept": self.reused,
            "sequence": self.sequence,
            "in_global_view": self.local_targets is not None,
            "catalog": self.catalog.stats() if self.catalog is not None else None,
            "held_back": [
                {"replica_id": rid, "until_s": round(max(0.0, h.until - now), 3)}
                for rid, h in sorted(self.held_back.items())
            ],
            "peers": [
                {
                    "replica_id": p.replica_id,
                    "live": p.live,
                    "last_exchange_age_s": round(p.heard_age, 3),
                    "capacity": p.capacity,
                    "policy": p.policy,
                    "policy_version": p.policy_version,
                    "jobs": p.jobs,
                }
                for p in self.membership.peer_states(now)
            ],
            "links": [
                {
                    "address": link.address,
                    "replica_id": link.replica_id,
                    "failures": link.failures,
                    "streams_opened": link.streams_opened,
                    "refused": link.refused,
                    "full_digests": link.fulls,
                    "full_bytes": link.full_bytes,
                    "deltas": link.deltas,
                    "delta_bytes": link.delta_bytes,
                }
                for link in self.links
            ],
        }

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links), return_exceptions=True)
