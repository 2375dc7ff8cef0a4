"""The ``deficit-com`` policy, live: the checks every bandwidth-sharing strategy passes.

A real controller (capacity B = 20 MiB/s, b = 8 MiB/s per node) and real client sessions on
loopback, every job on one node (b_i = 8 MiB/s):

- opportunity fairness: two flat-out jobs and one that only wants 3 MiB/s fit in B, so each
  gets what it can use (8, 8 and its 3), whatever order the policy serves them in;
- Σ rates ≤ B: a third flat-out job makes the demand exceed B; the controller allots exactly
  B in all, no job above b_i, and the jobs move B between them;
- switch under load: to fair-share and back, B in all each time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from support import Pump, measure_windows, wait_until

from burstctl.client import JobInfo, Session

pytestmark = pytest.mark.integration

MiB = 1 << 20
B = 20 * MiB
CAP = 8 * MiB
WITHIN = 0.08


# The pumps' rates are measured over windows of 3-4 s against 8 %: alone, not beside other
# tests, and over a second window when one fell short in the first (a CI run with one core
# busy measured a flat-out pump at 80 % of its allotment, another at 84 % with none busy).
def short(got: list[float], want: list[float], within: list[float]) -> bool:
    return any(g < w * (1 - r) for g, w, r in zip(got, want, within, strict=True))


def above(got: list[float], want: list[float], within: list[float]) -> bool:
    return any(g > w * (1 + r) for g, w, r in zip(got, want, within, strict=True))


def in_all(pumps: list[Pump], seconds: float) -> float:
    """The pumps' total over the last window ``measure_windows`` took, none above B."""
    totals = [
        sum(got) for got in measure_windows(pumps, seconds, lambda g: sum(g) < B * (1 - WITHIN))
    ]
    assert all(x <= B * (1 + WITHIN) for x in totals), totals
    return totals[-1]


@pytest.mark.serial
def test_deficit_com_shares_by_opportunity_keeps_to_B_and_switches(
    controller_factory: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    ctl = controller_factory(
        "--policy", "deficit-com", "--capacity", "20MiB/s", "--node-bandwidth", "8MiB/s",
        state_dir=state,
    )  # fmt: skip
    assert ctl.url is not None
    auth = {"Authorization": "Bearer " + (state / "admin-token").read_text().strip()}
    names = ["flat-0", "flat-1", "paced", "flat-2"]
    sessions = [Session(ctl.address, JobInfo(n, "alice", "physics", 1)) for n in names]
    pumps: list[Pump] = []

    def rates() -> dict[str, float]:
        jobs = httpx.get(f"{ctl.url}/v1/jobs", timeout=5).json()
        return {j["job_id"]: float(j["rate"]) for j in jobs if j["job_id"] in names}

    def allotted_in_all(total: float) -> None:
        wait_until(
            lambda: abs(sum(rates().values()) - total) <= 0.01 * total,
            10,
            message=f"{total / MiB:.0f} MiB/s allotted in all",
        )

    try:
        assert all(s.wait_attached(10) for s in sessions)
        assert httpx.get(f"{ctl.url}/v1/policy", timeout=5).json()["name"] == "deficit-com"
        pumps = [
            Pump(sessions[0]).start(),
            Pump(sessions[1]).start(),
            Pump(sessions[2], chunk=16 * 1024, pace=3 * MiB).start(),
        ]
        wait_until(
            lambda: (
                rates().get("flat-0", 0) >= CAP * 0.99 and rates().get("flat-1", 0) >= CAP * 0.99
            ),
            10,
            message="both flat-out jobs at their cap",
        )
        want = [CAP, CAP, 3 * MiB]
        within = [WITHIN, WITHIN, 0.05]
        flat = measure_windows(pumps, 4.0, lambda got: short(got, want, within))
        assert all(not above(got, want, within) for got in flat), flat
        flat0, flat1, paced = flat[-1]
        assert paced == pytest.approx(3 * MiB, rel=0.05), paced / MiB
        assert flat0 == pytest.approx(CAP, rel=WITHIN), flat0 / MiB
        assert flat1 == pytest.approx(CAP, rel=WITHIN), flat1 / MiB

        pumps.append(Pump(sessions[3]).start())  # demand 3·8 + 3 > B
        allotted_in_all(B)
        assert all(r <= CAP * (1 + 1e-9) for r in rates().values()), rates()
        loaded = in_all(pumps, 4.0)
        assert loaded == pytest.approx(B, rel=WITHIN), loaded / MiB

        switched = httpx.put(
            f"{ctl.url}/v1/policy", json={"name": "fair-share"}, headers=auth, timeout=10
        )
        assert switched.status_code == 200, switched.text
        allotted_in_all(B)
        fair = in_all(pumps, 3.0)
        assert fair == pytest.approx(B, rel=WITHIN), fair / MiB
        back = httpx.put(
            f"{ctl.url}/v1/policy", json={"name": "deficit-com"}, headers=auth, timeout=10
        )
        assert back.status_code == 200, back.text
        wait_until(
            lambda: httpx.get(f"{ctl.url}/v1/policy", timeout=5).json()["name"] == "deficit-com",
            10,
            message="deficit-com active again",
        )
        allotted_in_all(B)
        again = in_all(pumps, 3.0)
        assert again == pytest.approx(B, rel=WITHIN), again / MiB
        assert not any(p.errors for p in pumps)
        print(
            f"deficit-com: flat {flat0 / MiB:.2f} {flat1 / MiB:.2f} paced {paced / MiB:.2f} "
            f"MiB/s; loaded {loaded / MiB:.2f}, fair-share {fair / MiB:.2f}, "
            f"again {again / MiB:.2f}"
        )
    finally:
        for p in pumps:
            p.stop()
        for s in sessions:
            s.close()
