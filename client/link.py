"""A node's one stream per controller replica, and each session's part of it.

`NodeLink` holds one ``Node`` stream to a replica for every session a `ClientRuntime` (a mount,
a preload agent, a program) opens there (docs/protocol.md, "Node streams"): one writer sends
what all the sessions queued as one ``Batch``, each message tagged with its session; one reader
hands each ``ServerMessage`` to its session. A session sees its part of the stream, a `Leg`,
as it would see a gRPC call of its own: ``write``, ``read`` (``EOF`` after a ``SessionEnd``
OK, an ``AioRpcError`` with the code, message and retry hint of any other), ``code``,
``details``, ``initial_metadata``, ``done``, ``done_writing``, ``cancel``, and ``leave``: it
gives the session up without a Goodbye, telling the controller the rate it goes on pacing at.

When the stream ends (the controller went away or restarted), every leg on it ends with the
stream's code and each session opens a new leg, on a new stream, as it reconnects. A controller
that does not know ``Node`` (``UNIMPLEMENTED``: before Node streams) gets a ``Session`` stream per
session from then on (`SessionCall`, the same interface): the compatibility rule.

Everything here runs on the loop of the sessions it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc

from burstctl.common.limits import MAX_BATCH, RETRY_AFTER_KEY
from burstctl.proto.burstctl.v1 import controller_pb2 as pb
from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

# Seconds the writer of a stream that carries several sessions lets their messages gather
# before it writes: each gRPC message costs both ends a fixed amount, and a node's sessions
# report at their own moments. A session alone on its stream writes at once, and so does one
# whose message others wait on (`urgent`).
LINGER = 0.01
# Most bytes of messages in one Batch: well below the smallest message a controller may be
# configured to receive (max_message_bytes, 64 KiB at least).
MAX_BATCH_BYTES = 48 * 1024


class Call(Protocol):
    """What a session's stream code uses of its stream: a `Leg` or a `SessionCall`."""

    async def write(self, messages: Sequence[pb.ClientMessage], urgent: bool = False) -> None: ...

    async def read(self) -> Any: ...

    async def code(self) -> grpc.StatusCode: ...

    async def details(self) -> str | None: ...

    async def initial_metadata(self) -> Any: ...

    def done(self) -> bool: ...

    async def done_writing(self) -> None: ...

    def cancel(self) -> bool: ...

    def leave(self, pacing_rate: float) -> None: ...


