"""gRPC servicer of ``burstctl.v1.Controller``: one ``Session`` stream per client.

Reads ``ClientMessage``s, validates them, turns them into job-table events and
writes the ``Allocation``s the scheduler offers. Bad input (an undecodable
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
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError

from burstctl.common.limits import (
    DEFAULT_MAX_NOTICES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CLIENT,
    DEFAULT_RETRY_AFTER,
    DEFAULT_SHED_LOOP_LAG,
    MAX_BATCH,
    MAX_NODES,
    MAX_PRIORITY,
    MAX_TEXT,
    RETRY_AFTER_KEY,
    buffer_problem,
    identifier_problem,
    period_problem,
)
from burstctl.controller.buffer import BufferBooks
from burstctl.controller.jobs import (
    Counters,
    JobMeta,
    JobTable,
    LimitError,
    OpKind,
    ProtocolError,
    SessionState,
)
from burstctl.controller.trust import ClientTrust, Gate, Refused, UnregisteredLimits, admit
from burstctl.policies.schedule import Schedule
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

    At most ``max_notices`` error notices wait to be sent; the ones beyond are only
    counted, and go out as one summary notice (``RESOURCE_EXHAUSTED``, "N more error
    notices dropped") once the queue has drained: a client that provokes errors faster
    than it reads them costs the controller a bounded queue, never more.
    """

    __slots__ = (
        "_acked",
        "_allocation",
        "_clock",
        "_dropped",
        "_end",
        "_errors",
        "_event",
        "_last",
        "_replica",
        "_space",
        "_waiting",
        "max_notices",
    )

    def __init__(
        self,
        replica_id: str = "",
        max_notices: int = DEFAULT_MAX_NOTICES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._event = asyncio.Event()
        self._allocation: tuple[float, float, int, float, str, Schedule | None] | None = None
        self._clock = clock  # the clock of the schedules' origins (the job table's)
        self._errors: deque[tuple[str, str, str]] = deque()  # (code, field, message)
        self._dropped = 0  # notices beyond max_notices since the last summary
        self._end: tuple[grpc.StatusCode, str] | None = None
        self._replica = replica_id
        self.max_notices = max_notices
        self._acked = 0  # the newest epoch the client reported in force (Usage.applied_epoch)
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []  # see `applied`
        # The burst buffer's space limit every Allocation carries (None: no capacity), and the
        # last allocation written, re-sent as it was when only the limit rises (`offer_space`).
        self._space: int | None = None
        self._last: tuple[float, float, int, float, str, Schedule | None] | None = None

    def applied(self, epoch: int) -> asyncio.Future[None]:
        """Done once the client reports an allocation of ``epoch`` or newer in force (or the
        stream ended).

        The scheduler holds increases back until the decreases offered before them are
        applied: see "Decreases before increases" in docs/protocol.md.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if epoch <= self._acked or self._end is not None:
            future.set_result(None)
        else:
            self._waiting.append((epoch, future))
        return future

    def acknowledge(self, epoch: int) -> None:
        """The client reports the allocation of ``epoch`` in force (a newer one covers older)."""
        if epoch > self._acked:
            self._acked = epoch
            self._release(lambda e: e <= epoch)

    def _release(self, due: Callable[[int], bool]) -> None:
        if not self._waiting:
            return
        keep = []
        for epoch, future in self._waiting:
            if due(epoch):
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((epoch, future))
        self._waiting = keep

    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        self._allocation = (rate, burst, epoch, lease, policy, None)  # an unsent one is moot
        self._event.set()

    def offer_windows(
        self, rate: float, burst: float, epoch: int, lease: float, policy: str, windows: Schedule
    ) -> None:
        """An allocation with a periodic pattern of windows (``rate``: the pattern's mean)."""
        self._allocation = (rate, burst, epoch, lease, policy, windows)
        self._event.set()

    def offer_space(self, limit: int | None) -> None:
        """Sets the space limit every allocation carries from now on. A rise reaches the
        client at once, in a copy of the last allocation written (its epoch unchanged: the
        client takes the limit from it and leaves its rate as it is, docs/capacity.md);
        rises in quick succession coalesce into one message. Not held behind decreases:
        space is not a rate."""
        if limit == self._space:
            return
        self._space = limit
        if self._allocation is None and self._last is not None:
            self._allocation = self._last
        self._event.set()

    def _windows(self, schedule: Schedule) -> pb.Windows:
        """The pattern on the wire: its origin as seconds from now (the client's receipt,
        but for the message's one-way delay) to the next start of a period."""
        period = schedule.period
        origin = (schedule.origin - self._clock()) % period
        if not 0.0 <= origin < period:  # rounding of a tiny negative remainder
            origin = 0.0
        return pb.Windows(
            period_seconds=period,
            origin_seconds=origin,
            window=[
                pb.Window(start_seconds=w.start, end_seconds=w.end, rate=w.rate)
                for w in schedule.windows
            ],
        )

    def error(self, code: grpc.StatusCode, field_name: str, message: str) -> None:
        """Queues a non-fatal notice (or counts it, beyond ``max_notices``); the session goes on."""
        if len(self._errors) >= self.max_notices:
            self._dropped += 1
            return
        self._errors.append((code.name, field_name, message))
        self._event.set()

    @property
    def queued_notices(self) -> int:
        return len(self._errors)

    def end(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        if self._end is None:
            self._end = (code, details)
        self._event.set()
        self._release(lambda e: True)  # nothing more will be applied: nobody waits on it

    @property
    def ended(self) -> tuple[grpc.StatusCode, str] | None:
        return self._end

    async def next(self) -> pb.ServerMessage | None:
        """The next message to write, or None once the stream should end."""
        while True:
            # A graceful end first tells what is queued (at most max_notices + 1 messages):
            # a client that half-closes after its last message still learns of every error.
            if self._end is not None and (
                self._end[0] is not grpc.StatusCode.OK or not (self._errors or self._dropped)
            ):
                return None
            if self._errors:
                code, field_name, message = self._errors.popleft()
                return pb.ServerMessage(
                    error=pb.Error(code=code, field=field_name, message=message)
                )
            if self._dropped:
                dropped, self._dropped = self._dropped, 0
                return pb.ServerMessage(
                    error=pb.Error(
                        code=grpc.StatusCode.RESOURCE_EXHAUSTED.name,
                        message=f"{dropped} more error notices dropped "
                        f"(max_notices = {self.max_notices} queued per session)",
                    )
                )
            if self._allocation is not None:
                rate, burst, epoch, lease, policy, schedule = self._last = self._allocation
                self._allocation = None
                allocation = pb.Allocation(
                    rate=rate,
                    burst=burst,
                    epoch=epoch,
                    lease_seconds=lease,
                    policy=policy,
                    replica_id=self._replica,
                )
                if self._space is not None:
                    allocation.space.limit = self._space
                if schedule is not None:
                    # Computed last, just before the write: the origin's error is the delay.
                    allocation.windows.CopyFrom(self._windows(schedule))
                return pb.ServerMessage(allocation=allocation)
            self._event.clear()
            await self._event.wait()


class LoopLag:
    """How late the event loop runs a timer, probed every ``interval`` seconds.

    ``value`` follows a rise at once and decays by ``DECAY`` per probe (a half-life of about
    0.7 s), so one stall counts for a moment, not for ever; ``peak`` is the largest seen.
    """

    DECAY = 0.9

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.value = 0.0
        self.peak = 0.0

    def sample(self, late: float) -> None:
        late = max(0.0, late)
        self.value = (
            late if late > self.value else self.DECAY * self.value + (1 - self.DECAY) * late
        )
        self.peak = max(self.peak, late)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval)
            self.sample(loop.time() - start - self.interval)


def client_host(peer: str) -> str:
    """The host of a gRPC peer string: ``ipv4:10.0.0.7:5432`` → ``10.0.0.7``,
    ``ipv6:[::1]:5432`` → ``::1``; anything else (``unix:…``) as it is."""
    scheme, sep, rest = peer.partition(":")
    if not sep or scheme not in ("ipv4", "ipv6"):
        return peer
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return rest
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


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
    bad_period = period_problem(h.period_w, h.period_vol)
    if bad_period is not None:
        name = "period_w" if bad_period[0] == "w" else "period_vol"
        raise ProtocolError(f"hello.{name}", bad_period[1])
    meta = JobMeta(
        job_id=h.job_id,
        user=h.user,
        group=h.group,
        nodes=h.nodes,
        priority=priority,
        w=h.period_w,
        vol_io=h.period_vol,
    )
    return meta, h.client_id, h.host


def validate_purpose(h: pb.Hello) -> bool:
    """True for a drain stream (Hello.purpose = DRAIN), False for an APP one; a drain stream
    carries no Buffer (docs/capacity.md)."""
    if h.purpose not in (pb.PURPOSE_APP, pb.PURPOSE_DRAIN):
        raise ProtocolError("hello.purpose", f"unknown purpose {h.purpose}")
    drain = h.purpose == pb.PURPOSE_DRAIN
    if drain and h.HasField("buffer"):
        raise ProtocolError("hello.buffer", "a drain stream carries no buffer report")
    return drain


def check_buffer(buffer: pb.Buffer, name: str) -> None:
    """A Buffer report against common/limits.py; ``name`` is where it was (``usage.buffer``)."""
    problem = buffer_problem(buffer.resident, buffer.pending, buffer.added, buffer.drain_error)
    if problem is not None:
        raise ProtocolError(f"{name}.{problem[0]}", problem[1])


def _totals(u: pb.Usage, where: str) -> Counters:
    """The session's cumulative counters of a Usage, checked."""
    t = u.totals
    name = f"{where}usage.totals"
    for field_name in ("bytes", "bytes_read", "bytes_written", "ops", "metadata_ops"):
        value = getattr(t, field_name)
        if value < 0:
            raise ProtocolError(f"{name}.{field_name}", f"must be >= 0, got {value}")
    if not (math.isfinite(t.wait_seconds) and t.wait_seconds >= 0):
        raise ProtocolError(
            f"{name}.wait_seconds", f"must be finite and >= 0, got {t.wait_seconds}"
        )
    if t.bytes_read + t.bytes_written > t.bytes:
        raise ProtocolError(f"{name}.bytes", f"bytes_read + bytes_written exceed bytes ({t.bytes})")
    if t.metadata_ops > t.ops:
        raise ProtocolError(f"{name}.metadata_ops", f"exceeds ops ({t.ops})")
    return Counters(
        bytes=t.bytes,
        bytes_read=t.bytes_read,
        bytes_written=t.bytes_written,
        ops=t.ops,
        metadata_ops=t.metadata_ops,
        wait_seconds=t.wait_seconds,
    )


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
    ) -> None:
        self.table = table
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
        self.lag = LoopLag()  # probed by the replica (app.py); read by admit()
        # Who may open a session for which job (controller/trust.py, docs/security.md).
        self.gate = gate or Gate(secret=None, mutual_tls=False, client_trust=ClientTrust.OPEN)
        self.unregistered = unregistered or UnregisteredLimits(
            max_nodes=MAX_NODES, max_priority=MAX_PRIORITY
        )
        self.denied = 0  # sessions refused by the trust rules (PERMISSION_DENIED, ...)
        self.streams: dict[int, SessionStream] = {}
        self._goodbyes: set[int] = set()  # sessions that said Goodbye (their books close clean)
        self._per_client: dict[str, int] = {}  # open sessions by client host
        self.messages = 0  # client messages handled, for stats
        self.rejected = 0  # sessions ended with INVALID_ARGUMENT
        self.refused = 0  # Hellos refused with RESOURCE_EXHAUSTED (a limit; load shedding)

    def rpc_handlers(self) -> grpc.GenericRpcHandler:
        # Registered by hand (not the generated helper) so that an undecodable
        # request reaches the handler and gets INVALID_ARGUMENT, not INTERNAL.
        handler = grpc.stream_stream_rpc_method_handler(
            self.session,
            request_deserializer=decode_client_message,
            response_serializer=pb.ServerMessage.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {"Session": handler})

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
        client = client_host(context.peer())
        try:
            try:
                first = await anext(aiter(requests))
            except StopAsyncIteration:
                return
            hello = self._check(first)
            meta, client_id, host = validate_hello(hello)
            drain = validate_purpose(hello.hello)
            buffer = hello.hello.buffer if hello.hello.HasField("buffer") else None
            if buffer is not None:
                self._check_buffer(buffer, client_id, "hello.buffer")
            self.admit(client)
            meta = self._admit(meta, context)
            stream = SessionStream(self.replica_id, self.max_notices, self.table.clock)
            session = self.table.open_session(meta, client_id, host, drain=drain, outbox=stream)
            self.streams[session.sid] = stream
            if buffer is not None:
                self._open_holder(session, buffer)
            self._per_client[client] = self._per_client.get(client, 0) + 1
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
        except LimitError as exc:
            await self._refuse(exc, context)
        except Refused as exc:
            self.denied += 1
            log.warning("session refused (%s): %s", context.peer(), exc)
            await context.abort(exc.code, str(exc))
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            if session is not None:
                if self.books is not None and session.sid in self.books.holders:
                    self.books.close(session.sid, clean=session.sid in self._goodbyes)
                    self.request_grant()
                ended = self.streams.pop(session.sid, None)
                if ended is not None:
                    ended.end()  # releases whoever waits for an acknowledgement that cannot come
                    left = self._per_client[client] - 1
                    if left:
                        self._per_client[client] = left
                    else:
                        del self._per_client[client]
                self.table.close_session(session)
                self._goodbyes.discard(session.sid)
                log.debug("session %d closed", session.sid)

    async def _refuse(self, exc: LimitError, context: grpc.aio.ServicerContext) -> None:
        """Ends a stream refused by a limit: RESOURCE_EXHAUSTED, with a retry hint if the
        limit is one of load (the client waits that long before its next Hello)."""
        self.refused += 1
        if exc.retry:
            # Load shedding can refuse many Hellos a second: not a warning each.
            log.debug("session refused (%s): %s", context.peer(), exc)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{exc}; retry in {self.retry_after:g} s",
                trailing_metadata=((RETRY_AFTER_KEY, str(round(self.retry_after * 1000))),),
            )
        else:
            log.warning("session refused (%s): %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))

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

    def _handle(self, session: SessionState, msg: pb.ClientMessage, where: str) -> bool:
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
            totals = _totals(u, where) if u.HasField("totals") else None
            if u.HasField("buffer"):
                self._buffer_report(session, u, f"{where}usage.buffer")
            self.table.usage(
                session, u.bytes, u.ops, u.wait_seconds, u.interval_seconds, u.waiting, totals
            )
            self._acknowledge(session, u.applied_epoch)
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
            except LimitError as exc:
                raise LimitError(where + exc.field, exc.detail) from None
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
            self.table.goodbye(session)
            self._goodbyes.add(session.sid)
            return False
        elif kind == "hello":
            raise ProtocolError(f"{where}hello", "only the first message of a session")
        elif kind == "batch":
            raise ProtocolError(f"{where}batch", "batches do not nest")
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

    def _open_holder(self, session: SessionState, buffer: pb.Buffer) -> None:
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

    def _buffer_report(self, session: SessionState, u: pb.Usage, name: str) -> None:
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

    def _acknowledge(self, session: SessionState, epoch: int) -> None:
        stream = self.streams.get(session.sid)
        if epoch and stream is not None:
            stream.acknowledge(epoch)

    @staticmethod
    def _check(raw: pb.ClientMessage | Malformed) -> pb.ClientMessage:
        if isinstance(raw, Malformed):
            raise ProtocolError("message", f"not a valid burstctl.v1.ClientMessage ({raw.error})")
        return raw
