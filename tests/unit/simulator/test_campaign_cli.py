"""The record of a campaign's flags (FILE.meta.json) through the CLI of every command
with ``--resume``: what each records (not the case keys, not where the cases run, not
stdout-only options) and the refusal of a resume with other flags (exit 2, file kept).
In-process (``--workers 1``); the kill-and-resume runs are in
tests/integration/test_sim_resume.py and test_sim_campaigns.py."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from support.cli import invoke

SWEEP = ["sim", "sweep", "--policy", "greedy-yield", "--pressure", "1.1", "--horizon", "5000"]


run = invoke


def record(path: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(path.with_name(path.name + ".meta.json").read_text())
    return loaded


def snapshot(path: Path) -> tuple[bytes, bytes]:
    return path.read_bytes(), path.with_name(path.name + ".meta.json").read_bytes()


def test_sweep_records_its_flags_but_not_its_case_keys(tmp_path: Path) -> None:
    out = tmp_path / "sweep.csv"
    done = run(*SWEEP, "--seeds", "2", "--workers", "1", "--out", out)
    assert done.exit_code == 0, done.output
    assert record(out) == {
        "command": "sim sweep",
        "--policy": ["greedy-yield"],
        "--n-small": 20,
        "--sigma": 0.5,
        "--nu": 0.5,
        "--horizon": 5000.0,
        "--window": 1.0,
        "--windows": "v1",
        "--known-omega": False,
        "--format": "csv",
    }
    # More seeds are more cases of the same campaign: only the new one runs.
    more = run(*SWEEP, "--seeds", "3", "--workers", "1", "--resume", out)
    assert more.exit_code == 0, more.output
    assert "2 already in" in more.stderr and "1 to compute" in more.stderr
    assert re.findall(r"computed 1/1: (.+)", more.stderr) == ["pressure 1.1 seed 2"]


def test_sweep_resume_with_another_horizon_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    done = run(*SWEEP, "--seeds", "2", "--workers", "1", "--format", "json", "--out", out)
    assert done.exit_code == 0, done.output
    before = snapshot(out)
    other = [*SWEEP[:-1], "6000", "--seeds", "2", "--workers", "1", "--format", "json"]
    refused = run(*other, "--resume", out)
    assert refused.exit_code == 2
    assert "--horizon 6000.0 (the file has 5000.0)" in refused.stderr
    assert "computed" not in refused.stderr
    assert snapshot(out) == before
    # and another --format (CSV against a JSON-lines file)
    refused = run(*SWEEP, "--seeds", "2", "--workers", "1", "--resume", out)
    assert refused.exit_code == 2
    assert '--format "csv" (the file has "json")' in refused.stderr
    assert snapshot(out) == before


def test_a_sweep_file_without_a_record_resumes_with_a_warning(tmp_path: Path) -> None:
    out = tmp_path / "sweep.csv"
    assert run(*SWEEP, "--seeds", "1", "--workers", "1", "--out", out).exit_code == 0
    out.with_name("sweep.csv.meta.json").unlink()
    again = run(*SWEEP, "--seeds", "2", "--workers", "1", "--resume", out)
    assert again.exit_code == 0, again.output
    assert f"warning: {out} has no sweep.csv.meta.json" in again.stderr
    assert "1 already in" in again.stderr
    assert record(out)["--horizon"] == 5000.0  # recorded from now on


# One load point draws figures with an empty legend: matplotlib warns, not our point here.
@pytest.mark.filterwarnings("ignore:No artists with labels found")
def test_placement_sweep_records_its_seed_and_curves(tmp_path: Path) -> None:
    placement = ["sim", "placement-sweep", "--loads", "0.3", "--sets", "1", "--workers", "1"]
    done = run(*placement, "--out", tmp_path)
    assert done.exit_code == 0, done.output
    rows = tmp_path / "placement.csv"
    assert record(rows) == {"command": "sim placement-sweep", "--seed": 0, "--curves": "synthetic"}
    before = snapshot(rows)
    refused = run(*placement, "--seed", "1", "--out", tmp_path, "--resume")
    assert refused.exit_code == 2
    assert "--seed 1 (the file has 0)" in refused.stderr
    other = run(*placement, "--curves", "measured", "--out", tmp_path, "--resume")
    assert other.exit_code == 2
    assert '--curves "measured" (the file has "synthetic")' in other.stderr
    assert snapshot(rows) == before


def test_dpsac_join_records_the_model_and_joins_not_the_runs(tmp_path: Path) -> None:
    join = ["sim", "dpsac-join", "--joiner", "eap", "--updater", "st", "--joins", "1"]
    runs = tmp_path / "runs.jsonl"
    done = run(*join, "--runs", "1", "--workers", "1", "--format", "json", "--runs-file", runs)
    assert done.exit_code == 0, done.output
    assert record(runs) == {
        "command": "sim dpsac-join",
        "--joins": 1,
        "--knee": 0.8,
        "--floor": 0.2,
        "--dt": 1.0,
        "--release-spread": 1.0,
        "--unit": None,
    }
    row = json.loads(runs.read_text())
    assert (row["label"], row["method"], row["updater"], row["seed"]) == ("join eap", "dpsac",
                                                                         "st", 0)  # fmt: skip
    # --runs 2 in table form: one more run, summaries over both
    more = run(*join, "--runs", "2", "--workers", "1", "--resume", runs)
    assert more.exit_code == 0, more.output
    assert re.findall(r"computed 1/1: (.+)", more.stderr) == ["join eap st seed 1"]
    assert re.search(r"^join eap\s+st\s+2 ", more.stdout, re.M)
    before = snapshot(runs)
    refused = run(*join[:-1], "2", "--runs", "2", "--workers", "1", "--resume", runs)
    assert refused.exit_code == 2
    assert "--joins 2 (the file has 1)" in refused.stderr
    assert snapshot(runs) == before


def test_runs_file_and_resume_together_are_a_usage_error(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    both = run("sim", "dpsac", "--set", "1", "--workers", "1", "--runs-file", a, "--resume", b)
    assert both.exit_code == 2
    assert "give --runs-file or --resume, not both" in both.output
    assert not a.exists() and not b.exists()


def test_dpsac_plot_resumes_from_its_runs_file(tmp_path: Path) -> None:
    plot = ["sim", "dpsac-plot", "--runs", "1", "--workers", "1"]
    runs = tmp_path / "runs.jsonl"
    whole = run(*plot, "--out", tmp_path / "whole", "--runs-file", runs)
    assert whole.exit_code == 0, whole.output
    lines = runs.read_text().splitlines(keepends=True)
    assert len(lines) == 30  # 10 sets x 3 methods x 1 run
    part = tmp_path / "part.jsonl"
    part.write_text("".join(lines[:12]))  # an interrupted campaign: 12 runs written
    part.with_name("part.jsonl.meta.json").write_bytes(
        runs.with_name("runs.jsonl.meta.json").read_bytes()
    )
    again = run(*plot, "--out", tmp_path / "again", "--resume", part)
    assert again.exit_code == 0, again.output
    assert "12 already in" in again.stderr and "18 to compute" in again.stderr
    assert len(re.findall(r"computed \d+/18: ", again.stderr)) == 18
    # The same rows and summaries, apart from the CPU time of the runs computed again.
    assert without_cpu(json.loads(x) for x in part.read_text().splitlines()) == without_cpu(
        json.loads(x) for x in lines
    )
    assert without_cpu(read_csv(tmp_path / "again")) == without_cpu(read_csv(tmp_path / "whole"))


def read_csv(out: Path) -> list[dict[str, str]]:
    with (out / "dpsac_sets.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def without_cpu(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        assert float(row.pop("sched_seconds")) >= 0.0
        out.append(row)
    return out
