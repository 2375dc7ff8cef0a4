"""The blocking `Session` against a scripted controller on a loopback port."""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from burstctl.client import JobInfo, Session, throttled_open
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
JOB = JobInfo("job-42", "alice", "physics", nodes=4, priority=2.0)


def open_session(controller: Any, **kwargs: Any) -> Session:
    kwargs.setdefault("client_id", "test-client")
    session = Session(controller.address, JOB, **kwargs)
    assert session.wait_attached(5), "the session did not attach"
    return session


def pump(session: Session, seconds: float, chunk: int = 64 * KiB) -> tuple[int, float]:
    """Acquires flat out for about ``seconds``; returns (bytes, elapsed)."""
    total = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        session.acquire(chunk)
        total += chunk
    return total, time.monotonic() - start


def test_hello_is_first_and_describes_the_job(controller: Any) -> None:
    with open_session(controller) as session:
        controller.wait_for(lambda: controller.received())
        first = controller.received()[0]
        assert first.kind == "hello"
        hello = first.message.hello
        assert (hello.job_id, hello.user, hello.group) == ("job-42", "alice", "physics")
        assert (hello.nodes, hello.priority) == (4, 2.0)
        assert hello.client_id == "test-client"
        assert hello.host
        assert session.rate == 8 * MiB


def test_acquire_is_paced_at_the_allocated_rate(make_controller: Callable[..., Any]) -> None:
    # A bucket a quarter of a second deep: a pumping thread that wakes late (a loaded machine)
    # finds the tokens it missed still there, so what it moves is what the bucket supplies.
    # The warm-up takes what the bucket held when the session attached.
    controller = make_controller(initial_rate=4 * MiB, burst=MiB)
    with open_session(controller) as session:
        pump(session, 0.5)
        total, elapsed = pump(session, 1.5)
    assert total / elapsed == pytest.approx(4 * MiB, rel=0.10)


def test_rate_zero_blocks_until_a_new_allocation(
    controller: Any, wait_until: Callable[..., None]
) -> None:
    with open_session(controller) as session:
        controller.push(0.0, burst=0)
        wait_until(lambda: session.rate == 0)  # the client applied it
        done = threading.Event()
        worker = threading.Thread(target=lambda: (session.acquire(MiB), done.set()))
        worker.start()
        # The client tells the controller at once that it waits; it is still blocked then.
        controller.wait_for(lambda: any(u.waiting for u in controller.bodies("usage")))
        assert not done.is_set()
        controller.push(16 * MiB)
        assert done.wait(2), "the new allocation did not unblock the waiter"
        worker.join()


def test_implicit_operation_is_completed_after_the_quiet_gap(controller: Any) -> None:
    with open_session(controller, quiet_gap=0.2) as session:
        session.acquire(KiB, "read")
        last_acquire = time.monotonic()
        controller.wait_for(lambda: controller.bodies("op_completed"), timeout=3)
        posted = controller.bodies("op_posted")
        assert [(p.op_id, p.kind, p.volume) for p in posted] == [(1, pb.OP_KIND_READ, 0)]
        completed = controller.received("op_completed")
        assert [c.message.op_completed.op_id for c in completed] == [1]
        assert completed[0].at - last_acquire >= 0.2 - 0.02
        # it says how long it stayed open after its last byte: the phase ended that long before
        quiet = completed[0].message.op_completed.quiet_seconds
        assert 0.2 <= quiet <= completed[0].at - last_acquire + 0.01
        # The next burst of I/O is a new implicit operation with a greater id.
        session.acquire(KiB, "write")
        controller.wait_for(lambda: len(controller.bodies("op_posted")) == 2)
        assert controller.bodies("op_posted")[1].op_id == 2


