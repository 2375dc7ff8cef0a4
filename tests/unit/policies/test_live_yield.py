"""``JobAccount``: work and I/O time, P_i and the live yield of eq. (6)."""

from __future__ import annotations

import pytest

from burstctl.policies.accounting import JobAccount


def test_yield_is_work_plus_bytes_over_cap_by_elapsed_time() -> None:
    a = JobAccount(first_seen=0.0, index=0)
    assert a.live_yield(0.0, 10.0) is None  # no time has passed
    a.set_phase(True, 2.0)  # 2 s of work, then I/O
    a.transfer(10)  # 1 s of it at b_i = 10 B/s
    a.set_phase(False, 4.0)  # the phase took 2 s: half the rate
    assert a.work_done(4.0) == 2.0
    assert a.live_yield(4.0, 10.0) == pytest.approx(3.0 / 4.0)
    assert a.live_yield(6.0, 10.0) == pytest.approx(5.0 / 6.0)  # work again


def test_a_phase_measured_short_does_not_give_a_yield_above_one() -> None:
    # A phase's start reached the controller late: the bytes it saw took 0.5 s at b_i,
    # the phase it measured 0.4 s. The model's bound holds.
    a = JobAccount(first_seen=0.0, index=0)
    a.set_phase(True, 1.0)
    a.transfer(5)
    a.set_phase(False, 1.4)
    assert a.progress(1.4, 10.0) == pytest.approx(1.5)
    assert a.live_yield(1.4, 10.0) == 1.0
