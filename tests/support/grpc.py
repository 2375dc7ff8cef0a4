"""The Session protocol spoken by hand: message builders and raw gRPC streams.

For tests that send what a well-behaved client never would (no client runtime): ``hello``
and ``post`` build the messages, ``RawSession`` drives one ``Session`` stream message by
message, ``RawNode`` one ``Node`` stream of many tagged sessions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from burstctl.proto.burstctl.v1 import controller_pb2 as pb
from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc


def hello(
    job: str = "j1",
    nodes: int = 1,
    *,
    user: str = "alice",
    group: str = "g",
    client_id: str = "t",
    **fields: object,
) -> pb.ClientMessage:
    """The first message of a session: a ``Hello`` for ``job`` (``fields``: any other field
    of ``Hello``, such as ``priority`` or ``period_w``)."""
    return pb.ClientMessage(
        hello=pb.Hello(
            job_id=job, user=user, group=group, nodes=nodes, client_id=client_id, **fields
        )
    )


def post(op_id: int, kind: int = pb.OP_KIND_WRITE, volume: int = 0) -> pb.ClientMessage:
    """An ``OpPosted`` (a write of unknown volume unless told)."""
    return pb.ClientMessage(op_posted=pb.OpPosted(op_id=op_id, kind=kind, volume=volume))


class RawSession:
    """A bidi stream driven message by message; a task drains responses into a queue
    (started only when ``read`` is true: a client may also never read).

    (Cancelling a pending ``call.read()`` cancels the whole RPC, so reads are
    never wrapped in a timeout directly.)
    """

    def __init__(self, channel: grpc.aio.Channel, read: bool = True) -> None:
        self.call = pb_grpc.ControllerStub(channel).Session()
        self.inbox: asyncio.Queue[pb.ServerMessage] = asyncio.Queue()
        self.reader: asyncio.Task[None] | None = None
        if read:
            self.start_reading()

    def start_reading(self) -> None:
        self.reader = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while (msg := await self.call.read()) is not grpc.aio.EOF:
            self.inbox.put_nowait(msg)

    async def send(self, msg: pb.ClientMessage) -> None:
        await self.call.write(msg)

    async def allocation(self, timeout: float = 5.0) -> pb.Allocation:
        msg = await asyncio.wait_for(self.inbox.get(), timeout)
        assert msg.WhichOneof("body") == "allocation", msg
        return msg.allocation

    async def rate_becomes(
        self, predicate: Callable[[float], bool], timeout: float = 5.0
    ) -> pb.Allocation:
        """Reads allocations until one satisfies ``predicate``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            alloc = await self.allocation(max(0.01, deadline - loop.time()))
            if predicate(alloc.rate):
                return alloc

    async def status(self, timeout: float = 5.0) -> grpc.aio.AioRpcError:
        """Waits for the stream to fail and returns the error."""
        assert self.reader is not None
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(asyncio.shield(self.reader), timeout)
            raise AssertionError(f"stream ended with {await self.call.code()}")
        return info.value

    async def close(self) -> None:
        """Goodbye, half-close, and the stream ends OK."""
        await self.send(pb.ClientMessage(goodbye=pb.Goodbye()))
        await self.call.done_writing()
        assert await self.call.code() == grpc.StatusCode.OK


def tagged(session: int, msg: pb.ClientMessage) -> pb.ClientMessage:
    """``msg`` for ``session`` of a Node stream."""
    msg.session = session
    return msg


class RawNode:
    """A ``Node`` stream driven by hand: ``send`` what you like; a task files what comes back
    by session (batches taken apart) into ``received``, and ``ended`` holds each session's
    ``SessionEnd``. ``acknowledge``: every allocation is acknowledged as it comes (as a
    client acknowledges a decrease), so the replica's increases for others are not held."""

    def __init__(self, channel: grpc.aio.Channel, acknowledge: bool = False) -> None:
        self.call = pb_grpc.ControllerStub(channel).Node()
        self._acknowledge = acknowledge
        self._writing = asyncio.Lock()
        self.received: dict[int, list[pb.ServerMessage]] = {}
        self.ended: dict[int, pb.SessionEnd] = {}
        self.batches = 0  # ServerBatch messages read
        self.renewals = 0  # Renew messages read (for every session of the stream)
        self.reader = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while (msg := await self.call.read()) is not grpc.aio.EOF:
            if msg.WhichOneof("body") == "batch":
                self.batches += 1
                inner = list(msg.batch.messages)
            else:
                inner = [msg]
            for one in inner:
                if one.WhichOneof("body") == "renew":
                    self.renewals += 1
                elif one.WhichOneof("body") == "end":
                    self.ended[one.session] = one.end
                else:
                    self.received.setdefault(one.session, []).append(one)
                    if self._acknowledge and one.WhichOneof("body") == "allocation":
                        epoch = one.allocation.epoch
                        ack = pb.ClientMessage(usage=pb.Usage(applied_epoch=epoch))
                        await self.send(tagged(one.session, ack))

    async def send(self, *msgs: pb.ClientMessage) -> None:
        """One message, or several as one ``Batch``."""
        async with self._writing:  # (one write at a time on a gRPC call)
            if len(msgs) == 1:
                await self.call.write(msgs[0])
            else:
                await self.call.write(pb.ClientMessage(batch=pb.Batch(messages=msgs)))

    def allocations(self, session: int) -> list[pb.Allocation]:
        return [
            m.allocation
            for m in self.received.get(session, [])
            if m.WhichOneof("body") == "allocation"
        ]

    def rate(self, session: int) -> float | None:
        """The rate of the session's newest allocation (None before one)."""
        allocations = self.allocations(session)
        return allocations[-1].rate if allocations else None
