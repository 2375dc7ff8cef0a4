"""The synthetic generator ([BWS] §6.2.1, [BWS-SIM] generate.py): determinism and shape."""

from __future__ import annotations

import math

import pytest

from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import format_instance, parse_instance, prepare_window


def test_same_seed_same_instance() -> None:
    params = GeneratorParams(pressure=0.8, horizon=200_000)
    assert format_instance(generate(params, 7)) == format_instance(generate(params, 7))
    assert format_instance(generate(params, 7)) != format_instance(generate(params, 8))


@pytest.mark.parametrize("n_small", [0, 20, 40])
def test_shape(n_small: int) -> None:
    params = GeneratorParams(pressure=0.5, n_small=n_small, sigma=0.1, nu=0.2, horizon=500_000)
    apps = generate(params, 1)
    assert len(apps) == 60
    assert [a.name for a in apps] == [f"App{i}" for i in range(60)]
    means = [1_000] * n_small + [10_000] * 20 + [100_000] * (40 - n_small)
    for app, mu in zip(apps, means, strict=True):
        assert (app.bandwidth, app.age, app.progress, app.age_phase) == (1, 0, 0, 0)
        assert app.initial_type == "W" and not app.io_first
        assert 0.5 * mu < app.w_iter < 1.5 * mu  # σ = 0.1: within 5σ
        n = math.ceil(500_000 / app.w_iter)
        assert len(app.values) == 2 * n + 1
        assert 0 <= app.values[0] <= app.w_iter  # offset ~ U[0, ω]
        assert all(v > 0 for v in app.values)
    # the text parses back to the same values
    assert [a.values for a in parse_instance(format_instance(apps))] == [a.values for a in apps]


def test_pressure_is_near_the_goal() -> None:
    for goal in (0.2, 1.1):
        window = prepare_window(generate(GeneratorParams(pressure=goal), 3))
        assert 0.8 * goal < window.load < 1.2 * goal
        assert 1_000_000 < window.horizon <= 2_100_000


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pressure": 0.0},
        {"pressure": -1.0},
        {"pressure": math.nan},
        {"pressure": 1.0, "n_small": 41},
        {"pressure": 1.0, "sigma": -0.1},
        {"pressure": 1.0, "nu": 1.5},
        {"pressure": 1.0, "horizon": 0.0},
    ],
)
def test_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GeneratorParams(**kwargs)  # type: ignore[arg-type]
