"""The sending side of the replica exchange: one peer address, its stream, what it holds.

A :class:`PeerLink` keeps one long-lived ``burstctl.v1.Peer/Sync`` stream to one
configured peer address and knows which of this replica's digests the peer holds
through that stream: the last one written on it, until the stream ends or the peer
replies (it replies only to a digest it did not accept). An exchange's digest is
an :class:`Outgoing`: the sent view in full and the delta on the previous one
(``controller/delta.py``), each encoded at most once for every peer; a link sends
the delta when its peer holds the delta's base, the full digest otherwise (a new
stream, a reply, a failed send). See ``docs/replicas.md``, "Deltas".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from burstctl.common.channels import ChannelSecurity
from burstctl.controller.digest import Digest
from burstctl.controller.digest_wire import to_proto
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

log = logging.getLogger(__name__)

PEER_SERVICE_NAME = "burstctl.v1.Peer"
_SYNC = f"/{PEER_SERVICE_NAME}/Sync"
# The initial metadata key of a Peer stream that carries the receiver's replica id.
REPLICA_ID_KEY = "burstctl-replica-id"


class Outgoing:
    """One exchange's digest as this replica sends it: ``full`` (the sent view) and
    ``delta`` (on the sequence before it; None: every peer gets the full one)."""

    __slots__ = ("_delta_wire", "_full_wire", "delta", "full")

    def __init__(self, full: Digest, delta: Digest | None) -> None:
        self.full = full
        self.delta = delta
        self._full_wire: bytes | None = None
        self._delta_wire: bytes | None = None

    @property
    def sequence(self) -> int:
        return self.full.sequence

    def wire(self, holds: int | None) -> tuple[bytes, bool]:
        """The bytes for a peer that holds sequence ``holds`` (None: nothing known) and
        whether they are a delta."""
        if self.delta is not None and holds == self.delta.base_sequence:
            if self._delta_wire is None:
                self._delta_wire = to_proto(self.delta).SerializeToString()
            return self._delta_wire, True
        if self._full_wire is None:
            self._full_wire = to_proto(self.full).SerializeToString()
        return self._full_wire, False


class PeerLink:
    """One configured peer address: its channel, the replica id it answered with, and
    the sequence of this replica's digest it holds through the current stream."""

    def __init__(
        self, address: str, interval: float = 0.5, security: ChannelSecurity | None = None
    ) -> None:
        self.address = address
        self._security = security if security is not None else ChannelSecurity()
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
        self._told_earlier = False
        # The sequence last written on the current stream; None: send a full digest.
        self.holds: int | None = None
        self.failures = 0
        self.streams_opened = 0
        self.refused = 0  # digests the peer answered as not accepted
        self.fulls = 0  # full digests written, and their bytes
        self.full_bytes = 0
        self.deltas = 0  # deltas written, and their bytes
        self.delta_bytes = 0

    async def send(self, outgoing: Outgoing, timeout: float) -> bool:
        """Sends ``outgoing`` on this link's stream within ``timeout``, as a delta when
        the peer holds its base; False when that fails.

        One ``Peer/Sync`` call per peer, kept open. The peer names itself in the
        stream's initial metadata and answers only digests it does not accept
        (logged here by a reader task, which also makes the next digest a full
        one), so a digest costs one write and one read of gRPC events, not two of
        each. A failure closes the stream; the next send opens a new one and
        starts it with a full digest.
        """
        try:
            async with asyncio.timeout(timeout):
                call = self._call
                if call is None or call.done():
                    call = await self._open()
                wire, is_delta = outgoing.wire(self.holds)
                self.holds = None  # until the write is done
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
        self.holds = outgoing.sequence
        if is_delta:
            self.deltas += 1
            self.delta_bytes += len(wire)
        else:
            self.fulls += 1
            self.full_bytes += len(wire)
        return True

    async def _open(self) -> grpc.aio.StreamStreamCall:
        """A new stream, once the peer has said who it is."""
        self._drop_stream()
        if self._open_stream is None:
            self.channel = self._security.open(self.address, options=self._options)
            self._open_stream = self.channel.stream_stream(
                _SYNC,
                request_serializer=None,  # bytes as they are
                response_deserializer=pb.ExchangeReply.FromString,
            )
        call = self._call = self._open_stream()
        self.streams_opened += 1
        metadata = dict(await call.initial_metadata() or ())
        replica_id = metadata.get(REPLICA_ID_KEY)
        if not isinstance(replica_id, str) or not replica_id:
            if call.done() and await call.code() == grpc.StatusCode.UNIMPLEMENTED:
                if not self._told_earlier:  # once per link: it fails every λ until upgraded
                    self._told_earlier = True
                    log.error(
                        "peer %s has no Peer/Sync: a replica of an earlier version? "
                        "Replicas of a deployment upgrade together",
                        self.address,
                    )
                raise _NotAPeer(f"{self.address} has no Peer/Sync")
            raise _NotAPeer(f"{self.address} did not name its replica ({REPLICA_ID_KEY})")
        if replica_id != self.replica_id:
            log.info("peer %s is replica %r", self.address, replica_id)
            self.replica_id = replica_id
        self._reader = asyncio.create_task(self._read(call), name=f"peer-{self.address}-replies")
        return call

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        """Logs the peer's replies: each one is a digest it did not accept, so what it
        holds of this replica is unknown and the next digest goes in full."""
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            async for reply in call:
                assert isinstance(reply, pb.ExchangeReply)
                self.refused += 1
                self.holds = None
                log.debug(  # the peer logs rejections as warnings; no need to say it twice
                    "peer %s (%s) did not accept our digest: %s %s",
                    self.address,
                    reply.replica_id,
                    reply.status,
                    reply.reason,
                )

    def _drop_stream(self) -> None:
        self.holds = None
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