class SessionCall:
    """A ``Session`` stream of its own (a controller without Node streams), as a `Call`."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call

    async def write(self, messages: Sequence[pb.ClientMessage], urgent: bool = False) -> None:
        await self._call.write(one_message(messages))

    async def read(self) -> Any:
        return await self._call.read()

    async def code(self) -> grpc.StatusCode:
        return await self._call.code()

    async def details(self) -> str | None:
        return await self._call.details()

    async def initial_metadata(self) -> Any:
        return await self._call.initial_metadata()

    def done(self) -> bool:
        return self._call.done()

    async def done_writing(self) -> None:
        await self._call.done_writing()

    def cancel(self) -> bool:
        return self._call.cancel()

    def leave(self, pacing_rate: float) -> None:
        """Cancelling is all a Session stream can say; the controller guesses the rest."""
        self._call.cancel()


class Leg:
    """One session's part of a `NodeLink`'s stream, with the interface of a gRPC call."""

    def __init__(self, stream: _NodeCall, tag: int) -> None:
        self._stream = stream
        self.tag = tag
        self._inbox: deque[pb.ServerMessage] = deque()
        self._arrived = asyncio.Event()
        self._end: tuple[grpc.StatusCode, str, int] | None = None
        self._cancelled = False

    # --------------------------------------------------------------- the stream's side

    def deliver(self, message: pb.ServerMessage) -> None:
        if self._end is None:
            self._inbox.append(message)
            self._arrived.set()

    def finish(self, code: grpc.StatusCode, details: str, retry_ms: int = 0) -> None:
        """The session is over (its SessionEnd, or the stream's end): after what came."""
        if self._end is None:
            self._end = (code, details, retry_ms)
            self._arrived.set()
            self._stream.forget(self.tag)

    # --------------------------------------------------------------- the session's side

    async def write(self, messages: Sequence[pb.ClientMessage], urgent: bool = False) -> None:
        """Queues ``messages``, each tagged, on the node's stream, which batches what all its
        sessions queued; ``urgent`` (or a message someone waits on by its kind, `is_urgent`):
        written without the linger."""
        if self._end is not None:
            return
        for one in messages:
            one.session = self.tag
            self._stream.send(one, urgent or is_urgent(one))

    async def read(self) -> Any:
        while not self._inbox:
            if self._end is not None:
                code, details, retry_ms = self._end
                if self._cancelled:
                    # as gRPC does after a call was cancelled by its own side
                    raise asyncio.CancelledError()
                if code is grpc.StatusCode.OK:
                    return grpc.aio.EOF
                trailing = ((RETRY_AFTER_KEY, str(retry_ms)),) if retry_ms else ()
                raise grpc.aio.AioRpcError(
                    code,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(*trailing),
                    details,
                )
            self._arrived.clear()
            await self._arrived.wait()
        return self._inbox.popleft()

    async def code(self) -> grpc.StatusCode:
        while self._end is None:
            self._arrived.clear()
            await self._arrived.wait()
        return self._end[0]

    async def details(self) -> str | None:
        await self.code()
        assert self._end is not None
        return self._end[1]

    async def initial_metadata(self) -> Any:
        """Once the stream is admitted (sessions are admitted in-band, by their first
        Allocation or their SessionEnd), or it ended."""
        await self._stream.admitted()
        return grpc.aio.Metadata()

    def done(self) -> bool:
        return self._end is not None

    async def done_writing(self) -> None:
        """Nothing to do: a session ends with its Goodbye, and the controller's SessionEnd."""

    def cancel(self) -> bool:
        """Ends the session here at once; the controller hears it as a Leave at rate 0."""
        return self._give_up(0.0)

    def leave(self, pacing_rate: float) -> None:
        """Gives the session up without a Goodbye; it goes on pacing at ``pacing_rate``."""
        self._give_up(pacing_rate)

    def _give_up(self, pacing_rate: float) -> bool:
        if self._end is not None:
            return False
        self._stream.send(
            pb.ClientMessage(session=self.tag, leave=pb.Leave(pacing_rate=pacing_rate))
        )
        self._cancelled = True
        self.finish(grpc.StatusCode.CANCELLED, "left by the client")
        return True


def one_message(messages: Sequence[pb.ClientMessage]) -> pb.ClientMessage:
    """What goes on the wire for ``messages`` (at least one): the message itself, or a Batch
    of them (each gRPC message has a fixed cost on both ends)."""
    if len(messages) == 1:
        return messages[0]
    return pb.ClientMessage(batch=pb.Batch(messages=messages))


def is_urgent(message: pb.ClientMessage) -> bool:
    """Whether someone waits on ``message`` by its kind: a Hello (the session's first
    allocation), an operation that starts or ends (the job's application, or the others its
    bandwidth goes to), a Leave, or the acknowledgement of a decrease (a Usage with only
    ``applied_epoch``: the controller holds other sessions' increases until it comes;
    docs/protocol.md). A report that a wait starts is urgent by its writer's word
    (`Leg.write`). What lingers is the periodic reporting, the bulk of a node's messages."""
    body = message.WhichOneof("body")
    if body in ("hello", "op_posted", "op_completed", "leave"):
        return True
    if body != "usage":
        return False
    usage = message.usage
    return not (usage.interval_seconds or usage.bytes or usage.HasField("totals"))


class _NodeCall:
    """One ``Node`` call and the legs on it; ended for good when the call ends."""

    def __init__(
        self, stub: pb_grpc.ControllerStub, on_end: Callable[[_NodeCall, grpc.StatusCode], None]
    ) -> None:
        self._call = stub.Node()
        self._legs: dict[int, Leg] = {}
        self._queue: deque[pb.ClientMessage] = deque()
        self._queued = asyncio.Event()
        self._urgent = asyncio.Event()  # a message is queued that must not linger
        self._admitted = asyncio.Event()
        self._ended = False
        self._on_end = on_end
        self._writer = asyncio.get_running_loop().create_task(self._write(), name="node-writer")
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="node-reader")

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def finished(self) -> bool:
        """Ended, and the gRPC call done with."""
        return self._reader.done()

    def leg(self, tag: int) -> Leg:
        leg = self._legs[tag] = Leg(self, tag)
        return leg

    def forget(self, tag: int) -> None:
        self._legs.pop(tag, None)

    def send(self, message: pb.ClientMessage, now: bool = False) -> None:
        """Queues ``message``; ``now``: written without the linger."""
        if not self._ended:
            self._queue.append(message)
            self._queued.set()
            if now:
                self._urgent.set()

    async def admitted(self) -> None:
        if not self._ended:
            with contextlib.suppress(asyncio.CancelledError):
                await self._admitted.wait()

    async def _write(self) -> None:
        call, queue = self._call, self._queue
        try:
            # Nothing is written before the controller admitted the stream (its initial
            # metadata, sent at once): a write in flight when a refusal or UNIMPLEMENTED (a
            # controller before Node streams) ends the call turns its status into INTERNAL
            # here, and the fallback to Session streams would be missed (docs/protocol.md).
            await call.initial_metadata()
            self._admitted.set()
            if call.done():
                return
            while True:
                while not queue:
                    self._queued.clear()
                    await self._queued.wait()
                if len(self._legs) > 1 and len(queue) < MAX_BATCH and not self._urgent.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(LINGER):
                            await self._urgent.wait()
                self._urgent.clear()
                # What queued up while the previous write was in flight goes as one Batch:
                # each gRPC message has a fixed cost on both ends.
                batch = [queue.popleft()]
                size = batch[0].ByteSize()
                while queue and len(batch) < MAX_BATCH:
                    size += queue[0].ByteSize()
                    if size > MAX_BATCH_BYTES:
                        break
                    batch.append(queue.popleft())
                await call.write(one_message(batch))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            logger.debug("stopped writing to the node stream: %r", err)

    async def _read(self) -> None:
        call = self._call
        code, details = grpc.StatusCode.UNAVAILABLE, "the node stream ended"
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    break
                if message.WhichOneof("body") == "batch":
                    for inner in message.batch.messages:
                        self._dispatch(inner)
                else:
                    self._dispatch(message)
        except grpc.aio.AioRpcError as err:
            code, details = err.code(), err.details() or ""
        except asyncio.CancelledError:
            code, details = grpc.StatusCode.CANCELLED, "the node stream was closed"
        except Exception:
            logger.exception("reading the node stream failed")
        self._end(code, details)
        # Let the call finish on this loop before anything closes it (gRPC delivers its
        # completion through the loop that started it).
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await call.code()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer

    def _dispatch(self, message: pb.ServerMessage) -> None:
        if message.WhichOneof("body") == "renew":  # for every session on the stream
            for each in self._legs.values():
                each.deliver(message)
            return
        leg = self._legs.get(message.session)
        if leg is None:
            return  # a session that ended here already
        if message.WhichOneof("body") == "end":
            end = message.end
            code = getattr(grpc.StatusCode, end.code, grpc.StatusCode.UNKNOWN)
            if not isinstance(code, grpc.StatusCode):
                code = grpc.StatusCode.UNKNOWN
            leg.finish(code, end.message, max(0, end.retry_after_ms))
        else:
            leg.deliver(message)

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._admitted.set()
        self._writer.cancel()
        self._call.cancel()
        for leg in list(self._legs.values()):
            leg.finish(code, details)
        self._on_end(self, code)

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


