"""`--resume FILE` of the campaigns that print summaries (docs/simulator.md, "Campaigns"):
`burstctl sim dpsac` and `sim persched-compare` run as real processes, SIGKILLed by pid
once some runs are in their runs file, then resumed: only the missing runs are computed
and the summaries are those of an uninterrupted run; a resume with other flags is refused
and leaves the file as it was. In this process's cases (``--workers 1``): the cluster is
not the point here (tests/integration/test_sim_campaigns.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from support import run_burstctl, wait_until

pytestmark = pytest.mark.integration

# 18 runs of about a tenth of a second each (set 5, dt 0.5 s): long enough to kill
# partway. Labels: "set 5 dpsac seed 2".
DPSAC = ["sim", "dpsac", "--set", "5", "--runs", "6", "--dt", "0.5", "--workers", "1"]
DPSAC_RUNS = [f"set 5 {m} seed {s}" for m in ("dpsac", "mcios", "bios") for s in range(6)]
# 8 sets of about a third of a second each. Labels: "mira seed 3".
COMPARE = [
    "sim",
    "persched-compare",
    "--synthetic",
    "mira",
    "--count",
    "8",
    "--periods",
    "100",
    "--strategy",
    "greedy-yield",
    "--strategy",
    "fair-share",
    "--workers",
    "1",
]
COMPARE_RUNS = [f"mira seed {s}" for s in range(8)]


def burstctl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_burstctl(*args, timeout=120)


def whole_lines(path: Path) -> list[dict[str, object]]:
    """The rows of the runs file, without a last line torn by a kill."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def killed_partway(args: Sequence[str], runs_file: Path, at_least: int, n: int) -> int:
    """Runs ``burstctl *args --runs-file FILE``, SIGKILLs it by pid once ``at_least``
    runs are in FILE; the number of runs it left there (fewer than ``n``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "burstctl", *args, "--runs-file", str(runs_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: len(whole_lines(runs_file)) >= at_least,
            timeout=60,
            message=f"{at_least} runs in {runs_file}",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    kept = len(whole_lines(runs_file))
    assert at_least <= kept < n, f"not killed partway: {kept} of {n} runs written"
    return kept


def computed(stderr: str, missing: int) -> list[str]:
    """The labels of the runs a resumed campaign computed, from its progress lines."""
    return re.findall(rf"^\[\d+/\d+\] computed \d+/{missing}: (.+)$", stderr, re.M)


def without_time(stdout: str) -> list[dict[str, object]]:
    """`sim dpsac --format json`'s summaries without ``sched_seconds`` (CPU time)."""
    rows = [json.loads(line) for line in stdout.splitlines()]
    for row in rows:
        assert float(str(row.pop("sched_seconds"))) >= 0.0
    return rows


def test_a_killed_dpsac_campaign_resumes_with_only_the_missing_runs(tmp_path: Path) -> None:
    whole = burstctl(*DPSAC, "--format", "json")  # no runs file: the output of today
    assert whole.returncode == 0, whole.stderr
    expected = without_time(whole.stdout)
    assert [(r["method"], r["runs"]) for r in expected] == [
        ("dpsac", 6),
        ("mcios", 6),
        ("bios", 6),
    ]

    runs = tmp_path / "runs.jsonl"
    kept = killed_partway([*DPSAC, "--format", "json"], runs, 4, 18)
    written = {f"{r['label']} {r['method']} seed {r['seed']}" for r in whole_lines(runs)}
    assert len(written) == kept

    again = burstctl(*DPSAC, "--format", "json", "--resume", runs)
    assert again.returncode == 0, again.stderr
    missing = 18 - kept
    assert f"{kept} already in {runs}, {missing} to compute" in again.stderr
    done = computed(again.stderr, missing)
    assert sorted(done) == sorted(set(DPSAC_RUNS) - written)
    assert without_time(again.stdout) == expected
    # the file now holds every run, in case order
    assert [f"{r['label']} {r['method']} seed {r['seed']}" for r in whole_lines(runs)] == (
        DPSAC_RUNS
    )

    # Resuming the finished file computes nothing and prints the same summaries again,
    # CPU times included (they are the file's).
    finished = burstctl(*DPSAC, "--format", "json", "--resume", runs)
    assert finished.returncode == 0, finished.stderr
    assert "18 already in" in finished.stderr and computed(finished.stderr, 0) == []
    assert finished.stdout == again.stdout


def test_a_dpsac_resume_with_another_flag_is_refused_and_the_file_kept(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs.jsonl"
    killed_partway(DPSAC, runs, 2, 18)
    meta = tmp_path / "runs.jsonl.meta.json"
    assert json.loads(meta.read_text())["--dt"] == 0.5
    before = runs.read_bytes(), meta.read_bytes()
    other = [*DPSAC[:7], "0.25", *DPSAC[8:]]  # --dt 0.25
    assert other[6] == "--dt"
    refused = burstctl(*other, "--resume", runs)
    assert refused.returncode == 2
    assert "--dt 0.25 (the file has 0.5)" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert "computed" not in refused.stderr
    assert (runs.read_bytes(), meta.read_bytes()) == before


def test_a_killed_persched_compare_resumes_with_only_the_missing_sets(tmp_path: Path) -> None:
    whole = burstctl(*COMPARE)  # the table, no runs file
    assert whole.returncode == 0, whole.stderr
    assert [line.split(":")[0] for line in whole.stdout.splitlines() if "upper bound" in line] == (
        COMPARE_RUNS
    )

    runs = tmp_path / "sets.jsonl"
    kept = killed_partway(COMPARE, runs, 2, 8)
    written = {str(r["set"]) for r in whole_lines(runs)}

    again = burstctl(*COMPARE, "--resume", runs)
    assert again.returncode == 0, again.stderr
    missing = 8 - kept
    assert f"{kept} already in {runs}, {missing} to compute" in again.stderr
    assert sorted(computed(again.stderr, missing)) == sorted(set(COMPARE_RUNS) - written)
    assert again.stdout == whole.stdout  # the table has no time column
    assert [r["set"] for r in whole_lines(runs)] == COMPARE_RUNS

    # the other outputs, drawn from the same file without computing anything
    csv_whole = burstctl(*COMPARE, "--format", "csv")
    csv_again = burstctl(*COMPARE, "--format", "csv", "--resume", runs)
    assert csv_again.returncode == 0, csv_again.stderr
    assert computed(csv_again.stderr, 0) == []
    assert csv_again.stdout == csv_whole.stdout

    # another --periods: refused, the file left as it was
    meta = tmp_path / "sets.jsonl.meta.json"
    before = runs.read_bytes(), meta.read_bytes()
    other = [*COMPARE[:7], "50", *COMPARE[8:]]
    assert other[6] == "--periods"
    refused = burstctl(*other, "--resume", runs)
    assert refused.returncode == 2
    assert "--periods 50.0 (the file has 100.0)" in refused.stderr
    assert (runs.read_bytes(), meta.read_bytes()) == before
    # another strategy list alike
    fewer = [*COMPARE[:8], *COMPARE[10:]]
    refused = burstctl(*fewer, "--resume", runs)
    assert refused.returncode == 2
    assert '--strategy ["fair-share"]' in refused.stderr
    assert (runs.read_bytes(), meta.read_bytes()) == before
