"""PerSched against the eight online strategies (``simulator/persched_compare.py``,
``burstctl sim persched-compare``): the instance, the metrics, the CLI's shapes, the plot."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from support.cli import invoke

from burstctl.policies.persched import (
    App,
    AppSet,
    Platform,
    jupiter_set,
    persched,
    rho,
    time_io,
    upper_bound,
)
from burstctl.simulator.bws.runs import simulate
from burstctl.simulator.persched.compare import (
    ONLINE_STRATEGIES,
    NamedSet,
    build_window,
    compare,
    horizon_for,
    jupiter,
    run_online,
    synthetic_sets,
)

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_eight_strategies_of_the_bandwidth_sharing_paper_are_registered() -> None:
    from burstctl.policies.registry import default_registry

    names = default_registry().names()
    assert len(set(ONLINE_STRATEGIES)) == 8
    assert set(ONLINE_STRATEGIES) <= set(names)


def test_the_instance_has_the_sets_apps_and_platform() -> None:
    app_set = jupiter_set(7)  # T1 (β·b = 5.12 > B: clipped), two T2 (β·b = 0.64)
    platform = app_set.platform
    horizon = 50_000.0
    window = build_window(app_set, horizon)
    assert window.horizon == pytest.approx(horizon, rel=1e-12)
    assert window.bandwidth == platform.B
    assert [a.name for a in window.apps] == [a.name for a in app_set.apps]
    for app, sim in zip(app_set.apps, window.apps, strict=True):
        assert sim.cap == pytest.approx(min(app.beta * platform.b, platform.B) / platform.B)
        assert sim.released_at == 0.0 and sim.progress == 0.0
        phases = sim.phases
        assert not phases[0].io  # compute first, from t = 0
        for k, phase in enumerate(phases[:-1]):  # the last one is cut at H
            assert phase.io == (k % 2 == 1)
            if phase.io:  # volume / B; alone, it takes time_io
                assert phase.value == pytest.approx(app.vol_io / platform.B)
                assert phase.value / sim.cap == pytest.approx(time_io(app, platform))
            else:
                assert phase.value == app.w
        assert sum(p.value / sim.cap if p.io else p.value for p in phases) == pytest.approx(
            horizon, rel=1e-9
        )


def test_the_horizon_covers_the_periods_and_the_longest_iteration() -> None:
    app_set = jupiter_set(5)  # PP: w + time_io ≈ 494,891 s
    longest = max(a.w + time_io(a, app_set.platform) for a in app_set.apps)
    assert horizon_for(app_set, 1000.0, 3) == pytest.approx(3 * longest)
    assert horizon_for(app_set, 2 * longest, 3) == pytest.approx(6 * longest)


def test_a_small_set_runs_persched_and_all_eight_within_the_upper_bound() -> None:
    named = jupiter(10)
    result = compare(named, periods=3)
    app_set = named.app_set
    direct = persched(app_set.apps, app_set.platform, tmin=named.tmin)
    assert result.persched.sys_eff == direct.sys_eff
    assert result.persched.dilation == direct.dilation
    assert result.upper_bound == upper_bound(app_set.apps, app_set.platform)
    assert result.horizon == pytest.approx(3 * direct.period)
    assert [r.strategy for r in result.online] == list(ONLINE_STRATEGIES)
    for r in result.online:
        assert 0.0 < r.sys_eff <= result.upper_bound + 1e-12, r.strategy
        assert r.dilation >= 1.0 - 1e-12, r.strategy
        for app, rt in zip(app_set.apps, r.rho_tilde, strict=True):
            assert 0.0 < rt <= rho(app, app_set.platform) + 1e-12
        assert all(n > 0 for n in r.iterations)
    data = result.to_json()
    assert data["best_online_sys_eff"]["sys_eff"] == max(r.sys_eff for r in result.online)
    assert data["best_online_dilation"]["dilation"] == min(r.dilation for r in result.online)


def test_under_congestion_no_strategy_reaches_the_bound() -> None:
    # Set 1: ten T2 that each want 0.64 GB/s of B = 3 for 83 % of their time.
    result = compare(jupiter(1), periods=2, strategies=("fair-share", "fcfs", "greedy-yield"))
    for r in result.online:
        assert r.sys_eff < 0.9 * result.upper_bound, r.strategy
        assert r.dilation > 1.5, r.strategy


def test_an_application_alone_runs_at_its_dedicated_efficiency() -> None:
    # Nothing to share: ρ̃ = ρ, Dilation = 1 and SysEff = the bound, for every strategy.
    app_set = AppSet(Platform(3.0, 0.01), (App("solo", 100.0, 50.0, 200.0),))
    window = build_window(app_set, 10_000.0)
    for name in ONLINE_STRATEGIES:
        r = run_online(app_set, window, name)
        assert r.dilation == pytest.approx(1.0, abs=1e-9), name
        assert r.sys_eff == pytest.approx(upper_bound(app_set.apps, app_set.platform)), name
        # 10,000 s of 100 s compute + 25 s I/O: 80 whole iterations
        assert r.iterations == (80,), name


def test_dilation_is_the_inverse_of_the_simulators_min_yield() -> None:
    app_set = jupiter_set(7)
    window = build_window(app_set, 40_000.0)
    for name in ("fcfs", "greedy-yield", "set-10"):
        ours = run_online(app_set, window, name)
        theirs = simulate(window, name)
        assert ours.dilation == pytest.approx(1.0 / theirs.min_yield, rel=1e-12), name
        assert ours.events == theirs.events


def test_synthetic_sets_are_labelled_by_seed() -> None:
    sets = synthetic_sets("mira", 2, 5)
    assert [s.label for s in sets] == ["mira seed 5", "mira seed 6"]
    assert sets[0].app_set != sets[1].app_set
    with pytest.raises(ValueError, match="machine"):
        synthetic_sets("jupiter", 1, 0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="periods"):
        compare(jupiter(10), periods=0.0)
    with pytest.raises(ValueError, match="horizon"):
        build_window(jupiter_set(10), -1.0)


# --- the CLI ---------------------------------------------------------------------


def _run(*args: str) -> tuple[int, str, str]:
    result = invoke("sim", "persched-compare", *args)
    return result.exit_code, result.stdout, result.stderr


def test_cli_json_shape() -> None:
    code, out, _ = _run("--set", "10", "--set", "7", "--periods", "2", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["periods"] == 2.0
    assert [s["set"] for s in data["sets"]] == ["set 10", "set 7"]
    for s in data["sets"]:
        assert set(s) >= {
            "set",
            "B",
            "b",
            "apps",
            "upper_bound",
            "horizon",
            "persched",
            "online",
            "best_online_sys_eff",
            "best_online_dilation",
        }
        assert set(s["persched"]) >= {"sys_eff", "dilation", "period", "counts"}
        assert [o["strategy"] for o in s["online"]] == list(ONLINE_STRATEGIES)
        for o in s["online"]:
            assert 0.0 < o["sys_eff"] <= s["upper_bound"]
            assert len(o["rho_tilde"]) == len(s["apps"]) == len(o["iterations"])


def test_cli_csv_shape_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "cmp.png"
    code, out, _ = _run(
        "--synthetic", "mira", "--count", "2", "--seed", "1", "--periods", "2",
        "--strategy", "fair-share", "--strategy", "greedy-yield",
        "--format", "csv", "--plot", str(png),
    )  # fmt: skip
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["set", "horizon", "upper_bound", "method", "sys_eff", "dilation"]
    assert [(r["set"], r["method"]) for r in rows] == [
        (s, m)
        for s in ("mira seed 1", "mira seed 2")
        for m in ("persched", "upper-bound", "fair-share", "greedy-yield")
    ]
    for r in rows:
        assert 0.0 < float(r["sys_eff"]) <= float(r["upper_bound"])
        assert math.isfinite(float(r["dilation"]))
    data = png.read_bytes()
    assert data[:8] == PNG and len(data) > 5000


def test_cli_table(tmp_path: Path) -> None:
    code, out, _ = _run("--set", "10", "--periods", "2", "--strategy", "fcfs")
    assert code == 0
    assert "set 10: upper bound 0.9882" in out
    assert "PerSched" in out and "fcfs" in out and "best online SysEff" in out


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--set", "1", "--synthetic", "mira"),
        ("--set", "11"),
        ("--set", "1", "--periods", "0"),
        ("--set", "1", "--strategy", "nope"),
        ("--set", "1", "--count", "3"),  # --count and --seed go with --synthetic only
        ("--set", "1", "--seed", "7"),
    ],
)
def test_cli_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    code, _, err = _run(*args)
    assert code == 2
    assert "Error" in err


def test_cli_malformed_set_file_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"B": 3, "b": 0.01, "apps": [{"name": "a", "w": 1, "beta": 2}]}))
    code, out, err = _run("--set-file", str(bad))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"Error: {bad}: apps[0].vol_io: missing"]


def test_cli_set_file(tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    path.write_text(json.dumps(jupiter_set(10).to_json()))
    code, out, _ = _run("--set-file", str(path), "--periods", "2", "--format", "json")
    assert code == 0
    (s,) = json.loads(out)["sets"]
    assert s["set"] == "two.json"
    # the file's T_min is max(w + time_io), not the authors' 16000 for set 10
    app_set = jupiter_set(10)
    direct = persched(app_set.apps, app_set.platform)
    assert s["persched"]["period"] == direct.period


def test_named_set_defaults_to_the_default_tmin() -> None:
    assert NamedSet("x", jupiter_set(3)).tmin is None
    assert jupiter(3).tmin == 16000.0
