"""gRPC servicer of ``burstctl.v1.Controller``: one ``Session`` stream per client.

Reads ``ClientMessage``s, validates them, turns them into job-table events and
writes the ``Allocation``s the scheduler offers. Bad input (an undecodable
message, a message before ``Hello``, a field out of range) ends *that* stream
with ``INVALID_ARGUMENT`` and a message naming the field; every other session
goes on untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from burstctl.controller.jobs import JobMeta, JobTable, OpKind, ProtocolError, SessionState
from burstctl.controller.trust import ClientTrust, Gate, Refused, UnregisteredLimits, admit
from burstctl.limits import MAX_BATCH, MAX_NODES, MAX_PRIORITY, MAX_TEXT, identifier_problem
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

log = logging.getLogger(__name__)

SERVICE_NAME = "burstctl.v1.Controller"
_KINDS = {
    pb.OP_KIND_READ: OpKind.READ,
    pb.OP_KIND_WRITE: OpKind.WRITE,
    pb.OP_KIND_METADATA: OpKind.METADATA,
}


class Malformed:
    """Stands for a request that did not decode; the handler rejects it."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def decode_client_message(data: bytes) -> pb.ClientMessage | Malformed:
    try:
        return pb.ClientMessage.FromString(data)
    except DecodeError as exc:
        return Malformed(exc)


