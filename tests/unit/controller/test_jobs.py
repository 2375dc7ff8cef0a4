"""Job table: lifecycle, phases, yield inputs, demand estimation, incremental views."""

from __future__ import annotations

import pytest
from support.clock import FakeClock

from burstctl.controller.jobs import JobTable, ProtocolError
from burstctl.controller.records import JobMeta, JobStatus, OpKind

MiB = float(1 << 20)
B, b = 40 * MiB, 8 * MiB


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def table(clock: FakeClock) -> JobTable:
    return JobTable(clock, heartbeat_timeout=3.0, job_retention=10.0, demand_headroom=1.1)


def meta(job_id: str = "j", nodes: int = 1) -> JobMeta:
    return JobMeta(job_id=job_id, user="u", group="g", nodes=nodes, priority=1.0)


def test_job_appears_with_first_hello_and_is_idle_without_ops(table: JobTable) -> None:
    table.open_session(meta(), "c", "h")
    assert table.jobs["j"].status is JobStatus.ACTIVE
    assert table.view(B, b).jobs == {}  # not in S(t) until it posts


def test_post_puts_job_in_S_with_cap_demand(table: JobTable, clock: FakeClock) -> None:
    s = table.open_session(meta(nodes=4), "c", "h")
    clock.now += 1
    table.post(s, 1, OpKind.WRITE, 10 * int(MiB))
    row = table.view(B, b).jobs["j"]
    assert row.cap == 32 * MiB and row.demand == 32 * MiB  # b_i = min(4·8, 40)
    assert row.posted_at == 101.0 and row.volume == 10 * MiB and row.remaining == 10 * MiB


def test_remaining_volume_follows_usage(table: JobTable, clock: FakeClock) -> None:
    s = table.open_session(meta(), "c", "h")
    table.post(s, 1, OpKind.WRITE, 10 * int(MiB))
    clock.now += 1
    table.usage(s, 4 * int(MiB), 64, 0.9, 1.0, True)
    row = table.view(B, b).jobs["j"]
    assert row.remaining == 6 * MiB and row.moved == 4 * MiB
    assert row.progress == pytest.approx(0.5)  # 4 MiB at b_i = 8 MiB/s: 0.5 s of I/O done


def test_unknown_volume_has_no_remaining(table: JobTable) -> None:
    s = table.open_session(meta(), "c", "h")
    table.post(s, 1, OpKind.READ, 0)
    assert table.view(B, b).jobs["j"].remaining is None


def test_duplicate_op_id_is_a_protocol_error(table: JobTable) -> None:
    s = table.open_session(meta(), "c", "h")
    table.post(s, 7, OpKind.READ, 0)
    with pytest.raises(ProtocolError) as info:
        table.post(s, 7, OpKind.READ, 0)
    assert info.value.field == "op_posted.op_id"


def test_satisfied_job_demand_is_measured_rate_with_headroom(
    table: JobTable, clock: FakeClock
) -> None:
    s = table.open_session(meta(), "c", "h")
    table.post(s, 1, OpKind.WRITE, 0)
    clock.now += 0.25
    table.usage(s, int(1.25 * MiB), 20, 0.0, 0.25, False)  # 5 MiB/s, never waited
    assert table.view(B, b).jobs["j"].demand == pytest.approx(5.5 * MiB)
    # it starts waiting: it wants what it may get again (b_i)
    table.usage(s, int(1.25 * MiB), 20, 0.1, 0.25, True)
    assert table.view(B, b).jobs["j"].demand == b


def test_rate_drifting_in_small_steps_still_asks_for_a_decision(clock: FakeClock) -> None:
    """Each report moves the EWMA by less than 10 %, but once the drift adds up to
    more than 10 % of the rate the last decision used, the table asks for a new one."""
    calls: list[int] = []
    table = JobTable(
        clock,
        heartbeat_timeout=3.0,
        job_retention=10.0,
        demand_headroom=1.1,
    )
    table.changed.connect(lambda: calls.append(1))
    s = table.open_session(meta(), "c", "h")
    table.post(s, 1, OpKind.WRITE, 0)
    table.usage(s, int(6 * MiB), 1, 0.0, 1.0, False)  # first report: 6 MiB/s
    calls.clear()
    for _ in range(3):  # 5 MiB/s from now on: the EWMA goes 5.5, 5.25, 5.125 MiB/s
        clock.now += 1
        table.usage(s, int(5 * MiB), 1, 0.0, 1.0, False)
    assert len(calls) == 1  # at 5.25: 12.5 % below the 6 the last decision used
    assert table.view(B, b).jobs["j"].demand == pytest.approx(1.1 * 5.125 * MiB)


def test_demand_summed_over_sessions_and_capped(table: JobTable) -> None:
    s1 = table.open_session(meta(nodes=2), "c1", "h")
    s2 = table.open_session(meta(nodes=2), "c2", "h")
    table.post(s1, 1, OpKind.WRITE, 0)
    table.post(s2, 1, OpKind.WRITE, 0)
    table.usage(s1, int(MiB), 1, 0.0, 1.0, False)
    table.usage(s2, int(2 * MiB), 1, 0.0, 1.0, False)
    assert table.view(B, b).jobs["j"].demand == pytest.approx(3.3 * MiB)
    table.usage(s2, int(2 * MiB), 1, 0.5, 1.0, False)  # waited half the interval
    assert table.view(B, b).jobs["j"].demand == 16 * MiB  # capped at b_i


