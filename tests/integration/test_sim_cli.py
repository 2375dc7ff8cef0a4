"""``burstctl sim``: generate → run → JSON/CSV through the real command line, and bad input."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import Result
from support.cli import invoke

pytestmark = pytest.mark.integration

KEYS = {
    "policy",
    "instance",
    "min_yield",
    "efficiency",
    "utilization",
    "pressure",
    "events",
    "wall_seconds",
}


def burstctl(*args: str | Path) -> Result:
    return invoke("sim", *args)


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "w0.8.txt"
    done = burstctl(
        "generate", "--pressure", "0.8", "--horizon", "20000", "--seed", "5", "--out", path
    )
    assert done.exit_code == 0, done.stderr
    return path


def test_generate_is_reproducible(instance: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.txt"
    done = burstctl(
        "generate", "--pressure", "0.8", "--horizon", "20000", "--seed", "5", "--out", again
    )
    assert done.exit_code == 0, done.stderr
    assert again.read_text() == instance.read_text()
    assert len(instance.read_text().splitlines()) == 60


def test_run_prints_json(instance: Path) -> None:
    done = burstctl("run", "--policy", "fair-share", "--instance", instance)
    assert done.exit_code == 0, done.stderr
    row = json.loads(done.stdout)
    assert set(row) >= KEYS
    assert row["policy"] == "fair-share" and row["instance"] == str(instance)
    assert 0 < row["min_yield"] <= 1 and 0 < row["efficiency"] <= 1
    assert 0 < row["utilization"] <= 1 and row["events"] > 0
    assert 0.5 < row["pressure"] < 1.2


def test_run_v2_csv_with_window(instance: Path) -> None:
    done = burstctl(
        "run",
        "--policy",
        "fcfs",
        "--instance",
        instance,
        "--windows",
        "v2",
        "--window",
        "0.5",
        "--format",
        "csv",
    )
    assert done.exit_code == 0, done.stderr
    (row,) = list(csv.DictReader(io.StringIO(done.stdout)))
    assert set(row) >= KEYS and row["windows"] == "v2" and row["policy"] == "fcfs"


def test_run_set10_with_known_omega_takes_it_from_the_instance(instance: Path) -> None:
    rows = {}
    for flag in ((), ("--known-omega",)):
        done = burstctl("run", "--policy", "set-10", "--instance", instance, *flag)
        assert done.exit_code == 0, done.stderr
        rows[bool(flag)] = json.loads(done.stdout)
    assert rows[True]["known_omega"] is True and rows[False]["known_omega"] is False
    assert rows[True]["policy"] == rows[False]["policy"] == "set-10"
    assert rows[True]["min_yield"] != rows[False]["min_yield"]  # ω known, not learned
    # a policy without ω ignores the flag
    done = burstctl("run", "--policy", "fcfs", "--instance", instance, "--known-omega")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["known_omega"] is False


def test_unknown_policy_lists_known(instance: Path) -> None:
    done = burstctl("run", "--policy", "nope", "--instance", instance)
    assert done.exit_code == 2
    assert "unknown policy 'nope'" in done.stderr and "fair-share" in done.stderr
    assert "fcfs" in done.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a 1 0 0 0 2 0 C 1 1\nb 1 0 0 0 2 0 C 1\n", "line 2: n: says 2 values"),
        ("a 1 0 0 0 2 0 C 1 1\n\nb 1 0 0 0 2 0 C 1 -1\n", "line 3: x_2 (duration): must be >= 0"),
        ("a 1 0 0 0 2 0 C 1 1\nb 1 0 0 0 2 0 C -4 1\n", "line 2: x_1 (volume): must be >= 0"),
        ("a 1 0 0 0 2 0 C one 1\n", "line 1: x_1 (volume): not a number"),
    ],
)
def test_malformed_instance(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(content)
    done = burstctl("run", "--policy", "fcfs", "--instance", path)
    assert done.exit_code == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("pressure", ["0", "-0.5"])
def test_pressure_must_be_positive(tmp_path: Path, pressure: str) -> None:
    done = burstctl("generate", "--pressure", pressure, "--seed", "1", "--out", tmp_path / "x")
    assert done.exit_code == 2 and "--pressure" in done.stderr and "> 0" in done.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("window", ["0", "1.5", "-1"])
def test_window_must_be_a_fraction(instance: Path, window: str) -> None:
    done = burstctl("run", "--policy", "fcfs", "--instance", instance, "--window", window)
    assert done.exit_code == 2 and "--window" in done.stderr and "(0, 1]" in done.stderr


def test_sweep_rows_in_order() -> None:
    done = burstctl(
        "sweep",
        "--policy",
        "fcfs",
        "--policy",
        "fair-share",
        "--pressure",
        "0.5",
        "--pressure",
        "1.1",
        "--seeds",
        "2",
        "--horizon",
        "20000",
        "--workers",
        "2",
    )
    assert done.exit_code == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    got = [(r["pressure_goal"], r["seed"], r["policy"]) for r in rows]
    assert got == [
        (w, s, p) for w in ("0.5", "1.1") for s in ("0", "1") for p in ("fcfs", "fair-share")
    ]
    assert set(rows[0]) >= KEYS


def test_sweep_with_known_omega_matches_single_runs(tmp_path: Path) -> None:
    common = ("--pressure", "0.8", "--seeds", "1", "--first-seed", "3", "--horizon", "20000")
    done = burstctl("sweep", "--policy", "set-10", *common, "--known-omega", "--workers", "1")
    assert done.exit_code == 0, done.stderr
    (row,) = list(csv.DictReader(io.StringIO(done.stdout)))
    assert row["known_omega"] == "True"
    path = tmp_path / "w0.8-3.txt"
    made = burstctl(
        "generate", "--pressure", "0.8", "--horizon", "20000", "--seed", "3", "--out", path
    )
    assert made.exit_code == 0, made.stderr
    single = burstctl("run", "--policy", "set-10", "--instance", path, "--known-omega")
    assert single.exit_code == 0, single.stderr
    assert float(row["min_yield"]) == json.loads(single.stdout)["min_yield"]


def test_sweep_rejects_bad_pressure() -> None:
    done = burstctl("sweep", "--policy", "fcfs", "--pressure", "0", "--seeds", "1")
    assert done.exit_code == 2 and "--pressure" in done.stderr


# -- DPSAC (docs/simulator.md, "DPSAC") ---------------------------------------------------

DPSAC_KEYS = {
    "method",
    "runs",
    "sys_eff",
    "sys_eff_se",
    "dilation",
    "dilation_se",
    "sched_seconds",
    "teio_over_b",
}


def test_dpsac_prints_one_json_object_per_method() -> None:
    done = burstctl("dpsac", "--set", "2", "--runs", "2", "--seed", "3", "--format", "json")
    assert done.exit_code == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["method"] for r in rows] == ["dpsac", "mcios", "bios"]
    for r in rows:
        assert set(r) == DPSAC_KEYS | {"set"}
        assert r["set"] == 2 and r["runs"] == 2
        assert 0 < r["sys_eff"] < 1 and r["dilation"] > 1
        assert r["sys_eff_se"] >= 0 and r["dilation_se"] >= 0 and r["sched_seconds"] > 0
    again = burstctl("dpsac", "--set", "2", "--runs", "2", "--seed", "3", "--format", "json")
    strip = [
        {k: v for k, v in json.loads(x).items() if k != "sched_seconds"}
        for x in again.stdout.splitlines()
    ]
    assert strip == [{k: v for k, v in r.items() if k != "sched_seconds"} for r in rows]


def test_dpsac_table_with_one_method() -> None:
    done = burstctl("dpsac", "--set", "10", "--runs", "1", "--method", "bios")
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "SysEff" in lines[0] and "Dilation" in lines[0]
    assert len(lines) == 2 and lines[1].startswith("set 10") and "bios" in lines[1]


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["dpsac", "--set", "0"], "--set"),
        (["dpsac", "--set", "11"], "--set"),
        (["dpsac", "--set", "1", "--runs", "0"], "--runs"),
        (["dpsac", "--set", "1", "--method", "sjf"], "--method"),
        (["dpsac", "--set", "1", "--knee", "0"], "--knee"),
        (["dpsac-join", "--joiner", "vpic"], "--joiner"),
        (["dpsac-join", "--joiner", "eap", "--updater", "km"], "--updater"),
        (["dpsac-join", "--joiner", "eap", "--runs", "0"], "--runs"),
    ],
)
def test_dpsac_bad_input_names_the_option(args: list[str], name: str) -> None:
    done = burstctl(*args)
    assert done.exit_code == 2
    assert name in done.stderr and "Traceback" not in done.stderr


def test_dpsac_join_prints_one_json_object_per_updater() -> None:
    done = burstctl(
        "dpsac-join", "--joiner", "silverton", "--joins", "2", "--runs", "1", "--format", "json"
    )
    assert done.exit_code == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["updater"] for r in rows] == ["st", "dt", "ok"]
    for r in rows:
        assert set(r) == (DPSAC_KEYS - {"method"}) | {"joiner", "updater"}
        assert r["joiner"] == "silverton" and r["runs"] == 1
        assert 0 < r["sys_eff"] < 1 and r["dilation"] > 1 and r["sched_seconds"] > 0


def test_dpsac_plot_writes_csv_and_png(tmp_path: Path) -> None:
    done = burstctl("dpsac-plot", "--out", tmp_path / "out", "--runs", "1")
    assert done.exit_code == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out" / "dpsac_sets.csv").read_text())))
    assert len(rows) == 30
    assert {r["label"] for r in rows} == {f"set {n}" for n in range(1, 11)}
    assert {r["method"] for r in rows} == {"dpsac", "mcios", "bios"}
    png = (tmp_path / "out" / "dpsac_sets.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


PLACEMENT_KEYS = {
    "set",
    "load",
    "allocator",
    "placement",
    "mean_slowdown",
    "max_slowdown",
    "io_spread",
    "rho_io",
    "rho_con",
    "machine_idle_time",
}


def test_placement_prints_one_json_object_per_set_allocator_placement() -> None:
    done = burstctl("placement", "--load", "0.4", "--sets", "2", "--seed", "3", "--format", "json")
    assert done.exit_code == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 2 * 6 * 3  # default: every allocator and placement
    assert {r["allocator"] for r in rows} == {
        "random",
        "static",
        "best-bdw",
        "nsys-allocator",
        "tcpu-allocator",
        "mckp",
    }
    assert {r["placement"] for r in rows} == {
        "random",
        "greedy-non-clairvoyant",
        "greedy-clairvoyant",
    }
    assert [r["set"] for r in rows] == [0] * 18 + [1] * 18
    for r in rows:
        assert set(r) >= PLACEMENT_KEYS
        assert 0 < r["load"] <= 0.4 * 1.5  # I/O-load(π_sys) of a Θ = 0.4 set
        assert r["max_slowdown"] >= r["mean_slowdown"] >= 1 - 1e-9
    assert len({r["load"] for r in rows}) == 2  # one load per set, two different sets


def test_placement_options_repeat_and_the_seed_reproduces() -> None:
    args = [
        "placement",
        "--allocator",
        "best-bdw",
        "--allocator",
        "tcpu-allocator",
        "--placement",
        "greedy-clairvoyant",
        "--load",
        "1.2",
        "--seed",
        "9",
        "--format",
        "json",
    ]
    done, again = burstctl(*args), burstctl(*args)
    assert done.exit_code == 0, done.stderr
    assert done.stdout == again.stdout
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["allocator"], r["placement"]) for r in rows] == [
        ("best-bdw", "greedy-clairvoyant"),
        ("tcpu-allocator", "greedy-clairvoyant"),
    ]
    rough = burstctl(*args, "--inaccurate")
    assert rough.exit_code == 0, rough.stderr
    assert all(json.loads(line)["inaccurate"] for line in rough.stdout.splitlines())


def test_placement_on_measured_curves_runs_a_set_with_exact_and_class_inputs() -> None:
    args = ["placement", "--load", "0.6", "--allocator", "best-bdw", "--format", "json"]
    measured = burstctl(*args, "--placement", "greedy-non-clairvoyant", "--curves", "measured")
    synthetic = burstctl(*args, "--placement", "greedy-non-clairvoyant")
    rough = burstctl(
        *args, "--placement", "greedy-clairvoyant", "--curves", "measured", "--inaccurate"
    )
    for done in (measured, synthetic, rough):
        assert done.exit_code == 0, done.stderr
    row, other, class_row = (json.loads(d.stdout) for d in (measured, synthetic, rough))
    assert row["load"] != other["load"]  # other curves, another set
    assert row["rho_io"] == pytest.approx(1.0)  # BestBdw on the measured b_j
    assert class_row["inaccurate"] and class_row["mean_slowdown"] >= 1.0 - 1e-9


def test_placement_table_has_a_header_and_a_line_per_row() -> None:
    done = burstctl("placement", "--allocator", "static", "--placement", "random")
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["set", "load", "allocator", "placement"]
    assert len(lines) == 2 and "static" in lines[1]


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["placement", "--load", "0"], "--load"),
        (["placement", "--load", "2.5"], "--load"),
        (["placement", "--load", "-1"], "--load"),
        (["placement", "--allocator", "best"], "--allocator"),
        (["placement", "--placement", "round-robin"], "--placement"),
        (["placement", "--sets", "0"], "--sets"),
        (["placement", "--curves", "real"], "--curves"),
        (["placement-sweep", "--loads", "3", "--out", "/nonexistent/x"], "--loads"),
        (["placement-sweep", "--loads", "0.5"], "--out"),
    ],
)
def test_placement_bad_input_names_the_option(args: list[str], name: str) -> None:
    done = burstctl(*args)
    assert done.exit_code == 2
    assert name in done.stderr and "Traceback" not in done.stderr


def test_placement_sweep_writes_csv_readings_and_pngs(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    done = burstctl(
        "placement-sweep", "--loads", "0.2", "--loads", "0.9", "--sets", "6", "--out", out
    )
    assert done.exit_code == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO((out / "placement.csv").read_text())))
    assert len(rows) == 2 * 6 * (18 + 3)
    assert {r["target"] for r in rows} == {"0.2", "0.9"}
    assert {r["inaccurate"] for r in rows} == {"True", "False"}
    assert "Nsys-Allocator better than BestBdw" in (out / "readings.md").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "io_spread_vs_load.png",
        "machine_idle_time_vs_load.png",
        "mean_slowdown_vs_load.png",
        "rho_io_rho_con_vs_load.png",
        "robustness_vs_load.png",
    ]
    for p in pngs:
        assert (out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
