"""Replica-to-replica sync: digests on the wire, the ``Peer`` service and the exchange loop.

Every λ (``sync_interval``), and early (at least λ/4 after the previous one)
when a local job starts or ends an I/O phase, a replica builds its
:class:`Digest` from its job table and sends it to every configured peer
(``burstctl.v1.Peer/Stream``: one grpc.aio channel and one long-lived stream per
peer, each digest written within λ; the peer replies only to a digest it does
not accept).
What it receives goes into its :class:`GlobalView`. After each exchange it
expires peers silent for k·λ and, when at least one peer is live, computes the
global split (:meth:`GlobalView.targets`) and hands its own column to the
scheduler. See
``docs/replicas.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from burstctl.controller.global_view import (
    JOB_ARRAY_FIELDS,
    JOB_TEXT_FIELDS,
    Digest,
    DigestError,
    GlobalView,
    JobColumns,
    Status,
    validate,
)
from burstctl.controller.jobs import JobStatus, JobTable
from burstctl.policies.registry import PolicyRegistry
from burstctl.policies.view import JobId, job_cap
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

log = logging.getLogger(__name__)

PEER_SERVICE_NAME = "burstctl.v1.Peer"
_STREAM = f"/{PEER_SERVICE_NAME}/Stream"
# The initial metadata key of a Peer/Stream that carries the receiver's replica id.
REPLICA_ID_KEY = "burstctl-replica-id"
# An early exchange (poke) comes at least this fraction of λ after the previous one.
EARLY_GAP = 0.25


# ---------------------------------------------------------------------------
# Conversion


def digest_to_proto(digest: Digest) -> pb.Digest:
    msg = pb.Digest(
        replica_id=digest.replica_id,
        incarnation=digest.incarnation,
        epoch=digest.epoch,
        capacity=digest.capacity,
        node_bandwidth=digest.node_bandwidth,
        policy=digest.policy,
        policy_params_json=json.dumps(dict(digest.policy_params), sort_keys=True),
        policy_version=digest.policy_version,
    )
    cols = digest.columns()
    out = msg.jobs
    for name in JOB_TEXT_FIELDS:
        getattr(out, name).extend(getattr(cols, name))
    for name in JOB_ARRAY_FIELDS:
        getattr(out, name).extend(getattr(cols, name).tolist())
    return msg


def digest_from_proto(msg: pb.Digest) -> Digest:
    """The digest in ``msg``, validated; raises :class:`DigestError` naming the bad field.

    The jobs stay columns (:class:`JobColumns`): no Python object per job."""
    params: Any = {}
    if msg.policy_params_json:
        try:
            params = json.loads(msg.policy_params_json)
        except ValueError as exc:
            raise DigestError("policy_params_json", f"not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise DigestError("policy_params_json", "must be a JSON object")
    wire = msg.jobs
    jobs = JobColumns(**{name: getattr(wire, name) for name in JOB_TEXT_FIELDS + JOB_ARRAY_FIELDS})
    digest = Digest(
        replica_id=msg.replica_id,
        incarnation=msg.incarnation,
        epoch=msg.epoch,
        capacity=msg.capacity,
        node_bandwidth=msg.node_bandwidth,
        policy=msg.policy,
        policy_params=params,
        policy_version=msg.policy_version,
        jobs=jobs,
    )
    validate(digest)
    return digest


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
# Digest of the local job table


def build_digest(
    table: JobTable,
    *,
    replica_id: str,
    incarnation: int,
    epoch: int,
    capacity: float,
    node_bandwidth: float,
    policy: str,
    policy_params: dict[str, Any],
    policy_version: int,
    usage_seen: dict[JobId, int],
    now: float,
) -> Digest:
    """This replica's digest at ``now``; ``usage_seen`` (bytes moved per job at the
    previous digest) is updated in place. The jobs are built as columns."""
    job_ids: list[str] = []
    users: list[str] = []
    groups: list[str] = []
    nodes: list[int] = []
    priorities: list[float] = []
    demands: list[float] = []
    usages: list[int] = []
    progresses: list[float] = []
    released: list[float] = []
    posted: list[float] = []
    remainings: list[float] = []
    opens: list[bool] = []
    transferred: list[float] = []
    nan = math.nan
    for job_id in sorted(table.jobs):
        job = table.jobs[job_id]
        if job.status is not JobStatus.ACTIVE:
            usage_seen.pop(job_id, None)
            continue
        meta = job.meta
        cap = job_cap(meta.nodes, node_bandwidth, capacity)
        ops = list(job.open_ops())
        moved = job.bytes_moved - usage_seen.get(job_id, 0)
        usage_seen[job_id] = job.bytes_moved
        job_ids.append(job_id)
        users.append(meta.user)
        groups.append(meta.group)
        nodes.append(meta.nodes)
        priorities.append(meta.priority)
        usages.append(max(0, moved))
        progresses.append(max(0.0, job.progress(now, cap)))
        released.append(min(0.0, job.first_seen - now))
        opens.append(bool(ops))
        transferred.append(job.transferred)
        if ops:
            demands.append(table.job_demand(job, cap))
            posted.append(min(0.0, min(o.posted_at for o in ops) - now))
            known = all(o.volume > 0 for o in ops)
            remainings.append(sum(max(0, o.volume - o.moved) for o in ops) if known else nan)
        else:
            demands.append(0.0)
            posted.append(nan)
            remainings.append(nan)
    for job_id in [j for j in usage_seen if j not in table.jobs]:
        del usage_seen[job_id]
    return Digest(
        replica_id=replica_id,
        incarnation=incarnation,
        epoch=epoch,
        capacity=float(capacity),
        node_bandwidth=float(node_bandwidth),
        policy=policy,
        policy_params=dict(policy_params),
        policy_version=policy_version,
        jobs=JobColumns(
            job_id=job_ids,
            user=users,
            group=groups,
            nodes=nodes,
            priority=priorities,
            demand=demands,
            usage_bytes=usages,
            progress=progresses,
            released_at=released,
            posted_at=posted,
            remaining=remainings,
            open_op=opens,
            transferred=transferred,
        ),
    )


# ---------------------------------------------------------------------------
# Receiving side


class PeerServicer:
    """``burstctl.v1.Peer``: merges received digests into ``view``."""

    def __init__(
        self,
        view: GlobalView,
        replica_id: str,
        clock: Callable[[], float] = time.monotonic,
        on_accept: Callable[[Digest], None] | None = None,
    ) -> None:
        self.view = view
        self.replica_id = replica_id
        self._clock = clock
        # Called with every accepted digest: the replica adopts a newer policy at once.
        self._on_accept = on_accept
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
        return grpc.method_handlers_generic_handler(
            PEER_SERVICE_NAME, {"Exchange": exchange, "Stream": stream}
        )

    async def exchange(
        self, request: pb.Digest | _Malformed, context: grpc.aio.ServicerContext
    ) -> pb.ExchangeReply:
        try:
            return self._receive(request, context)
        except DigestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from None  # abort raises

    async def stream(
        self,
        requests: AsyncIterator[pb.Digest | _Malformed],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ExchangeReply]:
        """The digests of one peer for as long as it keeps the stream.

        This replica's id goes out once, in the initial metadata; an accepted
        digest gets no reply (a reply per digest would double the gRPC events
        of an exchange), any other outcome (rejected, stale, duplicate) a reply.
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
            digest = digest_from_proto(request)
        except DigestError as exc:
            self.rejected += 1
            log.warning("malformed digest from %s: %s", context.peer(), exc)
            raise
        outcome = self.view.receive(digest, self._clock(), validated=True)
        if outcome.status is Status.REJECTED:
            self.rejected += 1
        elif outcome.accepted and self._on_accept is not None:
            try:
                self._on_accept(digest)
            except Exception:  # the digest is held; a failed adoption is retried next time
                log.exception("could not apply digest from replica %r", digest.replica_id)
        return pb.ExchangeReply(
            replica_id=self.replica_id,
            status=outcome.status.value,
            field=outcome.field or "",
            reason=outcome.reason,
        )


