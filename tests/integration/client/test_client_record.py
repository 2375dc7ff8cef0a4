"""`Session.record`, `Session.hold_waiting` and the bucket observer against a scripted
controller: bytes paced elsewhere (the node agent's pages, docs/preload.md) reach the usage
reports and the implicit operations as acquired bytes do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from burstctl.client import JobInfo, Session
from burstctl.client.bucket import Pattern
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
JOB = JobInfo("job-rec", "alice", "physics")


def test_record_books_bytes_and_posts_the_implicit_operation(
    make_controller: Callable[..., Any],
) -> None:
    controller = make_controller(initial_rate=0.0)  # rate 0: an acquire would block forever
    with Session(controller.address, JOB, quiet_gap=0.2, report_interval=0.1) as session:
        assert session.wait_attached(5)
        session.record(3 * MiB, "write")
        session.record(MiB, "read")
        controller.wait_for(lambda: controller.bodies("op_posted"))
        controller.wait_for(
            lambda: any(u.totals.bytes == 4 * MiB for u in controller.bodies("usage")), timeout=3
        )
        totals = controller.bodies("usage")[-1].totals
        assert (totals.bytes_written, totals.bytes_read, totals.ops) == (3 * MiB, MiB, 2)
        posted = controller.bodies("op_posted")
        assert [(p.op_id, p.kind) for p in posted] == [(1, pb.OP_KIND_WRITE)]
        # Quiet for the gap: the phase ends as after an acquire.
        controller.wait_for(lambda: controller.bodies("op_completed"), timeout=3)
        assert not any(u.waiting for u in controller.bodies("usage"))


def test_hold_waiting_tells_the_controller_at_once(make_controller: Callable[..., Any]) -> None:
    controller = make_controller(initial_rate=MiB)
    with Session(controller.address, JOB, report_interval=30) as session:
        assert session.wait_attached(5)
        session.hold_waiting(True)
        session.hold_waiting(True)
        controller.wait_for(lambda: controller.bodies("usage"), timeout=2)  # not the 30 s beat
        assert [u.waiting for u in controller.bodies("usage")] == [True]
        session.hold_waiting(False)
    # The Goodbye's last report: not waiting, with the time waited.
    last = controller.bodies("usage")[-1]
    assert not last.waiting and last.totals.wait_seconds > 0


def test_the_bucket_observer_sees_each_allocation_on_no_lock(
    make_controller: Callable[..., Any],
) -> None:
    controller = make_controller(initial_rate=2 * MiB, burst=MiB)
    seen: list[tuple[float, float, Pattern | None]] = []
    session: Session | None = None

    def observe(rate: float, burst: float, pattern: Pattern | None) -> None:
        assert session is not None
        _ = session.rate  # reads the throttle: it would deadlock under the throttle's lock
        seen.append((rate, burst, pattern))

    session = Session(controller.address, JOB, bucket_observer=observe)
    try:
        assert session.wait_attached(5)
        controller.wait_for(lambda: len(seen) >= 1)
        controller.push(2 * MiB, burst=MiB)  # unchanged: observed too
        controller.wait_for(lambda: len(seen) >= 2)
        assert seen[:2] == [(2 * MiB, MiB, None), (2 * MiB, MiB, None)]
        windows = pb.Windows(
            period_seconds=1.0, window=[pb.Window(start_seconds=0.0, end_seconds=0.5, rate=4 * MiB)]
        )
        controller.push(2 * MiB, burst=MiB, windows=windows)
        controller.wait_for(lambda: len(seen) >= 3 and seen[-1][2] is not None)
        assert seen[-1][2] is not None and seen[-1][2].total == pytest.approx(2 * MiB)
    finally:
        session.close()