class NodeLink:
    """A node's connection to one replica: its channel and, on it, one ``Node`` stream for
    all the node's sessions (opened on first use, and again after it ends)."""

    def __init__(self, channel: grpc.aio.Channel, *, node_streams: bool = True) -> None:
        """``node_streams`` False: one Session stream per session from the start, as with a
        controller before Node streams."""
        self.channel = channel
        self._stub = pb_grpc.ControllerStub(channel)
        self._current: _NodeCall | None = None
        self._calls: set[_NodeCall] = set()  # not finished yet (the current one among them)
        self._tags = itertools.count(1)  # never reused, so a tag names one session for ever
        self._legacy = not node_streams  # the controller has no Node streams

    def open(self) -> Call:
        """A new session's stream: a leg of the node stream (or a Session stream of its own
        with a controller before Node streams)."""
        if self._legacy:
            return SessionCall(self._stub.Session())
        current = self._current
        if current is None or current.ended:
            current = self._current = _NodeCall(self._stub, self._ended)
            self._calls = {call for call in self._calls if not call.finished}
            self._calls.add(current)
        return current.leg(next(self._tags))

    def _ended(self, call: _NodeCall, code: grpc.StatusCode) -> None:
        if code is grpc.StatusCode.UNIMPLEMENTED:
            logger.info("the controller has no Node streams: one Session stream per session")
            self._legacy = True
        if self._current is call:
            self._current = None

    async def close(self) -> None:
        """Ends the node stream (the channel stays open: its owner closes it)."""
        self._current = None
        calls, self._calls = list(self._calls), set()
        await asyncio.gather(*(call.close() for call in calls), return_exceptions=True)