# ---------------------------------------------------------------------------
# Sending side


class PeerLink:
    """One configured peer address: its channel and the replica id it answered with."""

    def __init__(self, address: str, interval: float = 0.5) -> None:
        self.address = address
        # gRPC backs off up to 120 s between connection attempts by default; a peer
        # restarted after a crash must be reached again within about one λ.
        backoff_ms = max(50, int(interval * 1000))
        self._options = [
            ("grpc.initial_reconnect_backoff_ms", backoff_ms),
            ("grpc.min_reconnect_backoff_ms", backoff_ms),
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ]
        # Opened on first use: a grpc.aio channel belongs to the loop it was created in,
        # and the service is built before the CLI starts its loop.
        self.channel: grpc.aio.Channel | None = None
        self._open_stream: Callable[[], grpc.aio.StreamStreamCall] | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self._reader: asyncio.Task[None] | None = None
        self.replica_id: str | None = None
        self.failures = 0
        self.streams_opened = 0
        self.refused = 0  # digests the peer answered as not accepted

    async def send(self, wire: bytes, timeout: float) -> bool:
        """Sends one encoded ``Digest`` (encoded once for every peer) on this link's
        stream within ``timeout``; False when that fails.

        One ``Peer/Stream`` call per peer, kept open. The peer names itself in
        the stream's initial metadata and answers only digests it does not
        accept (logged here by a reader task), so a digest costs one write and
        one read of gRPC events, not two of each. A failure closes the stream;
        the next send opens a new one.
        """
        try:
            async with asyncio.timeout(timeout):
                call = self._call
                if call is None or call.done():
                    call = await self._open()
                await call.write(wire)
        except (grpc.RpcError, TimeoutError, asyncio.InvalidStateError) as exc:
            # InvalidStateError: the stream ended between done() and write()
            self.failures += 1
            detail = (
                f"{exc.code()} {exc.details()}"
                if isinstance(exc, grpc.aio.AioRpcError)
                else type(exc).__name__
            )
            log.debug("exchange with %s failed: %s", self.address, detail)
            self._drop_stream()
            return False
        return True

    async def _open(self) -> grpc.aio.StreamStreamCall:
        """A new stream, once the peer has said who it is."""
        self._drop_stream()
        if self._open_stream is None:
            self.channel = grpc.aio.insecure_channel(self.address, options=self._options)
            self._open_stream = self.channel.stream_stream(
                _STREAM,
                request_serializer=None,  # bytes as they are
                response_deserializer=pb.ExchangeReply.FromString,
            )
        call = self._call = self._open_stream()
        self.streams_opened += 1
        metadata = dict(await call.initial_metadata() or ())
        replica_id = metadata.get(REPLICA_ID_KEY)
        if not isinstance(replica_id, str) or not replica_id:
            raise _NotAPeer(f"{self.address} did not name its replica ({REPLICA_ID_KEY})")
        if replica_id != self.replica_id:
            log.info("peer %s is replica %r", self.address, replica_id)
            self.replica_id = replica_id
        self._reader = asyncio.create_task(self._read(call), name=f"peer-{self.address}-replies")
        return call

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        """Logs the peer's replies: each one is a digest it did not accept."""
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            async for reply in call:
                assert isinstance(reply, pb.ExchangeReply)
                self.refused += 1
                log.debug(  # the peer logs rejections as warnings; no need to say it twice
                    "peer %s (%s) did not accept our digest: %s %s",
                    self.address,
                    reply.replica_id,
                    reply.status,
                    reply.reason,
                )

    def _drop_stream(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def close(self) -> None:
        self._drop_stream()
        if self.channel is not None:
            await self.channel.close(grace=None)


class _NotAPeer(grpc.RpcError):
    """The address answered the stream without naming a replica: not a burstctl peer."""


class PeerSync:
    """The exchange loop of one replica.

    ``column`` is this replica's rate for every job of the global view (after
    the last exchange with at least one live peer), or None: the local policy
    decides alone. ``on_update`` is called after every exchange.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        addresses: list[str],
        interval: float,
        missed: int,
        registry: PolicyRegistry,
        make_digest: Callable[[int], Digest],
        on_update: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.replica_id = replica_id
        self.interval = interval
        self.missed = missed
        self.registry = registry
        self.view = GlobalView(replica_id, peers=(), registry=registry)
        self.links = [PeerLink(a, interval) for a in addresses]
        self._make_digest = make_digest
        self._on_update = on_update
        self._clock = clock
        self.epoch = 0
        self.column: dict[JobId, float] | None = None
        self.exchanges = 0
        self._wake: asyncio.Event | None = None  # set by poke(); made in run()'s loop

    def _allowed(self) -> None:
        # Only replicas that answered on a configured address may report.
        self.view.peers = frozenset(
            link.replica_id for link in self.links if link.replica_id is not None
        )

    def poke(self) -> None:
        """The local S(t) changed (a job started or ended an I/O phase): exchange soon,
        not at the end of the interval, so peers learn of it within about λ/4."""
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        self._wake = asyncio.Event()
        while True:
            started = self._clock()
            self._wake.clear()  # what changes from now on goes into a later digest
            try:
                await self.exchange_once()
            except Exception:  # a bug here must not stop the controller
                log.exception("digest exchange failed")
            # Every λ, or earlier after a poke, but never within EARLY_GAP·λ of the
            # previous exchange: job churn costs at most 1/EARLY_GAP exchanges per λ.
            gap = EARLY_GAP * self.interval - (self._clock() - started)
            if gap > 0:
                await asyncio.sleep(gap)
            left = self.interval - (self._clock() - started)
            if left > 0 and not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)

    async def exchange_once(self) -> None:
        self.epoch += 1
        digest = self._make_digest(self.epoch)
        wire = digest_to_proto(digest).SerializeToString()
        sent = await asyncio.gather(
            *(link.send(wire, self.interval) for link in self.links), return_exceptions=True
        )
        for link, outcome in zip(self.links, sent, strict=True):
            if isinstance(outcome, Exception):  # a bug in one link must not cost the others
                link.failures += 1
                log.error("exchange with %s failed", link.address, exc_info=outcome)
        self._allowed()
        self.view.expire(self._clock(), self.interval, self.missed)
        self.exchanges += 1
        if not self.view.live_peers():
            self.column = None
        else:
            column = self.view.column(digest, self.registry)
            # Jobs in the global view: those that had an open operation here when
            # the digest was built. Newer ones keep the local decision.
            cols = digest.columns()
            covered = {j for j, o in zip(cols.job_id, cols.open_op.tolist(), strict=True) if o}
            self.column = {
                j: rate for j, rate in column.items() if j in covered and math.isfinite(rate)
            }
        self._on_update()

    def stats(self) -> dict[str, Any]:
        """The exchange as this replica sees it: what stats() and the admin views report."""
        now = self._clock()
        return {
            "sync_interval_s": self.interval,
            "exchanges": self.exchanges,
            "epoch": self.epoch,
            "in_global_view": self.column is not None,
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
                for p in self.view.peer_states(now)
            ],
            "links": [
                {
                    "address": link.address,
                    "replica_id": link.replica_id,
                    "failures": link.failures,
                    "streams_opened": link.streams_opened,
                    "refused": link.refused,
                }
                for link in self.links
            ],
        }

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links), return_exceptions=True)
