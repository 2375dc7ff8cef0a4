"""A session striped over advised replicas (docs/client.md, "Placement advice") gets the sum
of its streams' rates: each acquire takes its even share from every stream at once.

Two controller processes, each allotting the job 8 MiB/s; the session follows advice naming
both and acquires 4 MiB at a time, far more than a bucket's depth (rate × burst window), so
shares taken one stream after the other would reach only about 9 MiB/s in all.
"""

from __future__ import annotations

from typing import Any

import pytest
from support import Pump, measure

from burstctl.client import JobInfo, Session

pytestmark = pytest.mark.integration

MiB = 1 << 20


def test_a_striped_session_gets_the_sum_of_its_streams_rates(controller_factory: Any) -> None:
    args = ("--capacity", "8MiB/s", "--node-bandwidth", "8MiB/s")
    a, b = controller_factory(*args), controller_factory(*args)
    session = Session(
        a.address,
        JobInfo("striped", "alice", "physics", 1),
        replicas=[a.address, b.address],
        follow_advice=True,
    )
    pump = None
    try:
        assert session.targets == [a.address, b.address]
        assert session.wait_attached(10)
        pump = Pump(session, chunk=4 * MiB).start()
        measure([pump], 1.0)  # the first phase's posts and first allocations (a workload)
        (rate,) = measure([pump], 4.0)
        assert not pump.errors
        print(f"striped over 2 replicas: {rate / MiB:.2f} MiB/s of 16")
        assert rate == pytest.approx(16 * MiB, rel=0.08)
    finally:
        if pump is not None:
            pump.stop()
        session.close()
