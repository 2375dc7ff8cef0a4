"""Nothing raised into the application, and a session that degrades paces only at rates a
controller handed out: what it last allotted, or the session's share of its fallback budget.

Real gRPC servers on loopback (the scripted `FakeController`); the session is the real one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from support import Pump, measure

from burstctl.client import AsyncSession, JobInfo, Session
from burstctl.common.limits import MIN_RATE

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
JOB = JobInfo("job-15", "bob", "chem")
# What a replica allotted at cluster start-up: an ulp-level residue of capacity − Σ column.
RESIDUE = 6.2e-9


def test_a_residue_rate_is_zero_and_nothing_is_raised_into_acquire(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(initial_rate=RESIDUE, lease_seconds=30)
    with Session(controller.address, JOB) as session:
        assert session.wait_attached(5)
        pumps = [Pump(session, chunk=64 * KiB).start() for _ in range(4)]
        try:

            def errors() -> list[BaseException]:
                return [e for p in pumps for e in p.errors]

            # The pumps are blocked in acquire (the first reservation waits), or raised.
            wait_until(lambda: session.total_wait_seconds > 0 or errors(), message="waiting")
            assert not errors(), f"raised into the application: {errors()!r}"
            assert session.rate == 0  # below MIN_RATE: "wait", not "wait 10^13 s"
            controller.push(4 * MiB, burst=64 * KiB)
            wait_until(
                lambda: all(p.moved >= 256 * KiB for p in pumps) or errors(), 10, message="flow"
            )
            assert not errors(), f"raised into the application: {errors()!r}"
        finally:
            for p in pumps:
                p.stop()


async def test_a_residue_rate_never_raises_into_an_async_acquire(
    make_controller: Callable[..., Any], async_wait_until: Callable[..., Any]
) -> None:
    controller = make_controller(initial_rate=RESIDUE, lease_seconds=30)
    async with AsyncSession(controller.address, JOB) as session:
        assert await session.wait_attached(5)
        assert session.rate == 0
        acquire = asyncio.create_task(session.acquire(64 * KiB))
        await async_wait_until(lambda: session.total_wait_seconds > 0)
        assert not acquire.done()
        controller.push(4 * MiB, burst=64 * KiB)
        await asyncio.wait_for(acquire, 5)  # raises what acquire raised, if anything


def test_keep_last_keeps_an_allotted_zero_after_the_lease(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    """The controller deliberately said 0, then vanished: 0 is the share to keep."""
    controller = make_controller(initial_rate=3 * MiB, lease_seconds=0.3, renew_interval=0.1)
    with Session(controller.address, JOB, "keep-last", fallback_grace=30) as session:
        assert session.wait_attached(5)
        controller.push(0.0, burst=0, lease=0.3)
        wait_until(lambda: session.rate == 0, message="the allotted 0 in force")
        controller.stop()
        wait_until(lambda: not session.attached, 5, message="the lease ran out")
        pump = Pump(session, chunk=16 * KiB).start()
        try:
            # A 1 s window while detached: keep-last must move nothing past the allotted 0.
            (moved,) = measure([pump], 1.0)
        finally:
            pump.stop()
        assert moved == 0, f"keep-last failed open at {moved / MiB:.2f} MiB/s"
        assert session.rate == 0
        assert not pump.errors


def test_keep_last_gives_up_an_allotted_zero_for_its_budget_share_after_the_grace(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    """...but does not block the application forever: after ``fallback_grace`` and one more
    lease, the session's share of the controller's fallback budget applies."""
    controller = make_controller(
        initial_rate=3 * MiB, lease_seconds=0.2, renew_interval=0.05, fallback_rate=2 * MiB
    )
    with Session(controller.address, JOB, "keep-last:4MiB/s", fallback_grace=0.5) as session:
        assert session.wait_attached(5)
        controller.push(0.0, burst=0, lease=0.2)
        wait_until(lambda: session.rate == 0, message="the allotted 0 in force")
        controller.stop()
        start = time.monotonic()
        session.acquire(KiB)  # blocked until lease (0.2 s) + grace (0.5 s) + lease (0.2 s)
        waited = time.monotonic() - start
        assert 0.8 <= waited < 3.0
        assert session.rate == 2 * MiB


def test_keep_last_rises_to_its_share_only_a_lease_after_the_grace(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    """A kept rate below the budget share is kept through the grace and one more lease (the
    lower of the two), and only then rises to the share: by then every session of the
    vanished controller has left its kept rate (their leases end at most a lease apart)."""
    lease, grace = 0.4, 0.3
    controller = make_controller(
        initial_rate=8 * MiB, lease_seconds=lease, renew_interval=0.1, fallback_rate=5 * MiB
    )
    changes: list[tuple[float, float]] = []
    with Session(
        controller.address,
        JOB,
        "keep-last:8MiB/s",  # a cap above the share
        fallback_grace=grace,
        rate_observer=lambda rate: changes.append((time.monotonic(), rate)),
    ) as session:
        assert session.wait_attached(5)
        controller.push(3 * MiB, lease=lease)
        wait_until(lambda: session.rate == 3 * MiB)
        controller.stop()
        stopped = time.monotonic()
        wait_until(lambda: session.rate == 5 * MiB, 10, message="the budget share")
        rose = next(t for t, rate in changes if rate == 5 * MiB)
        # not before the last allocation's lease, the grace and one more lease have passed
        assert rose - stopped >= grace + lease, (rose - stopped, changes)
        assert all(rate <= 3 * MiB for t, rate in changes if t < rose and t >= stopped)


def test_keep_last_falls_to_its_budget_share_after_the_grace(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    """A kept share above the budget share is kept only ``fallback_grace`` past the lease:
    as long as the survivors of a dead replica count it (docs/replicas.md). ``keep-last:<rate>``
    caps the share."""
    controller = make_controller(
        initial_rate=8 * MiB, lease_seconds=0.3, renew_interval=0.1, fallback_rate=3 * MiB
    )
    with Session(controller.address, JOB, "keep-last:2MiB/s", fallback_grace=1.5) as session:
        assert session.wait_attached(5)
        controller.push(8 * MiB, lease=0.3)
        wait_until(lambda: session.rate == 8 * MiB)
        controller.stop()
        wait_until(lambda: not session.attached, 5, message="the lease ran out")
        assert session.rate == 8 * MiB  # kept through the grace...
        wait_until(lambda: session.rate == 2 * MiB, 5, message="the fall after the grace")


def test_a_never_attached_keep_last_session_waits_at_zero_then_is_served(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    # A controller that accepts the stream but does not allocate (overloaded, or hung): the
    # session paces at no per-session constant, however long it waits, and nothing raises.
    controller = make_controller()
    with Session(controller.address, JOB, "keep-last", attach_timeout=0.2) as session:
        pump = Pump(session, chunk=16 * KiB).start()
        try:
            wait_until(lambda: session.total_wait_seconds >= 0.5, message="past attach_timeout")
            assert pump.moved == 0 and session.rate == 0 and not session.attached
            assert not pump.errors
            assert controller.received()[0].kind == "hello"
            controller.push(4 * MiB, burst=64 * KiB)  # admitted at last: served
            wait_until(lambda: pump.moved >= 256 * KiB, 10, message="served once attached")
        finally:
            pump.stop()
        assert not pump.errors


def test_a_fixed_fallback_paces_a_never_attached_session_at_its_rate(
    free_port: int,
) -> None:
    with Session(f"127.0.0.1:{free_port}", JOB, "fixed:4MiB/s", attach_timeout=0.2) as s:
        s.acquire(KiB)
        assert s.rate == 4 * MiB and math.isfinite(s.rate)
        start = time.monotonic()
        for _ in range(16):
            s.acquire(128 * KiB)  # 2 MiB at 4 MiB/s
        assert time.monotonic() - start > 0.3


def test_rate_floor_is_one_byte_per_second() -> None:
    assert MIN_RATE == 1.0
