"""The Node stream on a real replica: many sessions on one stream, each admitted, served, refused,
rejected and ended on its own; only what names no session ends the stream (docs/protocol.md,
"Node streams"). And the client runtime: all its sessions to a replica on one Node stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import pytest
from support import async_wait_until
from support.grpc import RawNode, RawSession, hello, post, tagged

from burstctl.client.job import JobInfo
from burstctl.client.runtime import ClientRuntime
from burstctl.client.session import Session
from burstctl.controller.app import Replica
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

Make = Callable[..., Awaitable[Replica]]
MiB = 1024 * 1024


async def test_many_sessions_on_one_stream_are_each_served_and_pushed_in_batches(
    replica: Replica,
) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        node = RawNode(channel)
        n = 60
        await node.send(*(tagged(t, hello(f"job-{t}", client_id="n1")) for t in range(1, n + 1)))
        await node.send(*(tagged(t, post(1)) for t in range(1, n + 1)))
        capacity = replica.config.capacity
        # Every session gets its share of B, on the one stream.
        await async_wait_until(
            lambda: all(
                (rate := node.rate(t)) is not None and rate > 0.9 * capacity / n
                for t in range(1, n + 1)
            ),
            message="every session allotted its share",
        )
        assert replica.servicer.node_streams == 1
        assert len(replica.table.sessions) == n
        assert sum(node.rate(t) or 0.0 for t in range(1, n + 1)) <= capacity * (1 + 0.02)
        # A decision that moves every session goes out as batches, not a message each.
        assert node.batches >= 1
        await node.send(
            *(tagged(t, pb.ClientMessage(goodbye=pb.Goodbye())) for t in range(1, n + 1))
        )
        await async_wait_until(lambda: len(node.ended) == n, message="every session ended")
        assert {end.code for end in node.ended.values()} == {"OK"}
        await async_wait_until(lambda: not replica.table.sessions, message="sessions closed")
        await node.call.done_writing()
        assert await node.call.code() == grpc.StatusCode.OK


async def test_a_refused_session_ends_alone_with_its_hint_and_the_stream_goes_on(
    replica_factory: Make,
) -> None:
    replica = await replica_factory(max_sessions=5, retry_after=7.5)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        node = RawNode(channel)
        await node.send(*(tagged(t, hello(f"job-{t}", client_id="n1")) for t in range(1, 9)))
        await async_wait_until(lambda: len(node.ended) == 3, message="three refused")
        assert sorted(node.ended) == [6, 7, 8]
        for end in node.ended.values():
            assert end.code == "RESOURCE_EXHAUSTED"
            assert "max_sessions = 5" in end.message
            assert end.retry_after_ms == 7500
        # The five admitted ones are served on the same stream.
        await node.send(*(tagged(t, post(1)) for t in range(1, 6)))
        await async_wait_until(
            lambda: all((node.rate(t) or 0) > 0 for t in range(1, 6)), message="served"
        )
        assert not node.call.done()
        node.call.cancel()


async def test_a_bad_message_ends_its_session_only_naming_the_field(replica: Replica) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        node = RawNode(channel)
        await node.send(
            tagged(1, hello("a", client_id="n1")), tagged(2, hello("b", client_id="n1"))
        )
        await node.send(tagged(1, post(1)), tagged(2, post(0)))
        await async_wait_until(lambda: 2 in node.ended, message="session 2 rejected")
        end = node.ended[2]
        assert end.code == "INVALID_ARGUMENT"
        assert "batch.messages[1].op_posted.op_id" in end.message
        # A Leave that makes no sense ends its session the same way.
        await node.send(tagged(3, hello("c", client_id="n1")))
        await node.send(tagged(3, pb.ClientMessage(leave=pb.Leave(pacing_rate=-1.0))))
        await async_wait_until(lambda: 3 in node.ended, message="session 3 rejected")
        assert "leave.pacing_rate" in node.ended[3].message
        # Session 1 goes on: B is all its own now.
        await async_wait_until(
            lambda: (node.rate(1) or 0) >= 0.99 * replica.config.node_bandwidth,
            message="session 1 served",
        )
        assert 1 not in node.ended
        assert not node.call.done()
        node.call.cancel()


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([hello("a")], "session: must be > 0"),
        ([tagged(2, hello("a")), tagged(1, hello("b"))], "session: 1 is not greater"),
        ([tagged(4, post(1))], "no Hello opened session 4"),
    ],
    ids=["untagged", "tag-reused", "no-hello"],
)
async def test_what_names_no_session_ends_the_stream_and_the_replica_serves_others(
    replica: Replica, messages: list[pb.ClientMessage], field: str
) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        bad = RawNode(channel)
        for msg in messages:
            await bad.send(msg)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(bad.reader, 10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (info.value.details() or "")
        await async_wait_until(lambda: not replica.table.sessions, message="its sessions closed")
        good = RawNode(channel)
        await good.send(tagged(1, hello("ok")), tagged(1, post(1)))
        await async_wait_until(lambda: (good.rate(1) or 0) > 0, message="another stream served")
        good.call.cancel()


async def test_one_renew_renews_every_session_of_the_stream(replica_factory: Make) -> None:
    replica = await replica_factory(lease=0.4)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        node = RawNode(channel)
        await node.send(*(tagged(t, hello(f"job-{t}", client_id="n1")) for t in (1, 2, 3)))
        await node.send(*(tagged(t, post(1)) for t in (1, 2, 3)))
        await async_wait_until(
            lambda: all(node.rate(t) for t in (1, 2, 3)), message="every session allotted"
        )
        first = node.renewals
        # Many leases later: renewed by the stream, not by an allocation per session.
        await async_wait_until(lambda: node.renewals >= first + 8, message="renewed")
        sent = {t: len(node.allocations(t)) for t in (1, 2, 3)}
        assert all(count <= 2 for count in sent.values()), sent
        assert replica.scheduler.stats.renewals == 0
        node.call.cancel()


async def test_a_leave_counts_the_rate_the_client_goes_on_pacing_at(replica: Replica) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        node = RawNode(channel)
        await node.send(tagged(1, hello("a", client_id="n1")), tagged(1, post(1)))
        await async_wait_until(lambda: (node.rate(1) or 0) > 0, message="allotted")
        await node.send(tagged(1, pb.ClientMessage(leave=pb.Leave(pacing_rate=3 * MiB))))
        await async_wait_until(lambda: 1 in node.ended, message="left")
        assert node.ended[1].code == "OK"
        assert replica.ghosts.reserved()[0] == 3 * MiB  # in force until the client is back
        # Back under a new tag: it declares what it paces at, and the ghost ends.
        await node.send(tagged(2, hello("a", client_id="n1", pacing_rate=3 * MiB)))
        await async_wait_until(lambda: replica.ghosts.reserved()[0] == 0, message="claimed")
        node.call.cancel()


async def test_a_leave_on_a_session_stream_is_invalid(replica: Replica) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        raw = RawSession(channel)
        await raw.send(hello("a"))
        await raw.send(pb.ClientMessage(leave=pb.Leave(pacing_rate=0.0)))
        err = await raw.status()
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "leave" in (err.details() or "")


async def test_the_client_runtime_carries_all_its_sessions_on_one_node_stream(
    replica: Replica,
) -> None:
    runtime = ClientRuntime()

    def open_all() -> list[Session]:
        # blocking calls: off the test's loop, which runs the replica
        sessions = [
            Session(
                replica.grpc_address,
                JobInfo(f"job-{i}", "alice", "g"),
                runtime=runtime,
                client_id=f"node-a-{i}",
            )
            for i in range(20)
        ]
        assert all(session.wait_attached(10) for session in sessions)
        return sessions

    try:
        sessions = await asyncio.to_thread(open_all)
        assert replica.servicer.node_streams == 1
        assert len(replica.table.sessions) == 20
        for session in sessions[:10]:
            await asyncio.to_thread(session.close)
        await async_wait_until(lambda: len(replica.table.sessions) == 10, message="closed")
        assert replica.servicer.node_streams == 1  # the others go on on it
    finally:
        await asyncio.to_thread(runtime.close)
    await async_wait_until(lambda: replica.servicer.node_streams == 0, message="stream ended")
    assert not replica.table.sessions
