"""Set-10 and DeficitCom read a job's period from ``SystemView.periodic`` (declared, or learned
by the controller from its phases) instead of learning it per operation; without periodic jobs
they decide as before."""

from __future__ import annotations

import pytest

from burstctl.policies.deficit_com import DeficitCom
from burstctl.policies.io_sets import Set10
from burstctl.policies.view import JobView, Periodic, SystemView


def row(job_id: str, index: int, posted_at: float) -> JobView:
    return JobView(job_id, "u", "g", 1, 1.0, 1.0, 1.0, posted_at, 1.0, 1.0, index=index)


def view(periodic: dict[str, Periodic]) -> SystemView:
    jobs = {"a": row("a", 0, 0.0), "b": row("b", 1, 1.0)}
    return SystemView(2.0, 1.0, 1.0, jobs=jobs, periodic=periodic)


def test_set10_puts_a_periodic_job_in_the_set_of_its_period() -> None:
    # without periods both jobs are new (one set): FCFS, a posted first takes all of B
    assert dict(Set10().allocate(view({}))) == {0: 1.0}
    # a's period: ω = w + vol_io/b_i = 99 + 1 = 100 s, set 2 (q = 0.01); b new, set −2 (q = 100)
    rates = dict(Set10().allocate(view({"a": Periodic(1, 99.0, 1.0, learned=True)})))
    assert rates[0] == pytest.approx(0.01 / 100.01) and rates[1] == pytest.approx(100 / 100.01)


def test_deficit_com_takes_the_io_fraction_of_a_periodic_job_from_its_period() -> None:
    policy = DeficitCom()
    policy.allocate(view({"a": Periodic(1, 3.0, 1.0, learned=True, confidence=0.9)}))
    assert policy.fraction("a") == pytest.approx(1.0 / (3.0 + 1.0))  # (vol_io/b_i) / T
    assert policy.fraction("b") is None  # first operation: nothing learned yet
    # a period that changes moves the job's fraction
    policy.allocate(view({"a": Periodic(1, 1.0, 1.0)}))
    assert policy.fraction("a") == pytest.approx(0.5)