class SessionStream:
    """The outgoing side of one session: the newest allocation wins, errors queue.

    The scheduler offers plain values; the protobuf message is built here, when
    the writer gets to run, so an allocation superseded before it is sent costs
    nothing but a tuple.
    """

    __slots__ = ("_allocation", "_end", "_errors", "_event", "_replica")

    def __init__(self, replica_id: str = "") -> None:
        self._event = asyncio.Event()
        self._allocation: tuple[float, float, int, float, str] | None = None
        self._errors: deque[pb.ServerMessage] = deque()
        self._end: tuple[grpc.StatusCode, str] | None = None
        self._replica = replica_id

    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        self._allocation = (rate, burst, epoch, lease, policy)  # an unsent one is moot
        self._event.set()

    def error(self, code: grpc.StatusCode, field_name: str, message: str) -> None:
        """Queues a non-fatal notice; the session goes on."""
        self._errors.append(
            pb.ServerMessage(error=pb.Error(code=code.name, field=field_name, message=message))
        )
        self._event.set()

    def end(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        if self._end is None:
            self._end = (code, details)
        self._event.set()

    @property
    def ended(self) -> tuple[grpc.StatusCode, str] | None:
        return self._end

    async def next(self) -> pb.ServerMessage | None:
        """The next message to write, or None once the stream should end."""
        while True:
            if self._end is not None:
                return None
            if self._errors:
                return self._errors.popleft()
            if self._allocation is not None:
                rate, burst, epoch, lease, policy = self._allocation
                self._allocation = None
                return pb.ServerMessage(
                    allocation=pb.Allocation(
                        rate=rate,
                        burst=burst,
                        epoch=epoch,
                        lease_seconds=lease,
                        policy=policy,
                        replica_id=self._replica,
                    )
                )
            self._event.clear()
            await self._event.wait()


def validate_hello(msg: pb.ClientMessage) -> tuple[JobMeta, str, str]:
    kind = msg.WhichOneof("body")
    if kind != "hello":
        raise ProtocolError("hello", f"the first message of a session must be hello, got {kind}")
    h = msg.hello
    for name in ("job_id", "user", "group"):
        problem = identifier_problem(getattr(h, name))
        if problem:
            raise ProtocolError(f"hello.{name}", problem)
    for name in ("client_id", "host"):
        if len(getattr(h, name)) > MAX_TEXT:
            raise ProtocolError(f"hello.{name}", f"longer than {MAX_TEXT} characters")
    if not 1 <= h.nodes <= MAX_NODES:
        raise ProtocolError("hello.nodes", f"must be in [1, {MAX_NODES}], got {h.nodes}")
    priority = h.priority or 1.0
    if not (math.isfinite(priority) and 0 < priority <= MAX_PRIORITY):
        raise ProtocolError("hello.priority", f"must be in (0, {MAX_PRIORITY:g}], got {priority}")
    meta = JobMeta(job_id=h.job_id, user=h.user, group=h.group, nodes=h.nodes, priority=priority)
    return meta, h.client_id, h.host


class ControllerServicer:
    """Handles ``Session`` streams for one replica."""

    def __init__(
        self,
        table: JobTable,
        *,
        max_op_volume: int,
        replica_id: str = "",
        gate: Gate | None = None,
        unregistered: UnregisteredLimits | None = None,
    ) -> None:
        self.table = table
        self.replica_id = replica_id
        self.max_op_volume = max_op_volume
        # Who may open a session for which job (controller/trust.py, docs/security.md).
        self.gate = gate or Gate(secret=None, mutual_tls=False, client_trust=ClientTrust.OPEN)
        self.unregistered = unregistered or UnregisteredLimits(
            max_nodes=MAX_NODES, max_priority=MAX_PRIORITY
        )
        self.refused = 0  # sessions refused by the trust rules
        self.streams: dict[int, SessionStream] = {}
        self.messages = 0  # client messages handled, for stats
        self.rejected = 0  # sessions ended with INVALID_ARGUMENT

    def rpc_handlers(self) -> grpc.GenericRpcHandler:
        # Registered by hand (not the generated helper) so that an undecodable
        # request reaches the handler and gets INVALID_ARGUMENT, not INTERNAL.
        handler = grpc.stream_stream_rpc_method_handler(
            self.session,
            request_deserializer=decode_client_message,
            response_serializer=pb.ServerMessage.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {"Session": handler})

    def kill(
        self,
        session: SessionState,
        details: str,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
    ) -> None:
        """Ends a session's stream from outside (heartbeat timeout, shutdown, a registration
        that gives its job to another user)."""
        stream = self.streams.get(session.sid)
        if stream is not None:
            stream.end(code, details)

    def _admit(self, meta: JobMeta, context: grpc.aio.ServicerContext) -> JobMeta:
        vouched = self.gate.vouched(context.invocation_metadata())
        client_trust = ClientTrust.OPEN if vouched else self.gate.client_trust
        return admit(
            self.table,
            meta,
            vouched=vouched or client_trust is ClientTrust.OPEN,
            client_trust=client_trust,
            limits=self.unregistered,
        )

    async def session(
        self,
        requests: AsyncIterator[pb.ClientMessage | Malformed],
        context: grpc.aio.ServicerContext,
    ) -> None:
        session: SessionState | None = None
        reader: asyncio.Task[None] | None = None
        try:
            try:
                first = await anext(aiter(requests))
            except StopAsyncIteration:
                return
            meta, client_id, host = validate_hello(self._check(first))
            meta = self._admit(meta, context)
            stream = SessionStream(self.replica_id)
            session = self.table.open_session(meta, client_id, host)
            session.outbox = stream
            self.streams[session.sid] = stream
            log.debug(
                "session %d opened: job %s from %s (%s)",
                session.sid,
                meta.job_id,
                host,
                context.peer(),
            )
            reader = asyncio.create_task(
                self._read(requests, session, stream), name=f"session-{session.sid}-reader"
            )
            while (message := await stream.next()) is not None:
                await context.write(message)
            code, details = stream.ended or (grpc.StatusCode.OK, "")
            if code is not grpc.StatusCode.OK:
                await context.abort(code, details)
        except ProtocolError as exc:
            self.rejected += 1
            log.warning("session rejected (%s): %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Refused as exc:
            self.refused += 1
            log.warning("session refused (%s): %s", context.peer(), exc)
            await context.abort(exc.code, str(exc))
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            if session is not None:
                self.streams.pop(session.sid, None)
                self.table.close_session(session)
                log.debug("session %d closed", session.sid)

    async def _read(
        self,
        requests: AsyncIterator[pb.ClientMessage | Malformed],
        session: SessionState,
        stream: SessionStream,
    ) -> None:
        try:
            async for raw in requests:
                msg = self._check(raw)
                if msg.WhichOneof("body") == "batch":
                    batch = msg.batch.messages
                    if len(batch) > MAX_BATCH:
                        raise ProtocolError("batch.messages", f"more than {MAX_BATCH} messages")
                    going_on = True
                    for i, inner in enumerate(batch):
                        going_on = self._handle(session, inner, f"batch.messages[{i}].")
                        if not going_on:
                            break
                else:
                    going_on = self._handle(session, msg, "")
                if not going_on:
                    break
        except ProtocolError as exc:
            self.rejected += 1
            log.warning("session %d rejected: %s", session.sid, exc)
            stream.end(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the transport broke; the handler cleans up
            log.debug("session %d reader ended: %r", session.sid, exc)
        stream.end()

    def _handle(self, session: SessionState, msg: pb.ClientMessage, where: str) -> bool:
        """Applies one message to the job table; False once the client said goodbye."""
        self.messages += 1
        kind = msg.WhichOneof("body")
        if kind == "usage":
            u = msg.usage
            if u.bytes < 0:
                raise ProtocolError(f"{where}usage.bytes", f"must be >= 0, got {u.bytes}")
            if u.ops < 0:
                raise ProtocolError(f"{where}usage.ops", f"must be >= 0, got {u.ops}")
            for name in ("wait_seconds", "interval_seconds"):
                value = getattr(u, name)
                if not (math.isfinite(value) and value >= 0):
                    raise ProtocolError(
                        f"{where}usage.{name}", f"must be finite and >= 0, got {value}"
                    )
            self.table.usage(session, u.bytes, u.ops, u.wait_seconds, u.interval_seconds, u.waiting)
        elif kind == "op_posted":
            p = msg.op_posted
            op_kind = _KINDS.get(p.kind)
            if op_kind is None:
                raise ProtocolError(f"{where}op_posted.kind", f"unknown operation kind {p.kind}")
            if not 0 <= p.volume <= self.max_op_volume:
                raise ProtocolError(
                    f"{where}op_posted.volume",
                    f"must be in [0, {self.max_op_volume}] bytes (0 = unknown), got {p.volume}",
                )
            try:
                self.table.post(session, p.op_id, op_kind, p.volume)
            except ProtocolError as exc:
                raise ProtocolError(where + exc.field, exc.detail) from None
        elif kind == "op_completed":
            if msg.op_completed.op_id <= 0:
                raise ProtocolError(f"{where}op_completed.op_id", "must be > 0")
            if not self.table.complete(session, msg.op_completed.op_id):
                # Harmless to the table, but a client bug worth telling the client about.
                self.streams[session.sid].error(
                    grpc.StatusCode.NOT_FOUND,
                    f"{where}op_completed.op_id",
                    f"no open operation {msg.op_completed.op_id} on this session",
                )
        elif kind == "goodbye":
            return False
        elif kind == "hello":
            raise ProtocolError(f"{where}hello", "only the first message of a session")
        elif kind == "batch":
            raise ProtocolError(f"{where}batch", "batches do not nest")
        else:
            raise ProtocolError(f"{where}body", "empty message")
        return True

    @staticmethod
    def _check(raw: pb.ClientMessage | Malformed) -> pb.ClientMessage:
        if isinstance(raw, Malformed):
            raise ProtocolError("message", f"not a valid burstctl.v1.ClientMessage ({raw.error})")
        return raw
