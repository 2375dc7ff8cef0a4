"""The gRPC servicer of ``burstctl.v1.Controller``: one ``Session`` stream per client.

Reads ``ClientMessage``s, validates them (``controller/messages.py``), turns them into
job-table events and writes what the scheduler offers through each stream's outbox
(``controller/outbox.py``). Bad input (an undecodable
message, a message before ``Hello``, a field out of range) ends *that* stream
with ``INVALID_ARGUMENT`` and a message naming the field; every other session
goes on untouched.

Limits (docs/configuration.md, "Limits"): a ``Hello`` beyond ``max_sessions``,
``max_sessions_per_client`` or a full job table is refused with
``RESOURCE_EXHAUSTED``, a message naming the limit and the trailing metadata
``retry-after-ms`` (load shedding: the sessions already open keep their rates),
and so is any ``Hello`` while the event loop lags more than ``shed_loop_lag``;
more than ``max_open_ops`` open operations end that stream with
``RESOURCE_EXHAUSTED``; at most ``max_notices`` error notices wait on a stream,
the ones beyond are counted and reported in one summary notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from burstctl.common.limits import (
    DEFAULT_MAX_NOTICES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CLIENT,
    DEFAULT_RETRY_AFTER,
    DEFAULT_SHED_LOOP_LAG,
    MAX_BATCH,
    MAX_NODES,
    MAX_PRIORITY,
    RETRY_AFTER_KEY,
)
from burstctl.controller.buffer import BufferBooks
from burstctl.controller.ghosts import Ghosts
from burstctl.controller.jobs import JobTable, LimitError, ProtocolError
from burstctl.controller.load import LoopLag, client_host
from burstctl.controller.messages import (
    Malformed,
    check_buffer,
    check_op_completed,
    check_op_posted,
    check_usage,
    decode_client_message,
    decoded,
    validate_hello,
    validate_purpose,
)
from burstctl.controller.metadata_qos import MetadataQos
from burstctl.controller.node import NodeStream
from burstctl.controller.outbox import StreamOutbox
from burstctl.controller.records import JobMeta, SessionRecord
from burstctl.controller.trust import ClientTrust, Gate, Refused, UnregisteredLimits, admit
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

log = logging.getLogger(__name__)

SERVICE_NAME = "burstctl.v1.Controller"

# A client is told to report at least this many times per heartbeat timeout (an idle or steady
# session says nothing new in between: docs/protocol.md, "Usage when it changes").
HEARTBEATS_PER_TIMEOUT = 3


class ControllerServicer:
    """Handles ``Session`` streams for one replica."""

    def __init__(
        self,
        table: JobTable,
        *,
        max_op_volume: int,
        replica_id: str = "",
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
        max_notices: int = DEFAULT_MAX_NOTICES,
        retry_after: float = DEFAULT_RETRY_AFTER,
        shed_loop_lag: float = DEFAULT_SHED_LOOP_LAG,
        gate: Gate | None = None,
        unregistered: UnregisteredLimits | None = None,
        books: BufferBooks | None = None,
        capacities: tuple[float, float] = (0.0, 0.0),
        ghosts: Ghosts | None = None,
        lease: float = 5.0,
        metadata: MetadataQos | None = None,
    ) -> None:
        self.table = table
        # Each session's share of its job's metadata limit, re-offered as sessions come and go.
        self.metadata = metadata or MetadataQos(table)
        # What the streams share: (the capacity B, the PFS bandwidth), for application and
        # drain streams. A new session's Hello.pacing_rate counts as in force up to it.
        self.capacities = capacities
        # Each session's share of the fallback budget, in every Allocation: what it may pace
        # at once this replica has been away past the client's grace. A share is the capacity
        # over max_sessions, so the sessions the replica can hold never exceed it together
        # (docs/client.md, "When the controller is away").
        self.fallback_shares = (capacities[0] / max_sessions, capacities[1] / max_sessions)
        # Sessions gone without a Goodbye, whose clients may still pace (controller/ghosts.py)
        self.ghosts = ghosts if ghosts is not None else Ghosts(retention=0.0)
        self.lease = lease
        # The burst buffer's books (controller/buffer.py): Buffer reports and space grants.
        self.books = books
        self._grant_soon = False
        self.replica_id = replica_id
        self.max_op_volume = max_op_volume
        self.max_sessions = max_sessions
        self.max_sessions_per_client = max_sessions_per_client
        self.max_notices = max_notices
        self.retry_after = retry_after
        self.shed_loop_lag = shed_loop_lag
        self.lag = LoopLag()  # its probe runs as a task of the replica; read by admit()
        # Who may open a session for which job (controller/trust.py, docs/security.md).
        self.gate = gate or Gate(secret=None, mutual_tls=False, client_trust=ClientTrust.OPEN)
        self.unregistered = unregistered or UnregisteredLimits(
            max_nodes=MAX_NODES, max_priority=MAX_PRIORITY
        )
        self.denied = 0  # sessions refused by the trust rules (PERMISSION_DENIED, ...)
        self.streams: dict[int, StreamOutbox] = {}  # the open sessions' outboxes
        self.node_streams = 0  # Node streams open (each carries any number of sessions)
        self._goodbyes: set[int] = set()  # sessions that said Goodbye (their books close clean)
        self._per_client: dict[str, int] = {}  # open sessions by client host
        self.messages = 0  # client messages handled, for stats
        self.rejected = 0  # sessions ended with INVALID_ARGUMENT
        self.refused = 0  # Hellos refused with RESOURCE_EXHAUSTED (a limit; load shedding)

    def rpc_handlers(self) -> grpc.GenericRpcHandler:
        # Registered by hand (not the generated helper) so that an undecodable
        # request reaches the handler and gets INVALID_ARGUMENT, not INTERNAL.
        methods = {"Session": self.session, "Node": self.node}
        handlers = {
            name: grpc.stream_stream_rpc_method_handler(
                method,
                request_deserializer=decode_client_message,
                response_serializer=pb.ServerMessage.SerializeToString,
            )
            for name, method in methods.items()
        }
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    def admit(self, client: str) -> None:
        """Raises ``LimitError`` if one more session (from host ``client``) is too many, or
        if the controller is overloaded (its event loop lags): it sheds new sessions so that
        the open ones keep their heartbeats and leases."""
        if 0 < self.shed_loop_lag < self.lag.value:
            raise LimitError(
                "hello",
                f"the controller is overloaded: event-loop lag {self.lag.value:.2f} s > "
                f"shed_loop_lag = {self.shed_loop_lag:g} s",
                retry=True,
            )
        if len(self.streams) >= self.max_sessions:
            raise LimitError(
                "hello",
                f"the controller is at its session limit: max_sessions = {self.max_sessions}",
                retry=True,
            )
        if self._per_client.get(client, 0) >= self.max_sessions_per_client:
            raise LimitError(
                "hello",
                f"{client} is at its session limit: "
                f"max_sessions_per_client = {self.max_sessions_per_client}",
                retry=True,
            )

    def kill(
        self,
        session: SessionRecord,
        details: str,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
    ) -> None:
        """Ends a session's stream from outside (heartbeat timeout, shutdown, a registration
        that gives its job to another user)."""
        stream = self.streams.get(session.sid)
        if stream is not None:
            stream.end(code, details)

    def end_foreign_sessions(self, meta: JobMeta) -> None:
        """Ends the sessions of ``meta``'s job whose user is not ``meta.user`` (a registration
        gave the job to that user, docs/security.md): they reconnect and are refused, so
        their I/O goes to their own default job."""
        job = self.table.jobs.get(meta.job_id)
        for session in list(job.sessions.values()) if job is not None else ():
            claim = session.claim
            if claim is not None and claim.user != meta.user:
                log.warning(
                    "job %s registered to %s: ending session %d of user %s",
                    meta.job_id,
                    meta.user,
                    session.sid,
                    claim.user,
                )
                self.kill(
                    session,
                    f"hello.user: job {meta.job_id!r} is now registered to another user",
                    grpc.StatusCode.PERMISSION_DENIED,
                )
                self.table.close_session(session)

    async def reap(self) -> None:
        """Closes the sessions silent for the table's heartbeat timeout and ends their
        streams; drops the buffer's parked residents past their retention. Runs until
        cancelled."""
        table = self.table
        period = min(1.0, table.heartbeat_timeout / 4)
        while True:
            await asyncio.sleep(period)
            # Silence the controller caused itself (its loop lagging: messages unread) is no
            # client's fault: forgiven, so that overload does not close sessions.
            for session in table.expire(grace=self.lag.value):
                log.warning(
                    "session %d of job %s: no heartbeat for %.1fs, closed",
                    session.sid,
                    session.job.job_id,
                    table.heartbeat_timeout,
                )
                self.kill(session, "no heartbeat within the timeout")
            books = self.books
            if books is not None and books.parked:  # parked residents past the retention
                books.expire()
                self.request_grant()

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

    def open(
        self,
        first: pb.ClientMessage | Malformed,
        context: grpc.aio.ServicerContext,
        client: str,
        notify: Callable[[], None] | None = None,
    ) -> tuple[SessionRecord, StreamOutbox]:
        """Admits a session from its Hello (``first``) and opens its record and outbox.

        Raises ``ProtocolError`` (a bad Hello, naming the field), ``LimitError`` (a limit,
        load shedding) or ``Refused`` (the trust rules): see `refusal`. ``notify``: the
        outbox's (a Node stream's writer)."""
        hello = decoded(first)
        meta, client_id, host = validate_hello(hello)
        drain = validate_purpose(hello.hello)
        buffer = hello.hello.buffer if hello.hello.HasField("buffer") else None
        if buffer is not None:
            self._check_buffer(buffer, client_id, "hello.buffer")
        self.admit(client)
        meta = self._admit(meta, context)
        # What the client paces at now (kept from an earlier stream) is in force until it
        # acknowledges a lower rate: the scheduler's increases for others wait for that.
        pacing = min(hello.hello.pacing_rate, self.capacities[1 if drain else 0])
        stream = StreamOutbox(
            self.replica_id,
            self.max_notices,
            self.table.clock,
            fallback_rate=self.fallback_shares[1 if drain else 0],
            notify=notify,
            heartbeat=self.table.heartbeat_timeout / HEARTBEATS_PER_TIMEOUT,
            pacing=pacing,
        )
        session = self.table.open_session(meta, client_id, host, drain=drain, outbox=stream)
        session.offered = pacing
        # counted as this session now: its ghost, or what a predecessor allotted it (a
        # restart's reserve)
        allotted = min(hello.hello.allotted, self.capacities[1 if drain else 0])
        self.ghosts.claim((client_id, session.job.job_id, drain), max(pacing, allotted))
        self.streams[session.sid] = stream
        if buffer is not None:
            self._open_holder(session, buffer)
        self._per_client[client] = self._per_client.get(client, 0) + 1
        self.metadata.job_changed(session.job.job_id)
        log.debug(
            "session %d opened: job %s from %s (%s)",
            session.sid,
            meta.job_id,
            host,
            context.peer(),
        )
        return session, stream

    def close(self, session: SessionRecord, client: str, leaving: float | None = None) -> None:
        """Closes a session whose stream (or Node-stream session) ended. ``leaving``: the
        rate its client said it goes on pacing at (``Leave``); None: it said nothing, and
        may have given the stream up all the same (`_gave_up`)."""
        if self.books is not None and session.sid in self.books.holders:
            self.books.close(session.sid, clean=session.sid in self._goodbyes)
            self.request_grant()
        if session.sid not in self._goodbyes and (
            (leaving is not None and leaving > 0) or (leaving is None and self._gave_up(session))
        ):
            # its client may go on pacing under its fallback
            share = self.fallback_shares[1 if session.drain else 0]
            cap = self.capacities[1 if session.drain else 0]
            paced = session.offered if leaving is None else min(leaving, cap)
            self.ghosts.add(
                (session.client_id, session.job.job_id, session.drain), max(paced, share)
            )
        ended = self.streams.pop(session.sid, None)
        if ended is not None:
            ended.end()  # releases whoever waits for an acknowledgement that cannot come
            left = self._per_client[client] - 1
            if left:
                self._per_client[client] = left
            else:
                del self._per_client[client]
        self.table.close_session(session)
        self.metadata.job_changed(session.job.job_id)
        self._goodbyes.discard(session.sid)
        log.debug("session %d closed", session.sid)

    def refusal(self, exc: LimitError | Refused) -> tuple[grpc.StatusCode, str, int]:
        """How a session refused at its Hello ends: status, details, and the retry hint in ms
        (0: none) of a refusal for load; counted."""
        if isinstance(exc, Refused):
            self.denied += 1
            log.warning("session refused: %s", exc)
            return exc.code, str(exc), 0
        self.refused += 1
        if exc.retry:
            # Load shedding can refuse many Hellos a second: not a warning each.
            log.debug("session refused: %s", exc)
            return (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{exc}; retry in {self.retry_after:g} s",
                round(self.retry_after * 1000),
            )
        log.warning("session refused: %s", exc)
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), 0

    async def node(
        self,
        requests: AsyncIterator[pb.ClientMessage | Malformed],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """One ``Node`` stream: many sessions of one client node (``controller/node.py``)."""
        self.node_streams += 1
        try:
            await NodeStream(self, context, client_host(context.peer())).run(requests)
        finally:
            self.node_streams -= 1

    async def session(
        self,
        requests: AsyncIterator[pb.ClientMessage | Malformed],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """One ``Session`` stream: one session, its messages untagged."""
        session: SessionRecord | None = None
        reader: asyncio.Task[None] | None = None
        client = client_host(context.peer())
        try:
            try:
                first = await anext(aiter(requests))
            except StopAsyncIteration:
                return
            session, stream = self.open(first, context, client)
            # Admitted: say so at once with the (empty) initial metadata, before any allocation
            # is decided. A client writes nothing after its Hello until then, so that none of
            # its writes is in flight when a refusal ends the stream (docs/protocol.md, "Errors").
            await context.send_initial_metadata(())
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
        except (LimitError, Refused) as exc:
            code, details, retry_ms = self.refusal(exc)
            await context.abort(
                code,
                details,
                trailing_metadata=((RETRY_AFTER_KEY, str(retry_ms)),) if retry_ms else (),
            )
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            if session is not None:
                self.close(session, client)

    def _gave_up(self, session: SessionRecord) -> bool:
        """Whether the client of a stream that ended without a Goodbye may have given it up
        itself, its lease run out unrenewed, and go on pacing under its fallback: this replica
        last pushed to it longer ago than it renews (half a lease, checked every quarter), as
        when it stalled. A client that exited or was killed ends its stream while renewals
        are on time: its rate is free at once."""
        if session.rate is None:
            return False  # never allotted anything: it waits at 0
        job = session.job
        back = (
            other is not session
            and other.client_id == session.client_id
            and other.drain == session.drain
            for other in (*job.sessions.values(), *job.drains.values())
        )
        if any(back):
            return False  # it came back already: its new stream declared its rate
        return self.table.clock() - session.pushed_at > 0.75 * self.lease

    async def _read(
        self,
        requests: AsyncIterator[pb.ClientMessage | Malformed],
        session: SessionRecord,
        stream: StreamOutbox,
    ) -> None:
        try:
            async for raw in requests:
                msg = decoded(raw)
                if msg.WhichOneof("body") == "batch":
                    batch = msg.batch.messages
                    if len(batch) > MAX_BATCH:
                        raise ProtocolError("batch.messages", f"more than {MAX_BATCH} messages")
                    going_on = True
                    for i, inner in enumerate(batch):
                        going_on = self.handle(session, inner, f"batch.messages[{i}].")
                        if not going_on:
                            break
                else:
                    going_on = self.handle(session, msg, "")
                if not going_on:
                    break
        except ProtocolError as exc:
            self.rejected += 1
            log.warning("session %d rejected: %s", session.sid, exc)
            stream.end(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        except LimitError as exc:
            self.refused += 1
            log.warning("session %d ended: %s", session.sid, exc)
            stream.end(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the transport broke; the handler cleans up
            log.debug("session %d reader ended: %r", session.sid, exc)
        stream.end()

    def handle(self, session: SessionRecord, msg: pb.ClientMessage, where: str) -> bool:
        """Applies one message to the job table; False once the client said goodbye."""
        self.messages += 1
        kind = msg.WhichOneof("body")
        if kind == "usage":
            u = msg.usage
            if not (
                u.bytes or u.ops or u.wait_seconds or u.interval_seconds or u.waiting
            ) and not u.HasField("totals"):
                # An acknowledgement only (the client reports a lowered rate in force): no
                # usage sample, nothing for the table (docs/protocol.md).
                self._acknowledge(session, u.applied_epoch)
                return True
            totals = check_usage(u, where)
            if u.HasField("buffer"):
                self._buffer_report(session, u, f"{where}usage.buffer")
            self.table.usage(
                session, u.bytes, u.ops, u.wait_seconds, u.interval_seconds, u.waiting, totals
            )
            self._acknowledge(session, u.applied_epoch)
        elif kind == "op_posted":
            p = msg.op_posted
            op_kind = check_op_posted(p, where, self.max_op_volume)
            try:
                self.table.post(session, p.op_id, op_kind, p.volume)
            except ProtocolError as exc:
                raise ProtocolError(where + exc.field, exc.detail) from None
            except LimitError as exc:
                raise LimitError(where + exc.field, exc.detail) from None
        elif kind == "op_completed":
            quiet = check_op_completed(msg.op_completed, where)
            if not self.table.complete(session, msg.op_completed.op_id, quiet):
                # Harmless to the table, but a client bug worth telling the client about.
                self.streams[session.sid].error(
                    grpc.StatusCode.NOT_FOUND,
                    f"{where}op_completed.op_id",
                    f"no open operation {msg.op_completed.op_id} on this session",
                )
        elif kind == "goodbye":
            self.table.goodbye(session)
            self._goodbyes.add(session.sid)
            return False
        elif kind == "hello":
            raise ProtocolError(f"{where}hello", "only the first message of a session")
        elif kind == "batch":
            raise ProtocolError(f"{where}batch", "batches do not nest")
        elif kind == "leave":
            raise ProtocolError(f"{where}leave", "only on a Node stream")
        else:
            raise ProtocolError(f"{where}body", "empty message")
        return True

    # ------------------------------------------------------------------ the burst buffer

    def _check_buffer(self, buffer: pb.Buffer, client_id: str, name: str) -> None:
        check_buffer(buffer, name)
        if self.books is not None:
            problem = self.books.added_problem(client_id, buffer.added)
            if problem is not None:
                raise ProtocolError(f"{name}.added", problem)

    def _open_holder(self, session: SessionRecord, buffer: pb.Buffer) -> None:
        """An APP session with a Buffer: a holder of the books, with no unused grant yet."""
        if self.books is None:
            return
        self.books.open(
            session.sid,
            session.job.job_id,
            session.client_id,
            session.host,
            buffer.resident,
            buffer.pending,
            buffer.added,
            buffer.drain_error,
        )
        stream = self.streams.get(session.sid)
        if stream is not None:
            stream.offer_space(self.books.limit_of(session.sid))
        self.request_grant()

    def _buffer_report(self, session: SessionRecord, u: pb.Usage, name: str) -> None:
        if session.drain:
            raise ProtocolError(name, "a drain stream carries no buffer report")
        buffer = u.buffer
        check_buffer(buffer, name)
        books = self.books
        if books is None:
            return
        holder = books.holders.get(session.sid)
        if holder is None:  # its Hello had no Buffer: it becomes a holder now
            self._check_buffer(buffer, session.client_id, name)
            self._open_holder(session, buffer)
            return
        if buffer.added < holder.added:
            raise ProtocolError(
                f"{name}.added", f"must never decrease: {buffer.added} after {holder.added}"
            )
        rate = max(session.rate or 0.0, session.measured_rate or 0.0)
        books.report(
            session.sid,
            buffer.resident,
            buffer.pending,
            buffer.added,
            buffer.drain_error,
            u.waiting,
            rate,
        )
        self.request_grant()

    def request_grant(self) -> None:
        """Grants space once the messages at hand are applied (one pass for a burst)."""
        if self.books is None or self.books.size is None or self._grant_soon:
            return
        self._grant_soon = True
        asyncio.get_running_loop().call_soon(self._grant)

    def _grant(self) -> None:
        self._grant_soon = False
        if self.books is None:
            return
        for sid, limit in self.books.grant().items():
            stream = self.streams.get(sid)
            if stream is not None:
                stream.offer_space(limit)

    def _acknowledge(self, session: SessionRecord, epoch: int) -> None:
        stream = self.streams.get(session.sid)
        if epoch and stream is not None:
            stream.acknowledge(epoch)
