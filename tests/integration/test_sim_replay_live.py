"""The live replay: a Darshan log's jobs driven as client sessions against a real controller
by ``burstctl sim replay --live``, their yields beside the simulator's on the same window."""

from __future__ import annotations

import importlib.resources
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from support.cli import invoke

from burstctl.cli.sim.replay_live import tolerance
from burstctl.simulator.replay.darshan import read_log
from burstctl.simulator.replay.mapping import replay_jobs

pytestmark = pytest.mark.integration

pytest.importorskip("darshan", reason="PyDarshan is the sim extra's")
INPUT = Path(str(importlib.resources.files("darshan") / "tests" / "input"))
LIVE_SECONDS = 8.0


# The yields come from rates over the whole replay: alone, not beside other tests.
@pytest.mark.serial
def test_live_yields_are_the_simulators_within_the_derived_tolerance(
    controller_factory: Any,
) -> None:
    # Three copies of one log half a second apart: they contend for B in every I/O phase.
    log = INPUT / "sample-goodost.darshan"
    replay_args = [log, log, log, "--bins", "5", "--stagger", "0.5", "--policy", "fair-share"]
    printed = invoke("sim", "replay", *replay_args, "--controller-flags")
    assert printed.exit_code == 0, printed.stderr
    env, (command, *flags) = {}, shlex.split(printed.stdout)
    while "=" in command:
        name, _, value = command.partition("=")
        env[name] = value
        command, *flags = flags
    assert command == "burstctl" and flags[0] == "controller"
    assert env == {"BURSTCTL_MAX_UNREGISTERED_NODES": "64"}  # (48 ranks: the default admits)
    ctl = controller_factory(*flags[1:], env=env)

    replay = replay_jobs([read_log(log)] * 3, bins=5, stagger=0.5)
    scale = replay.window.horizon / LIVE_SECONDS
    done = invoke(
        "sim", "replay", *replay_args, "--live", ctl.address, "--time-scale", repr(scale),
        "--format", "json",
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    rows = json.loads(done.stdout)["jobs"]
    tol = tolerance(replay, scale)
    assert tol < 0.2  # (2 × 9 I/O phases × 80 ms over 8 s)
    assert [r["job"] for r in rows] == ["sample-goodost", "sample-goodost#2", "sample-goodost#3"]
    for row in rows:
        assert row["tolerance"] == pytest.approx(tol)
        assert abs(row["live"] - row["simulated"]) <= tol, rows
    assert all(r["simulated"] < 0.9 for r in rows), rows  # they did contend


def test_live_replays_one_policy() -> None:
    log = INPUT / "sample-goodost.darshan"
    for policies in ([], ["fair-share", "fcfs"]):
        chosen = [arg for name in policies for arg in ("--policy", name)]
        done = invoke("sim", "replay", log, *chosen, "--live", "127.0.0.1:1")
        assert done.exit_code == 2
        assert "give exactly one --policy" in done.stderr
