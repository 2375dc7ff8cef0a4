"""Campaigns on Dask (docs/simulator.md, "Campaigns"): a real scheduler and two real
workers on loopback, started here as child processes and stopped by pid; `burstctl sim
sweep` run as a real process against them, against a local cluster, and in-process."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support import run_burstctl as burstctl
from support import wait_until

pytestmark = pytest.mark.integration

SWEEP = ["sim", "sweep", "--policy", "greedy-yield", "--policy", "fair-share"]
SMALL = [*SWEEP, "--pressure", "0.5", "--pressure", "1.1", "--seeds", "3", "--horizon", "20000"]
# Twelve cases of about a quarter of a second each: long enough to kill halfway.
LONGER = [*SWEEP, "--pressure", "1.1", "--seeds", "12", "--horizon", "300000"]


def dask(command: str) -> list[str]:
    """``dask scheduler`` / ``dask worker`` of this interpreter's environment."""
    return [sys.executable, "-m", f"distributed.cli.dask_{command}"]


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """Stops a child and whatever it started (a nanny's worker), by pid."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        child.kill()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `dask scheduler` and two `dask worker`s (one thread each) on 127.0.0.1; the
    scheduler's address."""
    where = tmp_path_factory.mktemp("dask")
    info = where / "scheduler.json"
    common = ["--host", "127.0.0.1", "--no-dashboard"]
    one_thread = ["--nworkers", "1", "--nthreads", "1", "--name"]
    scratch = ["--local-directory", str(where)]
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        with (where / "scheduler.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [*dask("scheduler"), *common, "--port", "0", "--scheduler-file", str(info)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        wait_until(lambda: info.exists() and info.stat().st_size > 0, timeout=30)
        address = str(wait_until(lambda: _address(info), timeout=10))
        assert address.startswith("tcp://127.0.0.1:")
        for n in (1, 2):
            logs.append(where / f"worker{n}.log")
            with logs[-1].open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [*dask("worker"), address, *common, *one_thread, f"w{n}", *scratch],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        for path in logs:
            wait_until(lambda p=path: "Registered to:" in p.read_text(), timeout=30)
        yield address
    finally:
        for proc in reversed(procs):
            stop(proc)


def _address(info: Path) -> str | None:
    try:
        return str(json.loads(info.read_text())["address"])
    except (ValueError, KeyError):
        return None  # still being written


def rows_of(text: str, fmt: str, keep_time: bool = False) -> list[dict[str, object]]:
    """The rows without ``wall_seconds`` (the only column that differs between runs)."""
    if fmt == "json":
        rows: list[dict[str, object]] = [json.loads(line) for line in text.splitlines()]
    else:
        rows = list(csv.DictReader(io.StringIO(text)))
    for row in [] if keep_time else rows:
        assert float(str(row.pop("wall_seconds"))) >= 0.0
    return rows


def test_sweep_on_a_scheduler_and_two_workers_gives_the_local_rows(scheduler: str) -> None:
    inline = burstctl(*SMALL, "--workers", "1")
    local = burstctl(*SMALL, "--workers", "2")
    remote = burstctl(*SMALL, "--scheduler", scheduler)
    for done in (inline, local, remote):
        assert done.returncode == 0, done.stderr
        assert len(re.findall(r"^\[\d+/6\] computed", done.stderr, re.M)) == 6
        assert "computed" not in done.stdout  # progress is on stderr only
    assert "on this process" in inline.stderr
    assert "on a local Dask cluster of 2 processes" in local.stderr
    assert f"on the Dask cluster at {scheduler}" in remote.stderr
    expected = rows_of(inline.stdout, "csv")
    assert [(r["pressure_goal"], r["seed"], r["policy"]) for r in expected] == [
        (w, str(s), p) for w in ("0.5", "1.1") for s in range(3) for p in SMALL[3:6:2]
    ]
    assert all(r["error"] == "" for r in expected)
    assert rows_of(local.stdout, "csv") == expected
    assert rows_of(remote.stdout, "csv") == expected


def test_scheduler_out_of_reach_is_a_message_not_a_traceback() -> None:
    done = burstctl(*SMALL, "--scheduler", "tcp://127.0.0.1:9")
    assert done.returncode == 1
    assert "no Dask scheduler at tcp://127.0.0.1:9" in done.stderr
    assert "Traceback" not in done.stderr


def complete_seeds(path: Path, fmt: str) -> set[int]:
    """The seeds whose two rows (one per policy) are both in the file; a line torn by a
    kill does not count."""
    if not path.exists():
        return set()
    text = path.read_text()
    text = text[: text.rfind("\n") + 1]
    seeds = [int(str(r["seed"])) for r in rows_of(text, fmt, keep_time=True)]
    return {s for s in seeds if seeds.count(s) == 2}


def test_a_killed_sweep_resumes_computing_only_the_missing_cases(
    scheduler: str, tmp_path: Path
) -> None:
    fmt = "csv"  # JSON lines resume alike (tests/unit/simulator/test_campaign.py)
    full = tmp_path / f"full.{fmt}"
    done = burstctl(*LONGER, "--format", fmt, "--scheduler", scheduler, "--out", full)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # the rows went to the file

    out = tmp_path / f"sweep.{fmt}"
    # Killed on its default engine, a local cluster of worker processes: they must not
    # outlive it.
    run = [*LONGER, "--format", fmt, "--workers", "2", "--out", str(out)]
    sweep = subprocess.Popen(
        [sys.executable, "-m", "burstctl", *run],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: list[psutil.Process] = []
    try:
        wait_until(lambda: len(complete_seeds(out, fmt)) >= 3, timeout=60, message="3 cases")
        workers = psutil.Process(sweep.pid).children(recursive=True)
    finally:
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait(timeout=10)
        _, alive = psutil.wait_procs(workers, timeout=30)
        for proc in alive:
            proc.kill()
    assert len(workers) >= 2
    assert alive == [], f"worker processes outlived the killed sweep: {alive}"
    written = complete_seeds(out, fmt)  # appended as cases finish: not in case order yet
    kept = len(written)
    assert 3 <= kept < 12, f"not killed halfway: {kept} of 12 cases written"

    again = burstctl(*LONGER, "--format", fmt, "--scheduler", scheduler, "--resume", out)
    assert again.returncode == 0, again.stderr
    missing = 12 - kept
    assert f"{kept} already in {out}, {missing} to compute" in again.stderr
    computed = re.findall(rf"computed \d+/{missing}: pressure 1.1 seed (\d+)", again.stderr)
    assert len(computed) == missing
    assert {int(s) for s in computed} == set(range(12)) - written
    assert rows_of(out.read_text(), fmt) == rows_of(full.read_text(), fmt)
    records = [p.with_name(p.name + ".meta.json") for p in (full, out)]
    assert records[0].read_text() == records[1].read_text()  # the same flags
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [full.name, out.name, *(r.name for r in records)]
    )


def without(text: str, key: str) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in text.splitlines()]
    for row in rows:
        assert row.pop(key) is not None
    return rows