def test_end_phase_completes_the_implicit_operation_at_once(controller: Any) -> None:
    # A quiet gap far longer than the test: only end_phase can complete the operations.
    with open_session(controller, quiet_gap=60) as session:
        session.end_phase()  # none open: nothing to complete
        session.acquire(KiB, "write")
        controller.wait_for(lambda: controller.bodies("op_posted"))
        asked = time.monotonic()
        session.end_phase()
        controller.wait_for(lambda: controller.bodies("op_completed"))
        assert controller.received("op_completed")[0].at - asked < 2
        session.acquire(KiB, "read")  # the next burst is a new implicit operation
        controller.wait_for(lambda: len(controller.bodies("op_posted")) == 2)
        session.end_phase()
        controller.wait_for(lambda: len(controller.bodies("op_completed")) == 2)
        with session.operation("write", volume=KiB) as op:
            session.end_phase()  # explicit operations are the caller's to complete
            heartbeats = len(controller.bodies("usage"))
            controller.wait_for(lambda: len(controller.bodies("usage")) >= heartbeats + 2)
            assert len(controller.bodies("op_completed")) == 2
    posted = [(p.op_id, p.kind) for p in controller.bodies("op_posted")]
    assert posted == [(1, pb.OP_KIND_WRITE), (2, pb.OP_KIND_READ), (op.op_id, pb.OP_KIND_WRITE)]
    assert [c.op_id for c in controller.bodies("op_completed")] == [1, 2, op.op_id]


def test_a_blocked_acquire_keeps_the_implicit_operation_open(
    controller: Any, wait_until: Callable[..., None]
) -> None:
    with open_session(controller, quiet_gap=0.05) as session:
        controller.push(0.0, burst=0)
        wait_until(lambda: session.rate == 0)
        worker = threading.Thread(target=session.acquire, args=(KiB,))
        worker.start()
        controller.wait_for(lambda: any(u.waiting for u in controller.bodies("usage")))
        # Several quiet gaps pass while it waits: let a few heartbeats go by.
        heartbeats = len(controller.bodies("usage"))
        controller.wait_for(lambda: len(controller.bodies("usage")) >= heartbeats + 2)
        assert controller.bodies("op_completed") == []
        controller.push(MiB)
        worker.join(2)
        controller.wait_for(lambda: controller.bodies("op_completed"))


def test_explicit_operation_posts_and_completes(controller: Any) -> None:
    with open_session(controller) as session:
        with session.operation("write", volume=10 * KiB) as op:
            session.acquire(10 * KiB, "write")
        with pytest.raises(KeyError), session.operation("metadata"):
            raise KeyError("boom")
        controller.wait_for(lambda: len(controller.bodies("op_completed")) == 2)
        posted = controller.bodies("op_posted")
        assert [(p.op_id, p.kind, p.volume) for p in posted] == [
            (op.op_id, pb.OP_KIND_WRITE, 10 * KiB),
            (op.op_id + 1, pb.OP_KIND_METADATA, 0),
        ]
        completed = [c.op_id for c in controller.bodies("op_completed")]
        assert completed == [op.op_id, op.op_id + 1]


