"""Controller loss, lease expiry, fallback and re-attachment, with real servers on loopback."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from support import async_wait_until

from burstctl.client import JobInfo, Session
from burstctl.client.core import SessionCore
from burstctl.client.options import SessionOptions

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
JOB = JobInfo("job-7", "bob", "chem")


def pump_bytes(session: Session, nbytes: int, chunk: int = 64 * KiB) -> float:
    """Acquires ``nbytes`` in chunks; returns the seconds it took."""
    start = time.monotonic()
    for _ in range(nbytes // chunk):
        session.acquire(chunk)
    return time.monotonic() - start


def test_fallback_after_lease_expiry_then_reattach_on_the_same_port(
    make_controller: Callable[..., Any],
) -> None:
    first = make_controller(
        initial_rate=4 * MiB, burst=64 * KiB, lease_seconds=0.3, renew_interval=0.1
    )
    with Session(first.address, JOB, "fixed:2MiB/s", report_interval=0.1) as session:
        assert session.wait_attached(5)
        with session.operation("write", volume=123 * KiB) as op:
            first.wait_for(lambda: first.bodies("op_posted"))
            first.stop()
            # The lease outlives the controller a little, then the fallback applies.
            deadline = time.monotonic() + 2
            while session.rate != 2 * MiB:
                session.acquire(16 * KiB)  # never raises, never blocks for long
                assert time.monotonic() < deadline, "the fallback was not applied"
            assert not session.attached
            elapsed = pump_bytes(session, MiB)
            # ~0.5 s at 2 MiB/s: never faster; slower by the wake-ups of a loaded machine (its
            # bucket holds one chunk), never stalled.
            assert 0.3 < elapsed < 3.0

            second = make_controller(first.port, initial_rate=8 * MiB, lease_seconds=30)
            assert session.wait_attached(5), "the session did not re-attach"
            assert session.rate == 8 * MiB
            second.wait_for(lambda: second.bodies("op_posted"))
            kinds = [r.kind for r in second.received()]
            assert kinds[:2] == ["hello", "op_posted"]
            reposted = second.bodies("op_posted")[0]
            assert (reposted.op_id, reposted.volume) == (op.op_id, 123 * KiB)
        second.wait_for(lambda: second.bodies("op_completed"))
        assert second.bodies("op_completed")[0].op_id == op.op_id


# keep-last (an allotted 0 is kept, a never-attached session is not unthrottled):
# test_client_fail_safe.py.


def test_fixed_fallback_when_the_controller_is_unreachable(free_port: int) -> None:
    with Session(f"127.0.0.1:{free_port}", JOB, "fixed:8MiB/s", attach_timeout=0.1) as session:
        session.acquire(KiB)
        assert session.rate == 8 * MiB
        assert 0.1 < pump_bytes(session, 4 * MiB) < 1.0  # ~0.5 s at 8 MiB/s


def test_attaches_to_a_controller_that_starts_late(
    free_port: int, make_controller: Callable[..., Any]
) -> None:
    with Session(f"127.0.0.1:{free_port}", JOB, "unthrottled", attach_timeout=0.1) as session:
        session.acquire(MiB)
        assert session.rate == math.inf
        controller = make_controller(free_port, initial_rate=MiB)
        assert session.wait_attached(5)
        assert session.rate == MiB
        assert controller.received()[0].kind == "hello"


def test_a_silent_stream_is_restarted_when_its_lease_expires(
    make_controller: Callable[..., Any],
) -> None:
    controller = make_controller(initial_rate=2 * MiB, lease_seconds=0.2)  # never renewed
    with Session(controller.address, JOB, "fixed:1MiB/s") as session:
        assert session.wait_attached(5)
        controller.wait_for(lambda: len(controller.received("hello")) >= 2, timeout=3)
        hellos = controller.received("hello")
        assert [h.stream for h in hellos][:2] == [0, 1]
        assert session.wait_attached(5)
        assert session.rate == 2 * MiB


async def test_a_stream_cancelled_on_the_controller_side_is_counted_and_tried_again_quietly(
    make_controller: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # What an overloaded controller's gRPC does to a stream its loop did not take up in time
    # (docs/protocol.md, "Errors"): expected under load, not an error of the session.
    controller = make_controller(reject_with=grpc.StatusCode.CANCELLED)
    options = SessionOptions.build(
        controller.address,
        JOB,
        "fixed:1MiB/s",
        report_interval=0.1,
        quiet_gap=1.0,
        attach_timeout=60.0,
        client_id="node-1",
    )
    caplog.set_level(logging.DEBUG, "burstctl.client.stream")
    core = SessionCore(options)
    await core.start()
    try:
        await async_wait_until(
            lambda: core.stream_ends.get("CANCELLED", 0) >= 2, 10, message="tried again"
        )
        assert set(core.stream_ends) == {"CANCELLED"}
    finally:
        await core.close()
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not loud, loud