def test_phases_and_yield_inputs(table: JobTable, clock: FakeClock) -> None:
    s = table.open_session(meta(), "c", "h")  # τ_i = 100
    clock.now = 104.0
    table.post(s, 1, OpKind.WRITE, 0)  # computed 4 s
    clock.now = 106.0
    table.usage(s, int(16 * MiB), 1, 0.0, 2.0, True)
    table.complete(s, 1)  # 2 s of I/O
    job = table.jobs["j"]
    assert job.io_seconds(clock.now) == 2.0 and job.work_done(clock.now) == 4.0
    clock.now = 110.0
    table.post(s, 2, OpKind.WRITE, 0)
    row = table.view(B, b).jobs["j"]
    # P = W_done + V_transferred / b_i = 8 + 16 MiB / 8 MiB/s; y = P / (110 − 100), eq. (6)
    assert row.progress == pytest.approx(10.0)
    assert row.yield_at(clock.now) == pytest.approx(1.0)
    assert row.last_work == 4.0  # 106 → 110 between the two I/O phases
    assert row.mean_volume == 16 * MiB  # the first op declared no volume: its moved bytes count


def test_heartbeat_timeout_then_retention(table: JobTable, clock: FakeClock) -> None:
    s = table.open_session(meta(), "c", "h")
    table.post(s, 1, OpKind.WRITE, 0)
    clock.now += 2.9
    assert table.expire() == []
    clock.now += 0.2
    assert table.expire() == [s]
    assert table.jobs["j"].status is JobStatus.INACTIVE and "j" not in table.view(B, b).jobs
    clock.now += 9.9
    table.expire()
    assert "j" in table.jobs
    clock.now += 0.2
    table.expire()
    assert "j" not in table.jobs


def test_retention_drops_jobs_in_the_order_they_went_inactive(
    table: JobTable, clock: FakeClock
) -> None:
    # expire() walks the inactive jobs oldest first and stops at the first one still
    # retained, so a job that came back in between must not be dropped with the others.
    first = table.open_session(meta("a"), "c", "h")
    second = table.open_session(meta("b"), "c", "h")
    table.close_session(first)
    clock.now += 4
    table.close_session(second)
    back = table.open_session(meta("a"), "c", "h")  # a returns, then leaves again later
    clock.now += 1
    table.close_session(back)
    clock.now += 5.5  # b inactive for 6.5 s, a for 5.5 s
    table.expire()
    assert set(table.jobs) == {"a", "b"}
    clock.now += 4
    table.expire()
    assert set(table.jobs) == {"a"}  # b went inactive 10.5 s ago, a only 9.5 s ago
    clock.now += 1
    table.expire()
    assert table.jobs == {}


def test_returning_session_reactivates_job(table: JobTable, clock: FakeClock) -> None:
    s = table.open_session(meta(), "c", "h")
    table.close_session(s)
    assert table.jobs["j"].status is JobStatus.INACTIVE
    table.open_session(meta(), "c", "h")
    assert table.jobs["j"].status is JobStatus.ACTIVE


def test_events_ask_for_a_decision(clock: FakeClock) -> None:
    calls = []
    table = JobTable(
        clock,
        heartbeat_timeout=3,
        job_retention=10,
        demand_headroom=1.1,
    )
    table.changed.connect(lambda: calls.append(1))
    s = table.open_session(meta(), "c", "h")
    table.post(s, 1, OpKind.WRITE, 0)
    table.complete(s, 1)
    assert len(calls) == 3
    table.complete(s, 99)  # unknown op: nothing changes
    assert len(calls) == 3


def test_bytes_attributed_oldest_operation_first(table: JobTable) -> None:
    s = table.open_session(meta(), "c", "h")
    table.post(s, 1, OpKind.WRITE, 100)
    table.post(s, 2, OpKind.WRITE, 100)
    table.usage(s, 150, 2, 0.0, 1.0, True)
    assert (s.ops[1].moved, s.ops[2].moved) == (100, 50)
    assert table.view(B, b).jobs["j"].remaining == 50.0


def test_later_session_cannot_raise_the_jobs_weight(table: JobTable) -> None:
    table.open_session(meta(nodes=1), "c1", "h")
    table.open_session(meta(nodes=64), "c2", "h")  # claims more nodes: the smaller claim holds
    assert table.jobs["j"].meta.nodes == 1


def test_a_claim_binds_only_while_its_session_lives(table: JobTable) -> None:
    # Issue 15, finding 3: a Hello claiming 2^20 nodes stuck to the job for job_retention and
    # bound the honest sessions that came after it.
    greedy = table.open_session(meta(nodes=1 << 20), "c1", "h")
    table.close_session(greedy)
    honest = table.open_session(meta(nodes=2), "c2", "h")
    assert table.jobs["j"].meta.nodes == 2
    # While a greedy claim lives beside an honest one, the honest (smaller) one holds, and the
    # job keeps it when the greedy session leaves.
    greedy = table.open_session(meta(nodes=1 << 20), "c3", "h")
    assert table.jobs["j"].meta.nodes == 2
    table.close_session(honest)
    assert table.jobs["j"].meta.nodes == 1 << 20  # only the greedy claim is left
    table.close_session(greedy)
    table.open_session(meta(nodes=3), "c4", "h")
    assert table.jobs["j"].meta.nodes == 3


def test_a_registration_outranks_every_claim(table: JobTable) -> None:
    table.register(JobMeta("j", "u", "g", nodes=8, priority=2.0))
    table.open_session(meta(nodes=1), "c1", "h")
    assert (table.jobs["j"].meta.nodes, table.jobs["j"].meta.priority) == (8, 2.0)
