"""How a session ends when a real replica refuses it, as its client sees it.

On a Node stream a refusal is a ``SessionEnd`` in the stream, which goes on. On a ``Session``
stream (a client or controller before Node streams) a client writes nothing after its Hello
until the replica admitted the stream (its initial metadata, docs/protocol.md "Errors"): so no
write of the client is in flight when a refusal arrives, and gRPC Python cannot turn the
refusal into ``INTERNAL`` ("Internal error from Core"), which loses its code and its
``retry-after-ms``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable

import grpc
import pytest
from support import ControllerProcess, async_wait_until
from support.grpc import RawSession, hello, post

from burstctl.client.channel import open_channel
from burstctl.client.core import SessionCore
from burstctl.client.job import JobInfo
from burstctl.client.link import NodeLink
from burstctl.client.options import SessionOptions
from burstctl.controller.app import Replica
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("node_streams", [True, False], ids=["node-stream", "session-streams"])
async def test_hundreds_of_sessions_refused_at_once_each_learn_the_refusal_and_its_hint(
    controller_factory: Callable[..., ControllerProcess], node_streams: bool
) -> None:
    admitted, n = 20, 200
    # A process of its own (the race is between two processes' threads), and a hint longer than
    # the test: a session that obeyed it says Hello once, and only once.
    limits = {"MAX_SESSIONS": admitted, "MAX_SESSIONS_PER_CLIENT": n, "RETRY_AFTER": 120}
    controller = controller_factory(env={f"BURSTCTL_{k}": str(v) for k, v in limits.items()})
    assert controller.address is not None
    link = NodeLink(open_channel(controller.address), node_streams=node_streams)
    cores = [
        SessionCore(
            SessionOptions.build(
                controller.address,
                JobInfo(f"job-{i}", "alice", "g"),
                "keep-last:1MiB/s",
                report_interval=0.25,
                quiet_gap=60.0,
                attach_timeout=60.0,
                client_id=f"node-{i}",
            )
        )
        for i in range(n)
    ]
    try:
        for core in cores:
            await core.start(link)
            # An open operation: its OpPosted is queued right behind the Hello.
            core.open_operation(pb.OP_KIND_WRITE, 0)
        await async_wait_until(
            lambda: all(core.attached or core.stream_ends for core in cores),
            60,
            message="every session attached or refused",
        )
        refused = [core for core in cores if not core.attached]
        assert len(refused) == n - admitted
        ends = [dict(core.stream_ends) for core in refused]
        assert all(e == {"RESOURCE_EXHAUSTED": 1} for e in ends), [
            e for e in ends if e != {"RESOURCE_EXHAUSTED": 1}
        ]
        # Each obeyed the hint, and so waits at 0 under keep-last.
        assert all(core.rate == 0 for core in refused)
    finally:
        await asyncio.gather(*(core.close() for core in cores))
        await link.close()
        await link.channel.close()
    controller.stop()
    stats = json.loads(re.findall(r"stopped; stats: (\{.*\})", "".join(controller.log))[-1])
    assert stats["refused_sessions"] == n - admitted  # no second Hello


async def test_an_admitted_stream_gets_its_initial_metadata_before_any_allocation(
    replica_factory: Callable[..., Awaitable[Replica]], monkeypatch: pytest.MonkeyPatch
) -> None:
    replica = await replica_factory()
    # A scheduler that decides nothing: the initial metadata can only come from admission.
    monkeypatch.setattr(replica.scheduler, "rebalance", lambda: None)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        session = RawSession(channel)
        await session.send(hello("j1"))
        await asyncio.wait_for(session.call.initial_metadata(), 10)
        assert not session.call.done()
        await session.send(post(1))  # the client may write now
        await async_wait_until(
            lambda: any(s.ops for s in replica.table.sessions.values()), message="op posted"
        )
        assert session.inbox.empty()
        await session.close()
