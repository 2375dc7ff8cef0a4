"""The ``dpsac`` policy, live: a real controller with a burst buffer and real client sessions.

Three jobs with equal declared periods (one cluster, U = 1), caps b_i = 8 MiB/s, a buffer of
S = 64 MiB draining at B = 12 MiB/s, the buffer's bandwidth 32 MiB/s. Every job acquires flat
out. Algorithm 3 ([DPSAC] §4.4.3, docs/dpsac.md) with Δ = 1 s:

- buffer empty (every job reports 0 resident): Σ B_i = 24 > B, so the first job fits the PFS
  share, the second (the m-th) is admitted with probability 1 − P_full = 1 and its excess goes
  to the buffer, the third with P_full·(1 − P_full) = 0: 16 MiB/s in all;
- buffer full (the jobs report S between them): admitting the m-th would overflow the
  partition (line 15), so it only gets what is left of the PFS share: 12 MiB/s in all, what
  drains;
- the policy is switched like any other: to fair-share under load (24 MiB/s: every cap) and
  back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from support import Pump, measure, wait_until

from burstctl.client import JobInfo, Session

pytestmark = pytest.mark.integration

MiB = 1 << 20
S = 64 * MiB
WITHIN = 0.08


def test_dpsac_admits_by_the_buffers_fill_and_switches_like_any_policy(
    controller_factory: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    ctl = controller_factory(
        "--policy", "dpsac", "--capacity", "32MiB/s", "--node-bandwidth", "8MiB/s",
        "--bb-capacity", "64MiB", "--pfs-bandwidth", "12MiB/s",
        state_dir=state,
    )  # fmt: skip
    assert ctl.url is not None
    auth = {"Authorization": "Bearer " + (state / "admin-token").read_text().strip()}
    names = ["ckpt-0", "ckpt-1", "ckpt-2"]
    sessions = [
        Session(
            ctl.address,
            JobInfo(n, "alice", "physics", 1, w=99.0, vol_io=8 * MiB),  # l_i = 1 s, P_i = 0.01
            buffer=True,
            report_interval=0.1,
            client_id=f"mount-{n}",
        )
        for n in names
    ]
    pumps: list[Pump] = []
    try:
        assert all(s.wait_attached(10) for s in sessions)
        for s in sessions:
            s.report_buffer(0, 0)
        pumps = [Pump(s, chunk=256 * 1024).start() for s in sessions]

        def aggregate(seconds: float = 3.0) -> float:
            return sum(measure(pumps, seconds))

        def allotted(total: float) -> None:
            """Waits until the controller allots ``total`` bytes/s to the three jobs."""

            def now() -> float:
                jobs = httpx.get(f"{ctl.url}/v1/jobs", timeout=5).json()
                return float(sum(j["rate"] for j in jobs if j["job_id"] in names))

            wait_until(
                lambda: abs(now() - total) <= 0.01 * total,
                10,
                message=f"{total / MiB:.0f} MiB/s allotted in all",
            )

        assert httpx.get(f"{ctl.url}/v1/policy", timeout=5).json()["name"] == "dpsac"
        allotted(16 * MiB)
        empty = aggregate()
        assert empty == pytest.approx(16 * MiB, rel=WITHIN), empty / MiB

        for s in sessions:  # the buffer fills: S between the three jobs
            s.report_buffer(S // 3 + 1, S // 3 + 1)
        wait_until(
            lambda: httpx.get(f"{ctl.url}/v1/capacity", timeout=5).json()["resident"] >= S,
            10,
            message="the full buffer in the controller's books",
        )
        allotted(12 * MiB)
        full = aggregate()
        assert full == pytest.approx(12 * MiB, rel=WITHIN), full / MiB

        switched = httpx.put(
            f"{ctl.url}/v1/policy", json={"name": "fair-share"}, headers=auth, timeout=10
        )
        assert switched.status_code == 200, switched.text
        allotted(24 * MiB)
        fair = aggregate()
        assert fair == pytest.approx(24 * MiB, rel=WITHIN), fair / MiB
        back = httpx.put(f"{ctl.url}/v1/policy", json={"name": "dpsac"}, headers=auth, timeout=10)
        assert back.status_code == 200, back.text
        allotted(12 * MiB)
        again = aggregate()
        assert again == pytest.approx(12 * MiB, rel=WITHIN), again / MiB
        assert not any(p.errors for p in pumps)
        print(
            f"dpsac: empty buffer {empty / MiB:.2f} MiB/s, full {full / MiB:.2f}, "
            f"fair-share {fair / MiB:.2f}, dpsac again {again / MiB:.2f}"
        )
    finally:
        for p in pumps:
            p.stop()
        for s in sessions:
            s.close()
