"""The client's side of the burst buffer's space contract (docs/capacity.md): `acquire_space`,
`report_buffer`, the Buffer reports, and what a new stream or a vanished controller does.

Real gRPC servers on loopback (the scripted `FakeController`); the sessions are the real ones.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from burstctl.client import AsyncSession, JobInfo, Session
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
JOB = JobInfo("job-18", "bob", "chem")


class SpaceWriter:
    """A thread calling acquire_space(step) ``count`` times; records errors."""

    def __init__(self, session: Session, step: int, count: int) -> None:
        self.session, self.step, self.count = session, step, count
        self.done = 0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SpaceWriter:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for _ in range(self.count):
                self.session.acquire_space(self.step)
                self.done += 1
        except BaseException as err:  # recorded for the test to fail on
            self.errors.append(err)


def _last_usage_buffer(controller: Any) -> pb.Buffer | None:
    usages = [u for u in controller.bodies("usage") if u.HasField("buffer")]
    return usages[-1].buffer if usages else None


def test_acquire_space_waits_at_the_limit_and_goes_on_when_it_rises(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(lease_seconds=30)
    with Session(controller.address, JOB, buffer=True, report_interval=0.05) as session:
        controller.wait_for(lambda: controller.received("hello"))
        hello = controller.bodies("hello")[0]
        assert hello.purpose == pb.PURPOSE_APP and hello.HasField("buffer")
        controller.push(8 * MiB, space=1 * MiB)
        wait_until(lambda: session.space_limit == 1 * MiB, message="the limit in force")
        writer = SpaceWriter(session, 256 * KiB, 6).start()
        # 4 steps fit under 1 MiB, the 5th waits, and says so in the Usage.
        wait_until(lambda: writer.done == 4 and session.total_wait_seconds > 0, message="wait")
        controller.wait_for(lambda: any(u.waiting for u in controller.bodies("usage")))
        assert writer.done == 4 and session.buffer_added == 1 * MiB
        controller.push(8 * MiB, space=2 * MiB)
        writer.thread.join(5)
        assert not writer.thread.is_alive() and not writer.errors
        assert session.buffer_added == 6 * 256 * KiB
        controller.wait_for(
            lambda: (b := _last_usage_buffer(controller)) is not None and b.added == 6 * 256 * KiB
        )


def test_without_space_in_allocations_nothing_waits(
    make_controller: Callable[..., Any],
) -> None:
    controller = make_controller(initial_rate=8 * MiB)
    with Session(controller.address, JOB, buffer=True) as session:
        assert session.wait_attached(5)
        session.acquire_space(64 * MiB)  # no capacity on the controller: no wait
        assert session.space_limit is None and session.buffer_added == 64 * MiB
        assert session.total_wait_seconds == 0


def test_acquire_space_waits_for_the_first_allocation(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller()  # answers nothing until told
    with Session(controller.address, JOB, buffer=True, attach_timeout=30) as session:
        controller.wait_for(lambda: controller.received("hello"))
        writer = SpaceWriter(session, 4 * KiB, 1).start()
        wait_until(lambda: session.total_wait_seconds > 0, message="waiting to attach")
        assert writer.done == 0
        controller.push(8 * MiB, space=1 * MiB)
        writer.thread.join(5)
        assert writer.done == 1 and not writer.errors


def test_attach_timeout_lets_space_through(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller()  # never answers
    with Session(controller.address, JOB, buffer=True, attach_timeout=0.2) as session:
        writer = SpaceWriter(session, 4 * KiB, 3).start()
        writer.thread.join(5)
        assert writer.done == 3 and not writer.errors
        assert session.space_limit is None


def test_close_wakes_space_waiters(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(lease_seconds=30)
    session = Session(controller.address, JOB, buffer=True)
    controller.wait_for(lambda: controller.received("hello"))
    controller.push(8 * MiB, space=0)
    wait_until(lambda: session.space_limit == 0, message="limit 0")
    writer = SpaceWriter(session, 4 * KiB, 1).start()
    wait_until(lambda: session.total_wait_seconds > 0, message="waiting")
    session.close()
    writer.thread.join(5)
    assert writer.done == 1 and not writer.errors


def test_report_buffer_reaches_the_usage_and_a_drain_error_goes_at_once(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(initial_rate=8 * MiB)
    # A long report interval: only the drain-error change can bring a Usage quickly.
    with Session(controller.address, JOB, buffer=True, report_interval=60) as session:
        assert session.wait_attached(5)
        session.report_buffer(5 * MiB, 3 * MiB, "PFS unwritable: EACCES")
        controller.wait_for(
            lambda: (
                (b := _last_usage_buffer(controller)) is not None
                and b.drain_error == "PFS unwritable: EACCES"
                and (b.resident, b.pending) == (5 * MiB, 3 * MiB)
            )
        )
        with pytest.raises(ValueError, match="pending"):
            session.report_buffer(1, 2)


def test_a_new_stream_drops_the_unused_reservation(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(lease_seconds=30)
    with Session(controller.address, JOB, buffer=True) as session:
        controller.wait_for(lambda: controller.received("hello"))
        controller.push(8 * MiB, space=4 * MiB)
        wait_until(lambda: session.space_limit == 4 * MiB, message="limit")
        session.acquire_space(1 * MiB)
        controller.end_stream(grpc.StatusCode.UNAVAILABLE)
        controller.wait_for(lambda: controller.received("hello", stream=1), timeout=10)
        # Until the new stream's first space: limit = added, so the next byte waits.
        wait_until(lambda: session.space_limit == 1 * MiB, message="limit dropped")
        hello = controller.bodies("hello", stream=1)[0]
        assert hello.buffer.added == 1 * MiB
        writer = SpaceWriter(session, 4 * KiB, 1).start()
        wait_until(lambda: session.total_wait_seconds > 0, message="waiting on the new stream")
        assert writer.done == 0
        controller.push(8 * MiB, space=2 * MiB)
        writer.thread.join(5)
        assert writer.done == 1


def test_space_stays_enforced_without_a_controller_until_the_grace(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(lease_seconds=0.3, renew_interval=0.1)
    with Session(controller.address, JOB, buffer=True, fallback_grace=1.0) as session:
        controller.wait_for(lambda: controller.received("hello"))
        controller.push(8 * MiB, space=1 * MiB, lease=0.3)
        wait_until(lambda: session.space_limit == 1 * MiB, message="limit")
        controller.stop()
        # The granted space stays usable after the lease ...
        session.acquire_space(1 * MiB)
        writer = SpaceWriter(session, 4 * KiB, 1).start()
        wait_until(lambda: not session.attached, message="lease ran out")
        assert writer.done == 0  # ... beyond it writes wait ...
        writer.thread.join(10)  # ... until fallback_grace after the lease ran out
        assert writer.done == 1 and not writer.errors


def test_drain_purpose_goes_in_the_hello_and_drain_refuses_a_buffer(
    make_controller: Callable[..., Any],
) -> None:
    controller = make_controller(initial_rate=8 * MiB)
    with Session(controller.address, JOB, purpose="drain") as session:
        assert session.wait_attached(5)
        assert controller.bodies("hello")[0].purpose == pb.PURPOSE_DRAIN
        assert not any(u.HasField("buffer") for u in controller.bodies("usage"))
        with pytest.raises(RuntimeError, match="buffer=True"):
            session.acquire_space(1)
    with pytest.raises(ValueError, match="purpose"):
        Session(controller.address, JOB, purpose="drain", buffer=True)
    with pytest.raises(ValueError, match="purpose"):
        Session(controller.address, JOB, purpose="copy")  # type: ignore[arg-type]


async def test_async_acquire_space_waits_and_resumes(
    make_controller: Callable[..., Any], async_wait_until: Callable[..., Any]
) -> None:
    controller = make_controller(lease_seconds=30)
    async with AsyncSession(controller.address, JOB, buffer=True) as session:
        await async_wait_until(lambda: controller.received("hello"))
        controller.push(8 * MiB, space=64 * KiB)
        await async_wait_until(lambda: session.space_limit == 64 * KiB)
        await session.acquire_space(64 * KiB)
        pending = asyncio.create_task(session.acquire_space(1))
        await async_wait_until(lambda: session.total_wait_seconds > 0)
        assert not pending.done()
        controller.push(8 * MiB, space=128 * KiB)
        await asyncio.wait_for(pending, 5)
        assert session.buffer_added == 64 * KiB + 1
