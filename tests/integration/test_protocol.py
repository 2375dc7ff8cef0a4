"""The Session protocol against a real controller on a loopback port, with raw gRPC streams.

These tests speak the wire protocol directly (no client runtime) so that they
can send what a well-behaved client never would.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import async_wait_until
from support.grpc import RawSession, hello, post

from burstctl.controller.app import Replica
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

MiB = 1 << 20
pytestmark = pytest.mark.integration


@pytest.fixture
async def channel(replica: Replica):
    async with grpc.aio.insecure_channel(replica.grpc_address) as ch:
        yield ch


async def test_health_serving(channel: grpc.aio.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("", "burstctl.v1.Controller"):
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=name))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_allocation_after_hello_and_post(channel: grpc.aio.Channel, replica: Replica) -> None:
    s = RawSession(channel)
    await s.send(hello(nodes=4))
    first = await s.allocation()
    assert first.rate == 0.0 and first.epoch == 1  # no operation yet: nothing to give
    assert first.policy == "fair-share" and first.lease_seconds == pytest.approx(1.0)
    await s.send(post(1, volume=10 * MiB))
    alloc = await s.allocation()
    assert alloc.rate == pytest.approx(32 * MiB)  # alone: b_i = min(4 · 8, 40) MiB/s
    assert alloc.epoch == 2 and alloc.burst > 0
    await s.send(pb.ClientMessage(op_completed=pb.OpCompleted(op_id=1)))
    assert (await s.allocation()).rate == 0.0
    await s.send(pb.ClientMessage(goodbye=pb.Goodbye()))
    await s.call.done_writing()
    assert await s.call.code() == grpc.StatusCode.OK
    await async_wait_until(lambda: not replica.table.sessions, 5, message="session closed")


async def test_lease_renewed_before_expiry(channel: grpc.aio.Channel) -> None:
    s = RawSession(channel)
    await s.send(hello())
    await s.send(post(1))
    await s.rate_becomes(lambda r: r > 0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while True:  # keep the session alive with heartbeats while we wait for a renewal
        await s.send(pb.ClientMessage(usage=pb.Usage(interval_seconds=0.1, waiting=True)))
        try:
            renewal = await s.allocation(timeout=0.1)
            break
        except TimeoutError:
            assert loop.time() - t0 < 2.0, "no renewal within the lease"
    assert renewal.rate > 0
    assert loop.time() - t0 < 1.0  # renewed before the 1 s lease ran out


BAD_INPUTS = [
    ([hello(nodes=0)], "hello.nodes"),
    ([hello(job="")], "hello.job_id"),
    ([hello(job="j\x001")], "hello.job_id"),  # a peer would refuse it in a digest
    ([hello(nodes=(1 << 20) + 1)], "hello.nodes"),
    ([hello(priority=-1.0)], "hello.priority"),
    ([post(1)], "hello"),  # a message before Hello
    ([hello(), post(1, volume=-5)], "op_posted.volume"),
    ([hello(), post(1, volume=1 << 62)], "op_posted.volume"),
    ([hello(), post(1, kind=pb.OP_KIND_UNSPECIFIED)], "op_posted.kind"),
    ([hello(), post(1, kind=42)], "op_posted.kind"),
    ([hello(), post(0)], "op_posted.op_id"),
    ([hello(), pb.ClientMessage(usage=pb.Usage(bytes=-1))], "usage.bytes"),
    ([hello(), pb.ClientMessage(usage=pb.Usage(wait_seconds=float("nan")))], "usage.wait_seconds"),
    ([hello(), hello()], "hello"),
    ([hello(), pb.ClientMessage()], "body"),
    ([hello(), post(1), post(1)], "op_posted.op_id"),  # already open
    (
        [hello(), pb.ClientMessage(batch=pb.Batch(messages=[post(1), post(2, volume=-1)]))],
        "batch.messages[1].op_posted.volume",
    ),
    ([hello(), pb.ClientMessage(batch=pb.Batch(messages=[hello()]))], "batch.messages[0].hello"),
    (
        [hello(), pb.ClientMessage(batch=pb.Batch(messages=[pb.ClientMessage(batch=pb.Batch())]))],
        "batch.messages[0].batch",
    ),
    (
        [hello(), pb.ClientMessage(batch=pb.Batch(messages=[post(i + 1) for i in range(1025)]))],
        "batch.messages",
    ),
]


@pytest.mark.parametrize(("messages", "field"), BAD_INPUTS, ids=[f for _, f in BAD_INPUTS])
async def test_bad_input_is_invalid_argument_and_harms_no_one(
    channel: grpc.aio.Channel, replica: Replica, messages: list[pb.ClientMessage], field: str
) -> None:
    good = RawSession(channel)
    await good.send(hello(job="good"))
    await good.send(post(1))
    await good.rate_becomes(lambda r: r > 0)

    bad = RawSession(channel)
    for msg in messages:
        await bad.send(msg)
    err = await bad.status()
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.details()

    # The well-behaved session is still served: it gets a new allocation on demand.
    await good.send(post(2, volume=MiB))
    await good.send(pb.ClientMessage(op_completed=pb.OpCompleted(op_id=1)))
    await good.send(pb.ClientMessage(op_completed=pb.OpCompleted(op_id=2)))
    assert (await good.rate_becomes(lambda r: r == 0)).rate == 0
    assert "good" in replica.table.jobs


async def test_batch_is_handled_in_order(channel: grpc.aio.Channel, replica: Replica) -> None:
    s = RawSession(channel)
    await s.send(hello(nodes=4))
    await s.allocation()
    batch = [post(1, volume=MiB), post(2), pb.ClientMessage(op_completed=pb.OpCompleted(op_id=1))]
    await s.send(pb.ClientMessage(batch=pb.Batch(messages=batch)))
    assert (await s.rate_becomes(lambda r: r > 0)).rate == pytest.approx(32 * MiB)
    session = next(iter(replica.table.sessions.values()))
    assert set(session.ops) == {2}  # 1 posted then completed, 2 still open
    await s.send(
        pb.ClientMessage(
            batch=pb.Batch(
                messages=[
                    pb.ClientMessage(op_completed=pb.OpCompleted(op_id=2)),
                    pb.ClientMessage(goodbye=pb.Goodbye()),
                    post(3),  # after goodbye: ignored
                ]
            )
        )
    )
    await s.call.done_writing()
    assert await s.call.code() == grpc.StatusCode.OK
    await async_wait_until(lambda: not replica.table.sessions, 5, message="session closed")
    assert replica.table.jobs["j1"].completed_ops == 2


async def test_completing_an_unknown_operation_is_a_notice(channel: grpc.aio.Channel) -> None:
    s = RawSession(channel)
    await s.send(hello())
    await s.allocation()
    await s.send(pb.ClientMessage(op_completed=pb.OpCompleted(op_id=9)))
    msg = await asyncio.wait_for(s.inbox.get(), 5)
    assert msg.WhichOneof("body") == "error"
    assert (msg.error.code, msg.error.field) == ("NOT_FOUND", "op_completed.op_id")
    await s.send(post(1))  # the session goes on
    assert (await s.rate_becomes(lambda r: r > 0)).rate > 0


async def test_undecodable_message_is_invalid_argument(
    channel: grpc.aio.Channel, replica: Replica
) -> None:
    raw = channel.stream_stream(
        "/burstctl.v1.Controller/Session",
        request_serializer=lambda b: b,
        response_deserializer=pb.ServerMessage.FromString,
    )
    call = raw()
    await call.write(b"\xff\xff\xff\xff")  # not a protobuf message
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(asyncio.shield(call.read()), 5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message" in info.value.details()
    # The daemon still serves a new session.
    s = RawSession(channel)
    await s.send(hello())
    assert (await s.allocation()).epoch == 1


async def test_silent_session_times_out(channel: grpc.aio.Channel, replica: Replica) -> None:
    """No heartbeat for the timeout (1 s here): the session is closed and its job inactive."""
    quiet = RawSession(channel)
    await quiet.send(hello(job="quiet"))
    await quiet.send(post(1))
    await quiet.rate_becomes(lambda r: r > 0)
    err = await quiet.status(timeout=5)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert replica.table.jobs["quiet"].status.value == "inactive"


async def test_job_rate_is_split_over_its_sessions_by_demand(
    channel: grpc.aio.Channel, replica: Replica
) -> None:
    """One 4-node job (b_i = 32 MiB/s) with two sessions: one satisfied at 2 MiB/s, one waiting."""
    calm, eager = RawSession(channel), RawSession(channel)
    for s in (calm, eager):
        await s.send(hello(job="shared", nodes=4))
        await s.allocation()
        await s.send(post(1))
    await calm.send(pb.ClientMessage(usage=pb.Usage(bytes=MiB, ops=16, interval_seconds=0.5)))
    await eager.send(
        pb.ClientMessage(
            usage=pb.Usage(
                bytes=8 * MiB, ops=128, wait_seconds=0.4, interval_seconds=0.5, waiting=True
            )
        )
    )
    calm_alloc = await calm.rate_becomes(lambda r: r == pytest.approx(2.2 * MiB))
    # calm applies its decrease (as the client runtime does): eager's increase fits then
    await calm.send(pb.ClientMessage(usage=pb.Usage(applied_epoch=calm_alloc.epoch)))
    eager_alloc = await eager.rate_becomes(lambda r: r == pytest.approx(29.8 * MiB))
    assert calm_alloc.rate + eager_alloc.rate == pytest.approx(32 * MiB)
