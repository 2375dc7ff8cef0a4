"""The capacity tier on the wire (docs/capacity.md, docs/protocol.md): Buffer reports are
checked (INVALID_ARGUMENT naming the field), space limits come in Allocation.space, a rise
comes at once in a copy of the allocation in force, and drain streams are no rows of S(t).

Raw gRPC streams against a replica in this test's loop (real server on loopback).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from support import async_wait_until
from support.grpc import RawSession, hello, post

from burstctl.controller.app import Replica
from burstctl.controller.records import JobMeta
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

MiB = 1 << 20
pytestmark = pytest.mark.integration
Make = Callable[..., Awaitable[Replica]]


@pytest.fixture
async def bb(replica_factory: Make) -> Replica:
    return await replica_factory(bb_capacity=8 * MiB, bb_min_grant=MiB, pfs_bandwidth=4 * MiB)


@pytest.fixture
async def channel(bb: Replica) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(bb.grpc_address) as ch:
        yield ch


def usage(buffer: pb.Buffer, waiting: bool = False) -> pb.ClientMessage:
    return pb.ClientMessage(
        usage=pb.Usage(interval_seconds=0.1, waiting=waiting, totals=pb.Counters(), buffer=buffer)
    )


BAD = [
    ([hello(purpose=7)], "hello.purpose"),
    ([hello(purpose=pb.PURPOSE_DRAIN, buffer=pb.Buffer())], "hello.buffer"),
    ([hello(buffer=pb.Buffer(resident=1, pending=2))], "hello.buffer.pending"),
    ([hello(buffer=pb.Buffer(resident=-1))], "hello.buffer.resident"),
    ([hello(buffer=pb.Buffer(drain_error="x" * 1025))], "hello.buffer.drain_error"),
    ([hello(buffer=pb.Buffer(added=5)), usage(pb.Buffer(added=4))], "usage.buffer.added"),
    ([hello(purpose=pb.PURPOSE_DRAIN), usage(pb.Buffer())], "usage.buffer"),
    ([hello(), usage(pb.Buffer(pending=-3))], "usage.buffer.pending"),
]


@pytest.mark.parametrize(("messages", "field"), BAD, ids=[f for _, f in BAD])
async def test_bad_buffer_reports_are_invalid_argument(
    channel: grpc.aio.Channel, messages: list[pb.ClientMessage], field: str
) -> None:
    bad = RawSession(channel)
    for msg in messages:
        await bad.send(msg)
    err = await bad.status()
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.details(), err.details()


async def test_space_comes_in_allocations_and_a_rise_is_sent_at_once(
    channel: grpc.aio.Channel, bb: Replica
) -> None:
    s = RawSession(channel)
    await s.send(hello(buffer=pb.Buffer(added=0)))
    first = await s.allocation()
    # Opened with nothing unused, and a session that does not write gets no space: a reader
    # holds none of S.
    assert first.HasField("space") and first.space.limit == 0
    assert bb.books.used == 0
    # Its first write waits and says so: the grant follows at once, a copy with the same epoch.
    await s.send(usage(pb.Buffer(), waiting=True))
    alloc = await s.allocation()
    assert alloc.space.limit == MiB and alloc.epoch == first.epoch
    # It writes its MiB and says it waits: topped up again, without any rate change.
    await s.send(usage(pb.Buffer(resident=MiB, pending=MiB, added=MiB), waiting=True))
    again = await s.allocation()
    assert again.space.limit == 2 * MiB and again.epoch == first.epoch
    assert bb.books.used == 2 * MiB


async def test_without_capacity_allocations_carry_no_space(replica: Replica) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        s = RawSession(channel)
        await s.send(hello(buffer=pb.Buffer(resident=3, pending=1, added=3)))
        assert not (await s.allocation()).HasField("space")
        await async_wait_until(lambda: replica.books.jobs().get("j1") is not None)
        assert replica.books.jobs()["j1"].resident == 3


async def test_a_drain_stream_is_no_row_and_gets_the_pfs_bandwidth(
    channel: grpc.aio.Channel, bb: Replica
) -> None:
    drain = RawSession(channel)
    await drain.send(hello(job="d", purpose=pb.PURPOSE_DRAIN))
    await drain.send(post(1))
    alloc = await drain.rate_becomes(lambda r: r > 0)
    assert alloc.rate == pytest.approx(4 * MiB)
    assert not alloc.HasField("space")
    view = bb.table.view(bb.config.capacity, bb.config.node_bandwidth)
    assert "d" not in view.jobs  # not in S(t): the policy never sees it
    assert bb.table.jobs["d"].drains and not bb.table.jobs["d"].sessions


async def test_the_scheduler_gives_policies_the_buffer_view(
    channel: grpc.aio.Channel, bb: Replica, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []
    real_view = bb.table.view

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(kwargs.get("buffer"))
        return real_view(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bb.table, "view", spy)
    s = RawSession(channel)
    await s.send(hello(job="ckpt", buffer=pb.Buffer(resident=2 * MiB, pending=MiB, added=0)))
    await s.send(post(1))
    await s.rate_becomes(lambda r: r > 0)
    await async_wait_until(lambda: any(v is not None for v in seen))
    view = next(v for v in reversed(seen) if v is not None)
    assert view.size == 8 * MiB and view.drain_bandwidth == 4 * MiB  # type: ignore[attr-defined]
    assert view.resident == {"ckpt": 2 * MiB}  # type: ignore[attr-defined]
    assert view.pending == {"ckpt": MiB}  # type: ignore[attr-defined]


async def test_a_drain_stream_passes_the_same_trust_checks(
    channel: grpc.aio.Channel, bb: Replica
) -> None:
    bb.registrations.register(JobMeta("owned", "bob", "g", 1, 1.0))
    drain = RawSession(channel)
    await drain.send(hello(job="owned", purpose=pb.PURPOSE_DRAIN))  # user alice
    err = await drain.status()
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
