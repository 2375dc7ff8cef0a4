"""`AsyncSession` on the test's event loop against a scripted controller on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from burstctl.client import AsyncSession, JobInfo
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
JOB = JobInfo("job-async", "carol", "bio", nodes=2)


def session_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("burstctl-")]


async def test_hello_first_and_paced_acquire(
    make_controller: Callable[..., Any], async_wait_until: Callable[..., Any]
) -> None:
    controller = make_controller(initial_rate=4 * MiB, burst=64 * KiB)
    async with AsyncSession(controller.address, JOB, client_id="async-1") as session:
        assert await session.wait_attached(5)
        hello = controller.received()[0]
        assert hello.kind == "hello"
        assert (hello.message.hello.job_id, hello.message.hello.nodes) == ("job-async", 2)
        assert hello.message.hello.client_id == "async-1"
        total, start = 0, time.monotonic()
        while time.monotonic() - start < 1.5:
            await session.acquire(64 * KiB)
            total += 64 * KiB
        elapsed = time.monotonic() - start
    assert total / elapsed == pytest.approx(4 * MiB, rel=0.10)
    await async_wait_until(lambda: controller.received()[-1].kind == "goodbye")
    assert session_tasks() == []


async def test_rate_zero_blocks_and_a_new_allocation_unblocks(
    controller: Any, async_wait_until: Callable[..., Any]
) -> None:
    async with AsyncSession(controller.address, JOB) as session:
        assert await session.wait_attached(5)
        controller.push(0.0, burst=0)
        await async_wait_until(lambda: session.rate == 0)
        waiter = asyncio.create_task(session.acquire(MiB))
        await async_wait_until(lambda: any(u.waiting for u in controller.bodies("usage")))
        assert not waiter.done()
        controller.push(16 * MiB)
        await asyncio.wait_for(waiter, 2)


async def test_implicit_and_explicit_operations(
    controller: Any, async_wait_until: Callable[..., Any]
) -> None:
    async with AsyncSession(controller.address, JOB, quiet_gap=0.1) as session:
        assert await session.wait_attached(5)
        await session.acquire(KiB, "read")
        await async_wait_until(lambda: controller.bodies("op_completed"))
        async with session.operation("write", volume=5 * KiB) as op:
            await session.acquire(5 * KiB, "write")
        await async_wait_until(lambda: len(controller.bodies("op_completed")) == 2)
    posted = [(p.op_id, p.kind, p.volume) for p in controller.bodies("op_posted")]
    assert posted == [(1, pb.OP_KIND_READ, 0), (op.op_id, pb.OP_KIND_WRITE, 5 * KiB)]
    assert op.op_id == 2
    assert [c.op_id for c in controller.bodies("op_completed")] == [1, 2]


async def test_many_coroutines_share_the_rate(make_controller: Callable[..., Any]) -> None:
    controller = make_controller(initial_rate=4 * MiB, burst=64 * KiB)
    async with AsyncSession(controller.address, JOB) as session:
        assert await session.wait_attached(5)
        start = time.monotonic()

        async def work() -> int:
            moved = 0
            while time.monotonic() - start < 1.0:
                await session.acquire(16 * KiB)
                moved += 16 * KiB
            return moved

        totals = await asyncio.gather(*(work() for _ in range(8)))
        elapsed = time.monotonic() - start
    assert sum(totals) / elapsed == pytest.approx(4 * MiB, rel=0.15)
    assert min(totals) > 0


async def test_fallback_and_reattach(make_controller: Callable[..., Any]) -> None:
    first = make_controller(initial_rate=4 * MiB, lease_seconds=0.3, renew_interval=0.1)
    async with AsyncSession(first.address, JOB, "fixed:2MiB/s") as session:
        assert await session.wait_attached(5)
        async with session.operation("read", volume=7) as op:
            await asyncio.to_thread(first.stop)
            deadline = time.monotonic() + 2
            while session.rate != 2 * MiB:
                await session.acquire(16 * KiB)
                assert time.monotonic() < deadline, "the fallback was not applied"
            second = await asyncio.to_thread(make_controller, first.port, initial_rate=MiB)
            assert await session.wait_attached(5)
            assert session.rate == MiB
            await asyncio.to_thread(second.wait_for, lambda: second.bodies("op_posted"))
            reposted = second.bodies("op_posted")[0]
            assert (reposted.op_id, reposted.volume) == (op.op_id, 7)


async def test_close_is_idempotent_and_refuses_acquire(controller: Any) -> None:
    session = AsyncSession(controller.address, JOB)
    await session.start()
    assert await session.wait_attached(5)
    await session.close()
    await session.close()
    assert session_tasks() == []
    with pytest.raises(RuntimeError, match="session is closed"):
        await session.acquire(1)
    with pytest.raises(ValueError, match="kind"):
        await session.acquire(1, "delete")


async def test_queued_messages_go_as_one_batch(
    make_controller: Callable[..., Any], async_wait_until: Callable[..., Any]
) -> None:
    controller = make_controller(initial_rate=4 * MiB)
    async with AsyncSession(controller.address, JOB) as session:
        assert await session.wait_attached(5)
        await async_wait_until(lambda: controller.received()[-1].kind != "hello")
        wire_before, received_before = controller.wire_messages, len(controller.received())
        ops = [session.operation("write", volume=i + 1) for i in range(100)]
        for op in ops:  # posted from one loop turn: they queue behind each other
            await op.__aenter__()
        await async_wait_until(lambda: len(controller.bodies("op_posted")) == 100)
        posted = controller.bodies("op_posted")
        assert [p.volume for p in posted] == list(range(1, 101))  # in order, none lost
        new_messages = len(controller.received()) - received_before
        new_wire = controller.wire_messages - wire_before
        assert new_wire < new_messages / 10, (new_wire, new_messages)
        for op in ops:
            await op.__aexit__(None, None, None)
        await async_wait_until(lambda: len(controller.bodies("op_completed")) == 100)