def test_concurrent_operations_from_threads_have_their_own_ids(controller: Any) -> None:
    with open_session(controller) as session:
        barrier = threading.Barrier(4)

        def work() -> None:
            with session.operation("read", volume=KiB):
                barrier.wait(5)  # all four are open at once
                session.acquire(KiB, "read")

        workers = [threading.Thread(target=work) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(5)
        controller.wait_for(lambda: len(controller.bodies("op_completed")) == 4)
        ids = [p.op_id for p in controller.bodies("op_posted")]
        assert sorted(ids) == sorted(set(ids)) and len(ids) == 4 and min(ids) > 0
        assert sorted(c.op_id for c in controller.bodies("op_completed")) == sorted(ids)


def test_waiting_is_reported_at_once_and_once_per_transition(
    make_controller: Callable[..., Any],
) -> None:
    controller = make_controller(initial_rate=MiB, burst=0)
    # Periodic reports are far apart, so any prompt Usage is the immediate one.
    with open_session(controller, report_interval=30) as session:
        start = time.monotonic()
        for _ in range(5):
            session.acquire(16 * KiB)  # each one waits ~16 ms at 1 MiB/s with no burst
        controller.wait_for(lambda: controller.bodies("usage"), timeout=2)
        usage = controller.received("usage")
        assert len(usage) == 1
        assert usage[0].message.usage.waiting
        assert usage[0].at - start < 0.5


def test_usage_heartbeats_arrive_every_report_interval(controller: Any) -> None:
    with open_session(controller, report_interval=0.1):
        controller.wait_for(lambda: len(controller.bodies("usage")) >= 8, timeout=3)
    usage = controller.received("usage")[:-1]  # the last one came with the Goodbye
    gaps = [b.at - a.at for a, b in itertools.pairwise(usage)]
    assert 0.07 < statistics.median(gaps) < 0.15
    for report in (u.message.usage for u in usage):
        assert report.bytes == 0 and report.ops == 0 and not report.waiting
        assert 0.05 < report.interval_seconds < 0.3


def test_usage_counts_bytes_ops_and_wait(make_controller: Callable[..., Any]) -> None:
    controller = make_controller(initial_rate=4 * MiB, burst=0)
    with open_session(controller, report_interval=0.1) as session:
        total, elapsed = pump(session, 0.5, chunk=32 * KiB)
        controller.wait_for(
            lambda: sum(u.bytes for u in controller.bodies("usage")) >= total, timeout=2
        )
    reports = controller.bodies("usage")
    assert sum(u.bytes for u in reports) == total
    assert sum(u.ops for u in reports) == total // (32 * KiB)
    # Flat out against an empty bucket, nearly all of the time is spent waiting.
    assert 0.5 * elapsed < sum(u.wait_seconds for u in reports) < 1.2 * elapsed


def test_many_threads_share_the_rate(make_controller: Callable[..., Any]) -> None:
    controller = make_controller(initial_rate=4 * MiB, burst=64 * KiB)
    with open_session(controller) as session:
        totals = [0] * 8
        start = time.monotonic()

        def work(index: int) -> None:
            while time.monotonic() - start < 1.0:
                session.acquire(16 * KiB, "write")
                totals[index] += 16 * KiB

        workers = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(5)
        elapsed = time.monotonic() - start
    assert sum(totals) / elapsed == pytest.approx(4 * MiB, rel=0.15)
    assert min(totals) > 0  # arrival order: nobody starves


def test_stale_allocation_epoch_is_ignored(
    controller: Any, caplog: pytest.LogCaptureFixture, wait_until: Callable[..., None]
) -> None:
    caplog.set_level(logging.DEBUG, logger="burstctl.client.stream")
    with open_session(controller) as session:
        controller.push(2 * MiB, epoch=5)
        wait_until(lambda: session.rate == 2 * MiB)
        controller.push(3 * MiB, epoch=5)
        wait_until(lambda: "stale allocation epoch 5" in caplog.text)
        assert session.rate == 2 * MiB
        controller.push(3 * MiB, epoch=6)
        wait_until(lambda: session.rate == 3 * MiB)


def test_close_says_goodbye_and_stops_the_thread(
    controller: Any, wait_until: Callable[..., None]
) -> None:
    session = open_session(controller)
    thread = session.runtime.thread
    session.acquire(KiB)
    session.close()
    assert not thread.is_alive()
    # the server handles what arrived on its own loop: wait until it has seen the goodbye
    wait_until(lambda: any(m.kind == "goodbye" for m in controller.received()))
    assert controller.received()[-1].kind == "goodbye"
    session.close()  # idempotent
    with pytest.raises(RuntimeError, match="session is closed"):
        session.acquire(KiB)
    with pytest.raises(RuntimeError, match="session is closed"), session.operation("read"):
        pass
    assert not session.attached


def test_close_wakes_a_blocked_acquire(controller: Any, wait_until: Callable[..., None]) -> None:
    session = open_session(controller)
    controller.push(0.0, burst=0)
    wait_until(lambda: session.rate == 0)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            session.acquire(KiB)
        except RuntimeError as err:
            errors.append(err)

    worker = threading.Thread(target=work)
    worker.start()
    controller.wait_for(lambda: any(u.waiting for u in controller.bodies("usage")))
    session.close()
    worker.join(2)
    assert not worker.is_alive()
    assert [str(e) for e in errors] == ["session is closed"]


def test_bad_arguments_raise_at_once(controller: Any) -> None:
    with pytest.raises(ValueError, match="fallback"):
        Session(controller.address, JOB, fallback="sometimes")
    with open_session(controller) as session:
        with pytest.raises(ValueError, match="kind"):
            session.acquire(1, "append")
        with pytest.raises(ValueError, match="nbytes"):
            session.acquire(-1)
        with pytest.raises(ValueError, match="nbytes"):
            session.acquire(1.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="kind"):
            session.operation("scan")
        with pytest.raises(ValueError, match="volume"):
            session.operation("read", volume=-5)
    assert controller.bodies("op_posted") == []


def test_invalid_argument_is_logged_and_retried_with_backoff(
    make_controller: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    controller = make_controller(reject_with=grpc.StatusCode.INVALID_ARGUMENT)
    start = time.monotonic()
    with Session(controller.address, JOB, attach_timeout=5) as session:
        controller.wait_for(lambda: controller.stream_count >= 4, timeout=5)
        elapsed = time.monotonic() - start
        assert not session.attached
    # Three retries back off at least 25 + 50 + 100 ms: no hot loop.
    assert elapsed > 0.15
    assert controller.stream_count < 10
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and "rejected" in errors[0].getMessage()


def test_unthrottled_fallback_before_any_allocation_with_an_unreachable_controller(
    free_port: int,
) -> None:
    # Only an explicit "unthrottled" fallback runs unthrottled (keep-last: test_client_fail_safe).
    with Session(f"127.0.0.1:{free_port}", JOB, "unthrottled", attach_timeout=0.2) as session:
        assert session.rate == 0  # waits for a controller at first
        start = time.monotonic()
        session.acquire(100 * MiB)  # blocks until attach_timeout, then goes unthrottled
        assert 0.1 < time.monotonic() - start < 2
        assert session.rate == math.inf
        assert not session.attached


def test_throttled_open_paces_reads_and_writes(
    make_controller: Callable[..., Any], tmp_path: Path
) -> None:
    controller = make_controller(initial_rate=4 * MiB, burst=0)
    path = tmp_path / "data.bin"
    payload = bytes(range(256)) * 4 * KiB  # 1 MiB
    with open_session(controller, report_interval=0.1) as session:
        start = time.monotonic()
        with throttled_open(path, "wb", session=session) as out:
            for offset in range(0, len(payload), 64 * KiB):
                out.write(payload[offset : offset + 64 * KiB])
        with throttled_open(path, "rb", session=session) as source:
            assert source.read(10) == payload[:10]
            assert source.read() == payload[10:]
        elapsed = time.monotonic() - start
        with throttled_open(tmp_path / "text.txt", "w", session=session, encoding="utf-8") as text:
            text.writelines(["é\n", "b\n"])
        with throttled_open(tmp_path / "text.txt", "r", session=session, encoding="utf-8") as text:
            assert list(text) == ["é\n", "b\n"]
        moved = 2 * len(payload) + 2 * 5  # "é" is two bytes in UTF-8
        controller.wait_for(lambda: sum(u.bytes for u in controller.bodies("usage")) == moved)
    assert 0.4 < elapsed < 0.8  # 2 MiB at 4 MiB/s
    # Opening is a metadata acquire, so it starts the implicit operation.
    assert controller.bodies("op_posted")[0].kind == pb.OP_KIND_METADATA


def test_the_last_usage_precedes_the_goodbye_with_every_byte(
    make_controller: Callable[..., Any],
) -> None:
    controller = make_controller(initial_rate=64 * MiB)
    # Periodic reports are far apart: only the closing report can carry the bytes.
    with open_session(controller, report_interval=30) as session:
        session.acquire(1000, "read")
        session.acquire(24, "write")
    controller.wait_for(lambda: controller.bodies("goodbye"), timeout=2)
    kinds = [r.kind for r in controller.received()]
    assert kinds[-2:] == ["usage", "goodbye"]
    totals = controller.bodies("usage")[-1].totals
    assert (totals.bytes, totals.bytes_read, totals.bytes_written, totals.ops) == (
        1024,
        1000,
        24,
        2,
    )
