"""The limits of one replica in isolation: the notice queue, the job table's caps, the
admission check, the configuration fields and the client's reading of a retry hint."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
from support import async_wait_until
from support.clock import FakeClock

from burstctl.common.limits import MAX_JOBS
from burstctl.controller.config import ConfigError, load_config
from burstctl.controller.jobs import JobTable, LimitError
from burstctl.controller.load import LoopLag, client_host
from burstctl.controller.outbox import StreamOutbox
from burstctl.controller.records import JobMeta, OpKind
from burstctl.controller.servicer import ControllerServicer


def meta(job_id: str) -> JobMeta:
    return JobMeta(job_id=job_id, user="u", group="g", nodes=1, priority=1.0)


def table(clock: FakeClock, **limits: int) -> JobTable:
    return JobTable(clock, heartbeat_timeout=3.0, job_retention=10.0, demand_headroom=1.1, **limits)


# -- notices ---------------------------------------------------------------------------------


async def test_notices_beyond_the_bound_are_counted_and_summarised() -> None:
    stream = StreamOutbox("r", max_notices=3)
    for i in range(10):
        stream.error(grpc.StatusCode.NOT_FOUND, "op_completed.op_id", f"no open operation {i}")
        assert stream.queued_notices <= 3
    sent = [await stream.next() for _ in range(4)]
    assert [m.error.message for m in sent[:3] if m is not None] == [
        f"no open operation {i}" for i in range(3)
    ]
    summary = sent[3]
    assert summary is not None and summary.error.code == "RESOURCE_EXHAUSTED"
    assert (
        summary.error.message == "7 more error notices dropped (max_notices = 3 queued per session)"
    )
    # Drained: new notices queue again, and an allocation still goes out.
    stream.error(grpc.StatusCode.NOT_FOUND, "f", "again")
    stream.offer(5.0, 1.0, 1, 1.0, "p")
    again, alloc = await stream.next(), await stream.next()
    assert again is not None and again.error.message == "again"
    assert alloc is not None and alloc.allocation.rate == 5.0


async def test_a_drained_stream_waits_instead_of_repeating_the_summary() -> None:
    stream = StreamOutbox(max_notices=1)
    stream.error(grpc.StatusCode.NOT_FOUND, "f", "a")
    stream.error(grpc.StatusCode.NOT_FOUND, "f", "b")
    assert (await stream.next()) is not None
    assert (await stream.next()) is not None  # the summary of "b"
    waiter = asyncio.ensure_future(stream.next())
    await asyncio.sleep(0)  # let it run to its wait; nothing is due
    assert not waiter.done()
    stream.end()
    assert await waiter is None


# -- the job table ---------------------------------------------------------------------------


def test_a_full_table_of_active_jobs_refuses_a_new_job_with_a_retry_hint() -> None:
    t = table(FakeClock(), max_jobs=2)
    t.open_session(meta("a"), "c", "h")
    t.open_session(meta("b"), "c", "h")
    with pytest.raises(LimitError) as info:
        t.open_session(meta("c"), "c", "h")
    assert info.value.retry and "max_jobs = 2" in str(info.value)
    assert set(t.jobs) == {"a", "b"}
    t.open_session(meta("a"), "c2", "h")  # a job of the table is no new job


def test_a_new_job_in_a_full_table_takes_the_place_of_the_longest_inactive() -> None:
    clock = FakeClock()
    t = table(clock, max_jobs=3)
    sessions = {j: t.open_session(meta(j), "c", "h") for j in ("a", "b", "c")}
    t.close_session(sessions["b"])
    clock.now += 1
    t.close_session(sessions["a"])
    t.open_session(meta("d"), "c", "h")
    assert set(t.jobs) == {"a", "c", "d"}  # b was inactive the longest
    t.open_session(meta("a"), "c", "h")  # a comes back: active again, not evictable
    with pytest.raises(LimitError):
        t.open_session(meta("e"), "c", "h")
    view = t.view(1e9, 1e8)  # the dropped job left no row behind
    assert "b" not in view.jobs


def test_expired_jobs_leave_the_eviction_order() -> None:
    clock = FakeClock()
    t = table(clock, max_jobs=2)
    s = t.open_session(meta("a"), "c", "h")
    t.close_session(s)
    clock.now += 11  # past job_retention
    t.expire()
    assert not t.jobs
    t.open_session(meta("b"), "c", "h")
    t.open_session(meta("c"), "c", "h")  # room without evicting anything stale


def test_open_operations_are_bounded_per_session() -> None:
    t = table(FakeClock(), max_open_ops=2)
    s = t.open_session(meta("a"), "c", "h")
    t.post(s, 1, OpKind.WRITE, 0)
    t.post(s, 2, OpKind.WRITE, 0)
    with pytest.raises(LimitError) as info:
        t.post(s, 3, OpKind.WRITE, 0)
    assert not info.value.retry
    assert str(info.value) == (
        "op_posted.op_id: more than max_open_ops = 2 operations open on this session"
    )
    assert set(s.ops) == {1, 2}
    t.complete(s, 1)
    t.post(s, 3, OpKind.WRITE, 0)  # a place came free


# -- admission -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.7:5432", "10.0.0.7"),
        ("ipv6:[::1]:5432", "::1"),
        ("ipv6:[fe80::1%eth0]:1", "fe80::1%eth0"),
        ("unix:/run/burstctl.sock", "unix:/run/burstctl.sock"),
        ("ipv4:10.0.0.7", "10.0.0.7"),
        ("", ""),
    ],
)
def test_client_host(peer: str, host: str) -> None:
    assert client_host(peer) == host


def test_admission_counts_open_streams_in_total_and_per_host() -> None:
    servicer = ControllerServicer(
        table(FakeClock()), max_op_volume=1, max_sessions=3, max_sessions_per_client=2
    )
    servicer.admit("10.0.0.1")
    servicer.streams = {1: StreamOutbox(), 2: StreamOutbox()}
    servicer._per_client = {"10.0.0.1": 2}
    with pytest.raises(LimitError, match=r"10\.0\.0\.1 is at its session limit"):
        servicer.admit("10.0.0.1")
    servicer.admit("10.0.0.2")
    servicer.streams[3] = StreamOutbox()
    with pytest.raises(LimitError, match="max_sessions = 3") as info:
        servicer.admit("10.0.0.2")
    assert info.value.retry


# -- configuration ---------------------------------------------------------------------------


def test_limit_defaults_and_bounds() -> None:
    config = load_config()
    assert config.max_jobs == MAX_JOBS and config.max_digest_jobs == MAX_JOBS
    assert config.max_notices == 64 and config.max_open_ops == 1024
    assert config.max_sessions_per_client <= config.max_sessions
    for bad in (
        {"max_sessions": 0},
        {"max_jobs": MAX_JOBS + 1},
        {"max_notices": 0},
        {"max_message_bytes": 1000},
        {"retry_after": 0},
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            load_config(**bad)


def test_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BURSTCTL_MAX_SESSIONS", "10")
    monkeypatch.setenv("BURSTCTL_RETRY_AFTER", "0.25")
    config = load_config()
    assert (config.max_sessions, config.retry_after) == (10, 0.25)


# -- overload: the event loop's lag ----------------------------------------------------------


def test_loop_lag_rises_at_once_and_decays() -> None:
    lag = LoopLag()
    lag.sample(0.8)
    assert lag.value == 0.8 and lag.peak == 0.8
    lag.sample(0.0)
    assert lag.value == pytest.approx(0.72)
    for _ in range(40):
        lag.sample(0.0)
    assert lag.value < 0.02 and lag.peak == 0.8
    lag.sample(-0.001)  # a timer early by rounding is no lag
    assert lag.value >= 0


async def test_loop_lag_probe_sees_a_blocked_loop() -> None:
    lag = LoopLag(interval=0.01)
    probe = asyncio.ensure_future(lag.run())
    await asyncio.sleep(0)  # one turn: the probe starts and arms its timer
    time.sleep(0.3)  # the stall under test: the loop blocked for 0.3 s
    await async_wait_until(lambda: lag.peak > 0.2, 2, message="the stall measured")
    probe.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await probe


def test_a_lagging_loop_refuses_new_sessions_with_a_retry_hint() -> None:
    servicer = ControllerServicer(table(FakeClock()), max_op_volume=1, shed_loop_lag=0.5)
    servicer.lag.sample(0.4)
    servicer.admit("h")
    servicer.lag.sample(0.6)
    with pytest.raises(
        LimitError, match=r"event-loop lag 0\.60 s > shed_loop_lag = 0\.5 s"
    ) as info:
        servicer.admit("h")
    assert info.value.retry
    off = ControllerServicer(table(FakeClock()), max_op_volume=1, shed_loop_lag=0)
    off.lag.sample(30.0)
    off.admit("h")  # 0: never refused for lag


def test_expiry_forgives_the_controllers_own_lag() -> None:
    clock = FakeClock()
    t = table(clock)  # heartbeat_timeout 3 s
    s = t.open_session(meta("a"), "c", "h")
    clock.now += 3.5
    assert t.expire(grace=1.0) == []
    assert t.expire() == [s]


async def test_a_graceful_end_first_tells_what_is_queued() -> None:
    stream = StreamOutbox(max_notices=2)
    for i in range(5):
        stream.error(grpc.StatusCode.NOT_FOUND, "op_completed.op_id", f"operation {i} is not open")
    stream.end()  # the client half-closed: OK
    told = [await stream.next() for _ in range(3)]
    assert [m.error.code for m in told if m is not None] == [
        "NOT_FOUND",
        "NOT_FOUND",
        "RESOURCE_EXHAUSTED",
    ]
    assert told[2] is not None and told[2].error.message.startswith("3 more error notices dropped")
    assert await stream.next() is None


async def test_an_abort_drops_what_is_queued() -> None:
    stream = StreamOutbox(max_notices=2)
    stream.error(grpc.StatusCode.NOT_FOUND, "op_completed.op_id", "operation 1 is not open")
    stream.end(grpc.StatusCode.INVALID_ARGUMENT, "usage.bytes: must be >= 0")
    assert await stream.next() is None
