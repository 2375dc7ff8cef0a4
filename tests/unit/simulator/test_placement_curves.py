"""The measured bandwidth curves of [FORGE] as a curve source of the [DIST-IO] generator
(simulator/placement/curves.py; docs/simulator.md, "[DIST-IO] placement"): the data file
loads into profiles on the domain docs/placement.md settles, the shape rule, the draw's
scaling, the class curves, and a set generated from them runs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from burstctl.policies.placement.model import App, Profile, n_perf
from burstctl.simulator.placement import curves, runs

ROOT = Path(__file__).resolve().parents[3]
SHAPES = {"ascent", "descent", "peak", "neutral"}


def best_count(p: Profile) -> int:
    return n_perf(App("a", q=1, profile=p), 20)


def test_the_data_file_loads_into_profiles_on_the_capped_domain() -> None:
    data = curves.measured()
    assert len(data) == 189 and len({c.name for c in data}) == 189
    for c in data:
        assert c.counts == (1, 2, 4, 8)
        assert min(c.reps) >= 4 and min(c.mean) > 0 and min(c.sd) >= 0
        p = c.profile
        assert p.measured == frozenset(c.counts) and p.n_max == 8
        assert [p(n) for n in c.counts] == pytest.approx(c.mean)
        # linear between measured counts, capped beyond the largest (docs/placement.md)
        assert p(3) == pytest.approx((c.mean[1] + c.mean[2]) / 2)
        assert p(6) == pytest.approx((c.mean[2] + c.mean[3]) / 2)
        assert p(20) == p(8)
        # n_perf lies where b is measured: the count of the largest mean
        assert best_count(p) == c.counts[c.mean.index(max(c.mean))]
    assert {c.shape for c in data} == SHAPES


def test_the_data_file_and_the_references_name_the_same_commit() -> None:
    source = json.loads((ROOT / "simulator/placement/data/forge_mn4.json").read_text())["source"]
    assert source["repository"] == "https://github.com/jeanbez/forge-evaluation"
    assert source["commit"] in (ROOT / "docs/references.md").read_text()


@pytest.mark.parametrize(
    ("mean", "sd", "shape"),
    [
        ([100, 200, 400, 800], [5, 5, 5, 5], "ascent"),
        ([800, 400, 200, 100], [5, 5, 5, 5], "descent"),
        ([100, 300, 200, 100], [5, 5, 5, 5], "peak"),
        ([100, 110, 105, 95], [30, 30, 30, 30], "neutral"),  # within the runs' spread
        ([100, 100, 50, 50], [1, 1, 1, 1], "descent"),  # a tie goes to the smaller count
    ],
)
def test_shape_rule(mean: list[float], sd: list[float], shape: str) -> None:
    assert curves.classify((1, 2, 4, 8), mean, sd, (5, 5, 5, 5)) == shape


def test_a_drawn_curve_is_a_measured_shape_scaled_as_the_synthetic_b1() -> None:
    ratios = {tuple(round(v / c.mean[0], 9) for v in c.mean): c.shape for c in curves.measured()}
    rng = random.Random(5)
    for _ in range(50):
        shape, p = curves.draw_measured(rng)
        assert 0.5 <= p(1) <= 2.0  # profiles.draw_b1
        assert ratios[tuple(round(p(n) / p(1), 9) for n in (1, 2, 4, 8))] == shape


def test_measured_class_curves_keep_their_shape() -> None:
    best = {s: best_count(curves.class_profile("measured", s)) for s in SHAPES}
    assert best["ascent"] == 8 and best["descent"] == 1 and 1 < best["peak"] < 8
    for s in SHAPES:
        assert curves.class_profile("measured", s)(1) == pytest.approx(1.0, abs=0.15)
    with pytest.raises(ValueError, match="curve source"):
        curves.drawer("real")


def test_a_set_on_measured_curves_runs_exact_and_with_class_inputs() -> None:
    pset = runs.make_set(0.8, 3, 0, "measured")
    assert pset.curves == "measured" and pset == runs.make_set(0.8, 3, 0, "measured")
    assert pset.apps != runs.make_set(0.8, 3, 0).apps
    for inaccurate in (False, True):
        row = runs.run_one(pset, "best-bdw", "greedy-non-clairvoyant", 3, inaccurate)
        assert row["max_slowdown"] >= row["mean_slowdown"] >= 1.0 - 1e-9
        assert row["rho_io"] >= 1.0 - 1e-12


def test_the_regeneration_script_aggregates_runs_per_pattern_and_count() -> None:
    import forge_curves

    def row(forwarders: int, bandwidth: float) -> dict[str, str]:
        return {
            "forwarders": str(forwarders),
            "processes": "96",
            "clients": "8",
            "layout": "1",
            "spatiality": "0",
            "request": "32",
            "operation": "write",
            "bandwidth": str(bandwidth),
        }

    rows = [row(1, 10.0), row(1, 14.0), row(2, 30.0), row(2, 30.0), row(0, 99.0)]
    (entry,) = forge_curves.curves(rows)
    assert entry["name"] == "96p-8c-shared-file-contiguous-32k"
    assert entry["n"] == [1, 2]  # 0 forwarders (direct file-system access) left out
    assert entry["mean"] == [12.0, 30.0] and entry["reps"] == [2, 2]
    assert entry["sd"] == [pytest.approx(2.828, abs=1e-3), 0.0]
