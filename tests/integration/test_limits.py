"""The controller's limits against a real replica on a loopback port, with raw gRPC streams.

Each limit of docs/configuration.md ("Limits") is exceeded once here: the stream at
fault gets ``RESOURCE_EXHAUSTED`` with a message naming the limit (and, for a limit
of load, the trailing metadata ``retry-after-ms``), and the sessions already open keep
their allocations. The first test is finding 1 of issue 15: a flood of completions of
unknown operations, whose error notices used to queue without bound.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable

import grpc
import psutil
import pytest
from digests import digest, job
from support import async_wait_until
from support.grpc import RawSession, hello, post

from burstctl.client import AsyncSession, JobInfo
from burstctl.controller.app import Replica
from burstctl.controller.digest_wire import to_proto
from burstctl.proto.burstctl.v1 import controller_pb2 as pb
from burstctl.proto.burstctl.v1 import peer_pb2_grpc

pytestmark = pytest.mark.integration

MiB = 1 << 20
ReplicaFactory = Callable[..., Awaitable[Replica]]


def heartbeat() -> pb.ClientMessage:
    return pb.ClientMessage(usage=pb.Usage(interval_seconds=0.1, waiting=True))


def metadata(err: grpc.aio.AioRpcError) -> dict[str, str]:
    return {str(k): str(v) for k, v in err.trailing_metadata() or ()}


def rss() -> int:
    return int(psutil.Process(os.getpid()).memory_info().rss)


class Honest:
    """A session with an open operation that heartbeats every 0.1 s and records each
    allocation it gets (the time it arrived and its rate)."""

    def __init__(self, channel: grpc.aio.Channel, job_id: str = "honest") -> None:
        self.session = RawSession(channel)
        self.job_id = job_id
        self.allocations: list[tuple[float, float]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> Honest:
        await self.session.send(hello(self.job_id))
        await self.session.send(post(1))
        await self.session.rate_becomes(lambda r: r > 0)
        self._tasks = [asyncio.create_task(self._beat()), asyncio.create_task(self._record())]
        return self

    async def _beat(self) -> None:
        while True:
            await self.session.send(heartbeat())
            await asyncio.sleep(0.1)  # the client's report interval, not synchronisation

    async def _record(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            alloc = await self.session.inbox.get()
            assert alloc.WhichOneof("body") == "allocation", alloc
            self.allocations.append((loop.time(), alloc.allocation.rate))

    async def check(self, replica: Replica, since: float) -> None:
        """Still attached: a positive rate, renewed within every lease since ``since``."""
        loop = asyncio.get_running_loop()
        await async_wait_until(
            lambda: any(t > loop.time() - replica.config.lease for t, _ in self.allocations),
            3,
            message="a renewal of the honest session",
        )
        times = [since] + [t for t, _ in self.allocations if t >= since] + [loop.time()]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) < replica.config.lease, f"a lease went unrenewed: gaps {gaps}"
        assert all(rate > 0 for t, rate in self.allocations if t >= since)
        assert self.session.call.done() is False

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.session.call.cancel()


@pytest.fixture
async def channel(replica: Replica) -> grpc.aio.Channel:
    async with grpc.aio.insecure_channel(replica.grpc_address) as ch:
        yield ch


# -- finding 1: error notices are bounded -------------------------------------------------


async def test_unknown_completions_flood_keeps_notices_and_memory_bounded(
    replica: Replica, channel: grpc.aio.Channel
) -> None:
    flood, batch_size = 200_000, 1024
    honest = await Honest(channel).start()
    hostile = RawSession(channel, read=False)  # reads nothing while it floods
    await hostile.send(hello("hostile"))
    await async_wait_until(lambda: len(replica.servicer.streams) == 2, message="two sessions")
    (sid,) = [s.sid for s in replica.table.sessions.values() if s.job.job_id == "hostile"]
    queue = replica.servicer.streams[sid]
    loop = asyncio.get_running_loop()
    start, rss_before = loop.time(), rss()

    longest = 0
    sent = 0
    marker = flood + 1  # posted last: once it is open, every completion before it was handled
    while sent < flood:
        n = min(batch_size, flood - sent)
        messages = [
            pb.ClientMessage(op_completed=pb.OpCompleted(op_id=sent + i + 1)) for i in range(n)
        ]
        if sent + n == flood:
            messages[-1] = post(marker)  # the last one: the marker instead of a completion
        await hostile.send(pb.ClientMessage(batch=pb.Batch(messages=messages)))
        sent += n
        longest = max(longest, len(queue._errors))
    await async_wait_until(
        lambda: any(marker in s.ops for s in replica.table.sessions.values()),
        30,
        message="the whole flood handled",
    )
    longest = max(longest, len(queue._errors))
    grown = rss() - rss_before

    assert longest <= 64, f"{longest} notices queued"  # the default max_notices
    assert grown < 40 * MiB, f"RSS grew by {grown / MiB:.0f} MiB"
    assert replica.config.max_notices == 64
    await honest.check(replica, start)

    # What the hostile client reads once it starts reading: max_notices notices one by one,
    # the rest counted in summaries; together, one per unknown completion.
    hostile.start_reading()
    told = 0
    while told < flood - 1:
        msg = await asyncio.wait_for(hostile.inbox.get(), 10)
        if msg.WhichOneof("body") != "error":
            continue
        if msg.error.code == "NOT_FOUND":
            told += 1
        else:
            assert msg.error.code == "RESOURCE_EXHAUSTED", msg
            assert "max_notices = 64" in msg.error.message
            told += int(msg.error.message.split()[0])  # "N more error notices dropped"
    assert told == flood - 1

    hostile.call.cancel()
    await async_wait_until(lambda: sid not in replica.servicer.streams, message="hostile gone")
    assert rss() - rss_before < 40 * MiB
    await honest.check(replica, start)
    await honest.stop()


# -- session limits: load shedding with a retry hint ----------------------------------------


async def test_hello_beyond_max_sessions_is_refused_with_a_retry_hint(
    replica_factory: ReplicaFactory,
) -> None:
    replica = await replica_factory(max_sessions=2, retry_after=1.5)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        first = await Honest(channel, "a").start()
        second = RawSession(channel)
        await second.send(hello("b"))
        await second.allocation()
        loop = asyncio.get_running_loop()
        since = loop.time()

        third = RawSession(channel)
        await third.send(hello("c"))
        err = await third.status()
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_sessions = 2" in (err.details() or "")
        assert "retry in 1.5 s" in (err.details() or "")
        assert metadata(err)["retry-after-ms"] == "1500"
        assert "c" not in replica.table.jobs  # refused before it touched the table
        await first.check(replica, since)

        await second.close()
        await async_wait_until(lambda: len(replica.servicer.streams) == 1, message="b closed")
        fourth = RawSession(channel)
        await fourth.send(hello("c"))
        await fourth.allocation()  # a place came free: admitted
        assert replica.servicer.refused == 1
        await first.stop()


async def test_hello_beyond_max_sessions_per_client_is_refused(
    replica_factory: ReplicaFactory,
) -> None:
    replica = await replica_factory(max_sessions_per_client=1)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        first = await Honest(channel, "a").start()
        since = asyncio.get_running_loop().time()
        second = RawSession(channel)
        await second.send(hello("b"))
        err = await second.status()
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "127.0.0.1 is at its session limit: max_sessions_per_client = 1" in (
            err.details() or ""
        )
        assert metadata(err)["retry-after-ms"] == str(round(replica.config.retry_after * 1000))
        await first.check(replica, since)
        await first.stop()


async def test_new_job_beyond_max_jobs_takes_an_inactive_place_or_is_refused(
    replica_factory: ReplicaFactory,
) -> None:
    replica = await replica_factory(max_jobs=2)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        a = await Honest(channel, "a").start()
        b = RawSession(channel)
        await b.send(hello("b"))
        await b.allocation()
        since = asyncio.get_running_loop().time()

        c = RawSession(channel)
        await c.send(hello("c"))
        err = await c.status()
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_jobs = 2 jobs, all active" in (err.details() or "")
        assert "retry-after-ms" in metadata(err)

        a2 = RawSession(channel)  # a job already in the table is no new job
        await a2.send(hello("a"))
        await a2.allocation()

        await b.close()  # b turns inactive: its place is taken by c
        await async_wait_until(lambda: not replica.table.jobs["b"].sessions, message="b idle")
        c2 = RawSession(channel)
        await c2.send(hello("c"))
        await c2.allocation()
        assert set(replica.table.jobs) == {"a", "c"}
        await a.check(replica, since)
        await a.stop()


async def test_post_beyond_max_open_ops_ends_that_stream(
    replica_factory: ReplicaFactory,
) -> None:
    replica = await replica_factory(max_open_ops=3)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        honest = await Honest(channel).start()
        since = asyncio.get_running_loop().time()
        greedy = RawSession(channel)
        await greedy.send(hello("greedy"))
        for op_id in (1, 2, 3):
            await greedy.send(post(op_id))
        await greedy.send(
            pb.ClientMessage(batch=pb.Batch(messages=[heartbeat(), post(4), heartbeat()]))
        )
        err = await greedy.status()
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (err.details() or "").startswith(
            "batch.messages[1].op_posted.op_id: more than max_open_ops = 3"
        )
        await honest.check(replica, since)
        await honest.stop()


async def test_message_beyond_max_message_bytes_is_refused(
    replica_factory: ReplicaFactory,
) -> None:
    replica = await replica_factory(max_message_bytes=64 * 1024)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        honest = await Honest(channel).start()
        since = asyncio.get_running_loop().time()
        big = RawSession(channel)
        await big.send(hello("big"))
        usage = [heartbeat()] * 8000  # ~ 100 KB in one message
        await big.send(pb.ClientMessage(batch=pb.Batch(messages=usage)))
        err = await big.status()
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "65536" in (err.details() or "")  # gRPC's "larger than max (N vs. 65536)"
        await honest.check(replica, since)
        await honest.stop()


async def test_digest_beyond_max_digest_jobs_is_refused(
    replica_factory: ReplicaFactory,
) -> None:
    # A replica with a peer (nobody listens on the discard port) serves the Peer service.
    replica = await replica_factory(max_digest_jobs=2, peers=["127.0.0.1:9"])
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Exchange(to_proto(digest("other", [job("x"), job("y"), job("z")])))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details() == "jobs: 3 jobs, more than max_digest_jobs = 2"
        reply = await stub.Exchange(to_proto(digest("other", [job("x"), job("y")])))
        assert reply.field != "jobs"  # refused for not being a peer, not for its size


# -- the client honours the hint -------------------------------------------------------


async def test_client_refused_for_load_waits_the_hint_then_attaches(
    replica_factory: ReplicaFactory,
) -> None:
    replica = await replica_factory(max_sessions=1, retry_after=1.0)
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        holder = await Honest(channel, "holder").start()
        waiting = AsyncSession(replica.grpc_address, JobInfo("late", "bob", "g"), "fixed:1MiB/s")
        async with waiting:
            await async_wait_until(lambda: replica.servicer.refused >= 1, message="refused")
            first = loop.time()
            await async_wait_until(
                lambda: replica.servicer.refused >= 2, 5, message="a second attempt"
            )
            gap = loop.time() - first
            assert gap >= 0.9, f"retried after {gap:.2f} s, before the 1 s hint"
            assert not waiting.attached
            await holder.stop()
            assert await waiting.wait_attached(5), "not attached once a place came free"


async def test_a_shed_keep_last_session_waits_at_zero_until_admitted(
    replica_factory: ReplicaFactory,
) -> None:
    # A controller at its session limit said "not now": a keep-last session that never had an
    # allocation waits at 0 (never at a rate a full controller does not count) until a place
    # comes free.
    replica = await replica_factory(max_sessions=1, retry_after=0.5)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        holder = await Honest(channel, "holder").start()
        waiting = AsyncSession(
            replica.grpc_address,
            JobInfo("late", "bob", "g"),
            "keep-last:4MiB/s",
            attach_timeout=0.2,
            fallback_grace=30,
        )
        async with waiting:
            await async_wait_until(lambda: replica.servicer.refused >= 2, 5, message="shed twice")
            assert not waiting.attached
            assert waiting.rate == 0, f"a shed session paced at {waiting.rate} B/s"
            await holder.stop()
            assert await waiting.wait_attached(5), "not attached once a place came free"
            await asyncio.wait_for(waiting.acquire(64 * 1024), 10)  # served once admitted


# -- overload: the controller's event loop lags ---------------------------------------------


async def test_a_stalled_controller_sheds_new_sessions_and_keeps_the_open_ones(
    replica_factory: ReplicaFactory,
) -> None:
    # heartbeat_timeout and lease are 1 s (conftest): the stall outlasts both.
    replica = await replica_factory(shed_loop_lag=0.5, retry_after=0.5)
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        honest = await Honest(channel).start()
        (sid,) = replica.servicer.streams
        time.sleep(1.5)  # the overload under test: the replica's loop (this one) stalls 1.5 s
        late = RawSession(channel)
        await late.send(hello("late"))
        err = await late.status()
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "event-loop lag" in (err.details() or "")
        assert metadata(err)["retry-after-ms"] == "500"
        # Its silence was the controller's doing: the open session is not closed for it.
        since = asyncio.get_running_loop().time()
        await async_wait_until(lambda: replica.servicer.lag.value < 0.5, 5, message="recovered")
        assert sid in replica.servicer.streams
        await honest.check(replica, since)
        again = RawSession(channel)
        await again.send(hello("late"))
        await again.allocation()
        await honest.stop()