def test_the_other_campaign_commands_run_on_the_cluster_with_the_local_rows(
    scheduler: str, tmp_path: Path
) -> None:
    dpsac = ["sim", "dpsac", "--set", "2", "--runs", "2", "--format", "json"]
    inline = burstctl(*dpsac, "--workers", "1")
    remote = burstctl(*dpsac, "--scheduler", scheduler)
    assert inline.returncode == 0 and remote.returncode == 0, remote.stderr
    assert len(re.findall(r"^\[\d+/6\] computed", remote.stderr, re.M)) == 6
    # sched_seconds is the scheduler's CPU time: the one figure that differs between runs
    assert without(remote.stdout, "sched_seconds") == without(inline.stdout, "sched_seconds")

    compare = ["sim", "persched-compare", "--synthetic", "mira", "--count", "2", "--format", "csv"]
    inline = burstctl(*compare, "--workers", "1")
    remote = burstctl(*compare, "--scheduler", scheduler)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == inline.stdout
    assert "[2/2] computed 2/2: mira seed 1" in remote.stderr


def test_placement_sweep_resumes_on_the_cluster(scheduler: str, tmp_path: Path) -> None:
    placement = ["sim", "placement-sweep", "--loads", "0.3", "--sets", "3"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    done = burstctl(*placement, "--workers", "1", "--out", whole)
    assert done.returncode == 0, done.stderr
    expected = (whole / "placement.csv").read_text()
    lines = expected.splitlines(keepends=True)
    per_set = (len(lines) - 1) // 3
    part.mkdir()
    # An interrupted run: set 2 finished, set 0 half written.
    (part / "placement.csv").write_text(
        lines[0] + "".join(lines[1 + 2 * per_set :]) + "".join(lines[1 : 1 + per_set // 2])
    )
    again = burstctl(*placement, "--scheduler", scheduler, "--out", part, "--resume")
    assert again.returncode == 0, again.stderr
    assert "1 already in" in again.stderr and "2 to compute" in again.stderr
    assert sorted(re.findall(r"computed \d/2: load 0.3 set (\d)", again.stderr)) == ["0", "1"]
    assert (part / "placement.csv").read_text() == expected
    assert (part / "readings.md").read_text() == (whole / "readings.md").read_text()
