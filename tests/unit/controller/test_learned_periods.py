"""The job table learns a job's period from its phases (``JobState.phases``) and lists it in
the view once confident; a declared period wins (``JobTable.periodic_of``)."""

from __future__ import annotations

import math

import pytest
from support.clock import FakeClock

from burstctl.controller.jobs import JobTable, ProtocolError
from burstctl.controller.messages import check_op_completed
from burstctl.controller.records import Counters, JobMeta, OpKind, SessionRecord
from burstctl.policies.periods import MIN_SAMPLES, Phase
from burstctl.policies.view import Periodic
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

MiB = 1 << 20


def table_of(clock: FakeClock) -> JobTable:
    return JobTable(clock, heartbeat_timeout=60.0, job_retention=60.0, demand_headroom=1.1)


def iterate(
    table: JobTable, s: SessionRecord, clock: FakeClock, n: int, w: float, vol: int, op: int
) -> int:
    """``n`` iterations of "compute w, then one operation moving vol bytes in 0.1 s"."""
    for _ in range(n):
        clock.now += w
        op += 1
        table.post(s, op, OpKind.WRITE, vol)
        clock.now += 0.1
        total = s.job.counters.bytes + vol
        table.usage(s, vol, 1, 0.0, 0.1, False, totals=Counters(bytes=total, ops=op))
        table.complete(s, op)
    return op


def test_a_job_that_declares_nothing_is_learned_and_listed_once_confident() -> None:
    clock = FakeClock()
    table = table_of(clock)
    phases: list[Phase] = []
    table.phase_ended.connect(lambda job, phase: phases.append(phase))
    s = table.open_session(JobMeta("j", "u", "g", 2, 1.0), "c", "h")
    op = iterate(table, s, clock, MIN_SAMPLES, 0.3, 4 * MiB, 0)  # the first gives no sample
    assert table.periodic_of(s.job) is None
    assert "j" not in table.view(40 * MiB, 8 * MiB).periodic
    iterate(table, s, clock, 1, 0.3, 4 * MiB, op)
    learned = table.periodic_of(s.job)
    assert learned is not None and learned.learned and learned.confidence > 0.6
    assert (learned.nodes, learned.vol_io) == (2, 4 * MiB) and abs(learned.w - 0.3) < 1e-9
    assert table.view(40 * MiB, 8 * MiB).periodic["j"] == learned
    # one observation of each phase, fed to the profiles and the estimator alike
    assert len(phases) == MIN_SAMPLES + 1 and phases[0].gap is None
    assert all(p.volume == 4 * MiB and abs(p.seconds - 0.1) < 1e-9 for p in phases)


def test_a_declared_period_wins_over_a_learned_one() -> None:
    clock = FakeClock()
    table = table_of(clock)
    s = table.open_session(JobMeta("j", "u", "g", 2, 1.0, w=1.0, vol_io=float(MiB)), "c", "h")
    iterate(table, s, clock, 2 * MIN_SAMPLES, 0.3, 4 * MiB, 0)
    assert s.job.phases.estimate is not None and s.job.phases.estimate.confident
    assert table.periodic_of(s.job) == Periodic(2, 1.0, float(MiB))
    assert table.view(40 * MiB, 8 * MiB).periodic["j"] == Periodic(2, 1.0, float(MiB))


def test_a_phase_ends_at_its_last_reported_byte() -> None:
    """An implicit operation completes a quiet gap after its last byte: the report that carried
    that byte ends the phase, so the learned compute time is not short by the quiet gap."""
    clock = FakeClock()
    table = table_of(clock)
    s = table.open_session(JobMeta("j", "u", "g", 1, 1.0), "c", "h")
    total = 0
    for op in range(1, MIN_SAMPLES + 2):
        clock.now += 0.5
        table.post(s, op, OpKind.WRITE, 0)
        clock.now += 0.2
        total += MiB
        table.usage(s, MiB, 1, 0.0, 0.2, False, totals=Counters(bytes=total, ops=op))
        clock.now += 0.1  # the quiet gap
        table.usage(s, 0, 0, 0.0, 0.1, False, totals=Counters(bytes=total, ops=op))
        table.complete(s, op)
    learned = table.periodic_of(s.job)
    assert learned is not None and abs(learned.w - 0.6) < 1e-9  # 0.5 + the quiet gap
    assert learned.vol_io == MiB


def test_a_quiet_gap_the_client_tells_is_taken_off_the_phase_end() -> None:
    clock = FakeClock()
    table = table_of(clock)
    ended: list[Phase] = []
    table.phase_ended.connect(lambda job, phase: ended.append(phase))
    s = table.open_session(JobMeta("j", "u", "g", 1, 1.0), "c", "h")
    table.post(s, 1, OpKind.WRITE, 0)
    clock.now += 0.3
    table.usage(s, MiB, 1, 0.0, 0.3, False, totals=Counters(bytes=MiB, ops=1))
    clock.now += 0.1
    table.complete(s, 1, quiet=0.15)  # the last byte was 0.05 s before the report
    assert ended[-1].end == pytest.approx(clock.now - 0.15)
    table.post(s, 2, OpKind.WRITE, 0)
    clock.now += 0.1
    table.complete(s, 2, quiet=5.0)  # longer than the phase: it ends where it started
    assert ended[-1].end == ended[-1].start


@pytest.mark.parametrize("quiet", [-0.1, math.inf, math.nan, 1e6])
def test_a_bad_quiet_gap_is_a_protocol_error_naming_the_field(quiet: float) -> None:
    with pytest.raises(ProtocolError) as err:
        check_op_completed(pb.OpCompleted(op_id=1, quiet_seconds=quiet), "")
    assert err.value.field == "op_completed.quiet_seconds"
    assert check_op_completed(pb.OpCompleted(op_id=1, quiet_seconds=0.1), "") == 0.1
