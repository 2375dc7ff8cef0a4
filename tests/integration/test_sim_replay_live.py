"""The live replay: a Darshan log's jobs driven as client sessions against a real controller
(``burstctl sim replay --live``), their yields beside the simulator's on the same window."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import pytest

from burstctl.cli.sim.replay_live import (
    controller_env,
    controller_flags,
    replay_live,
    side_by_side,
    tolerance,
)
from burstctl.simulator.replay.darshan import read_log
from burstctl.simulator.replay.mapping import replay_jobs
from burstctl.simulator.replay.runs import run_policies

pytestmark = pytest.mark.integration

pytest.importorskip("darshan", reason="PyDarshan is the sim extra's")
INPUT = Path(str(importlib.resources.files("darshan") / "tests" / "input"))
B_LIVE = 64 << 20
LIVE_SECONDS = 8.0


# The yields come from rates over the whole replay: alone, not beside other tests.
@pytest.mark.serial
def test_live_yields_are_the_simulators_within_the_derived_tolerance(
    controller_factory: Any,
) -> None:
    # Three copies of one log half a second apart: they contend for B in every I/O phase.
    log = read_log(INPUT / "sample-goodost.darshan")
    replay = replay_jobs([log] * 3, bins=5, stagger=0.5)
    (simulated,) = run_policies(replay, ["fair-share"])
    ctl = controller_factory(
        "--policy", "fair-share", *controller_flags(replay, B_LIVE), env=controller_env(replay)
    )
    scale = replay.window.horizon / LIVE_SECONDS
    live = replay_live(replay, ctl.address, B_LIVE, scale)
    rows = side_by_side(replay, simulated.yields, live, scale)
    tol = tolerance(replay, scale)
    assert tol < 0.2  # (18 phase events of at most 80 ms each over 8 s)
    assert [r["job"] for r in rows] == ["sample-goodost", "sample-goodost#2", "sample-goodost#3"]
    for row in rows:
        assert abs(float(row["difference"])) <= tol, rows
    assert all(float(r["simulated"]) < 0.9 for r in rows), rows  # they did contend
