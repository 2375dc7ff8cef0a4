"""``burstctl sim replay`` through the command line: every Darshan log the ``darshan`` wheel
ships, and files that are not Darshan logs."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest
from support import run_burstctl
from support.cli import invoke

pytestmark = pytest.mark.integration

pytest.importorskip("darshan", reason="PyDarshan is the sim extra's")
INPUT = Path(str(importlib.resources.files("darshan") / "tests" / "input"))
LOGS = sorted(INPUT.glob("*.darshan"))


def test_the_wheel_ships_the_logs_the_replay_is_run_on() -> None:
    assert {p.name for p in LOGS} >= {
        "sample.darshan",
        "sample-badost.darshan",
        "sample-dxt-simple.darshan",
        "sample-goodost.darshan",
        "noposix.darshan",
        "noposixopens.darshan",
    }


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_every_policy_replays_every_log(log: Path) -> None:
    from burstctl.policies.registry import default_registry

    done = invoke("sim", "replay", log)
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].split()[0] == log.name.removesuffix(".darshan")
    rows = {line.split()[0]: line.split()[1:] for line in lines[5:]}
    assert set(rows) == set(default_registry().names())
    for cells in rows.values():  # one job: its yield, then min yield, efficiency, utilization
        assert len(cells) == 4 and 0 < float(cells[0]) <= 1.0 + 1e-9


def test_several_logs_are_concurrent_jobs_in_json() -> None:
    goodost = INPUT / "sample-goodost.darshan"
    done = invoke(
        "sim", "replay", goodost, goodost, "--policy", "fair-share", "--stagger", "0.5",
        "--bins", "10", "--format", "json",
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [j["name"] for j in doc["jobs"]] == ["sample-goodost", "sample-goodost#2"]
    (run,) = doc["policies"]
    assert run["policy"] == "fair-share" and run["error"] == ""
    # both want all of B at once: each gets less than alone, the later one no more
    yields = run["yields"]
    assert 0.5 < yields["sample-goodost#2"] <= yields["sample-goodost"] < 0.9
    assert run["min_yield"] == pytest.approx(min(yields.values()))


@pytest.fixture
def not_logs(tmp_path: Path) -> list[Path]:
    empty = tmp_path / "empty.darshan"
    empty.write_bytes(b"")
    text = tmp_path / "notes.txt"
    text.write_text("not a Darshan log\n")
    truncated = tmp_path / "truncated.darshan"
    truncated.write_bytes((INPUT / "sample.darshan").read_bytes()[:3000])
    return [empty, text, truncated, tmp_path / "missing.darshan", tmp_path]


def test_a_file_that_is_not_a_log_is_one_line_and_exit_2(not_logs: list[Path]) -> None:
    good = INPUT / "sample-goodost.darshan"
    for bad in not_logs:
        done = invoke("sim", "replay", good, bad)
        assert done.exit_code == 2, done.stdout
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"Error: {bad}: "), line


def test_libdarshans_own_messages_do_not_reach_the_terminal(not_logs: list[Path]) -> None:
    done = run_burstctl("sim", "replay", not_logs[2])
    assert done.returncode == 2
    # libdarshan-util either reports the cut (its message, ours now) or, reading past it,
    # crashes the child that reads the log (simulator/replay/darshan.py): one line either way
    (line,) = done.stderr.splitlines()
    assert line in (
        f"Error: {not_logs[2]}: unable to read compressed data from file",
        f"Error: {not_logs[2]}: libdarshan-util died reading it (signal SIGSEGV): a damaged log",
    ), line
