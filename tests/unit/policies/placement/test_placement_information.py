"""Information levels ([DIST-IO] Table II) and ``advise``: the allocator the data allow, the
per-application fallbacks, the placement rule and the reported I/O-load."""

from __future__ import annotations

import random

import pytest
from placement_instances import Q_CPU, instance

from burstctl.policies.placement.allocators import best_bdw, static, tcpu_allocator
from burstctl.policies.placement.information import advise
from burstctl.policies.placement.model import App, Profile, io_load, n_perf
from burstctl.policies.placement.placements import (
    greedy_clairvoyant,
    greedy_non_clairvoyant,
)

RNG = random.Random(0)
PEAK = Profile((1.0, 1.8, 2.4, 2.0))


def full(j: int, q: int = 40) -> App:
    return App(f"f{j}", q, t_cpu=4000.0, v_io=1000.0, phases=4, profile=PEAK)


def test_level_two_everywhere_uses_tcpu_and_greedy_clairvoyant() -> None:
    apps, N = instance(3)
    adv = advise(apps, N, Q_CPU)
    assert adv.level == 2
    assert adv.allocator_used == "tcpu-allocator"
    assert adv.placement_used == "greedy-clairvoyant"
    assert adv.fallbacks == {}
    assert list(adv.allocation) == tcpu_allocator(apps, N, Q_CPU, RNG)
    assert [list(s) for s in adv.placement] == greedy_clairvoyant(
        apps, list(adv.allocation), N, RNG
    )
    assert adv.io_load == pytest.approx(io_load(apps, list(adv.allocation), N))
    assert adv.io_load_apps == len(apps)


def test_level_one_uses_best_bdw_on_hints_and_gnc() -> None:
    apps = [App("h1", 10, n_perf_hint=3), App("h2", 10, profile=PEAK), App("h3", 5, n_perf_hint=9)]
    adv = advise(apps, 6, Q_CPU)
    assert adv.level == 1
    assert adv.allocator_used == "best-bdw"
    assert adv.allocation == (3, 3, 6)
    assert adv.placement_used == "greedy-non-clairvoyant"
    assert adv.io_load_apps == 0 and adv.io_load == 0.0


def test_level_zero_uses_static() -> None:
    apps = [App("a", 240), App("b", 120), App("c", 1)]
    adv = advise(apps, 20, Q_CPU)
    assert (adv.level, adv.allocator_used) == (0, "static")
    assert list(adv.allocation) == static(apps, 20, Q_CPU, RNG) == [10, 5, 1]
    assert [list(s) for s in adv.placement] == greedy_non_clairvoyant(apps, [10, 5, 1], 20, RNG)


def test_mixed_levels_fall_back_per_application() -> None:
    """Default for a mix: TCPU for the level-2 applications; the level-1 one gets n_perf
    (BestBdw), the level-0 one Static; each is named with its reason; the placement falls to
    GNC; the I/O-load counts the level-2 applications only."""
    apps = [full(0), App("hint", 48, n_perf_hint=2), full(1), App("bare", 96)]
    N = 8
    adv = advise(apps, N, Q_CPU)
    assert adv.level == 0
    assert adv.allocator_used == "tcpu-allocator"
    assert adv.per_app_allocator == ("tcpu-allocator", "best-bdw", "tcpu-allocator", "static")
    assert set(adv.fallbacks) == {"hint", "bare"}
    assert "level 1: best-bdw" in adv.fallbacks["hint"]
    assert "level 0: static" in adv.fallbacks["bare"]
    assert "V_io, T_cpu and b_j" in adv.fallbacks["bare"]
    sub = [apps[0], apps[2]]
    assert [adv.allocation[0], adv.allocation[2]] == tcpu_allocator(sub, N, Q_CPU, RNG)
    assert adv.allocation[1] == 2
    assert adv.allocation[3] == static([apps[3]], N, Q_CPU, RNG)[0] == 2
    assert adv.placement_used == "greedy-non-clairvoyant"
    assert adv.io_load == pytest.approx(io_load(sub, [adv.allocation[0], adv.allocation[2]], N))
    assert adv.io_load_apps == 2


def test_requested_best_bdw_falls_back_only_where_n_perf_is_unknown() -> None:
    apps = [full(0), App("bare", 96)]
    adv = advise(apps, 8, Q_CPU, allocator="best-bdw")
    assert adv.allocation == (n_perf(apps[0], 8), 2)
    assert list(adv.fallbacks) == ["bare"]
    assert adv.per_app_allocator == ("best-bdw", "static")


def test_requested_gc_without_data_falls_back_to_gnc_with_a_note() -> None:
    apps = [full(0), App("hint", 48, n_perf_hint=2)]
    adv = advise(apps, 8, Q_CPU, placement="greedy-clairvoyant")
    assert adv.placement_used == "greedy-non-clairvoyant"
    assert "greedy-clairvoyant needs" in adv.placement_note
    adv = advise([full(0), full(1)], 8, Q_CPU, placement="random", rng=random.Random(5))
    assert adv.placement_used == "random"
    assert adv.placement_note == ""


def test_no_application_has_the_requested_data() -> None:
    apps = [App("a", 48), App("b", 48)]
    adv = advise(apps, 8, Q_CPU, allocator="tcpu-allocator")
    assert adv.allocator_used == "static"
    assert set(adv.fallbacks) == {"a", "b"}


def test_mckp_keeps_its_bound_with_fallbacks() -> None:
    apps = [full(j) for j in range(5)] + [App("bare", 200)]
    N = 4
    adv = advise(apps, N, Q_CPU, allocator="mckp")
    # N·⌈K/N⌉ = 8 over all six; 'bare' takes static's 2, the five others share 6
    assert adv.allocation[5] == 2
    assert sum(adv.allocation) <= 8
    assert all(n >= 1 for n in adv.allocation)


def test_advice_agrees_with_best_bdw_under_light_load() -> None:
    """Under light load the default (TCPU) is BestBdw, as the paper says."""
    apps = [App(f"l{j}", 10, t_cpu=1e6, v_io=10.0, profile=PEAK) for j in range(3)]
    adv = advise(apps, 20, Q_CPU)
    assert io_load(apps, best_bdw(apps, 20, Q_CPU, RNG), 20) <= 1
    assert list(adv.allocation) == best_bdw(apps, 20, Q_CPU, RNG) == [3, 3, 3]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"allocator": "fastest"}, "allocator"),
        ({"placement": "nearest"}, "placement"),
        ({"N": 0}, "N"),
        ({"q_cpu": 0}, "q_cpu"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"apps": [full(0)], "N": 4, "q_cpu": Q_CPU, **kwargs}
    with pytest.raises(ValueError, match=field):
        advise(**args)  # type: ignore[arg-type]


def test_empty() -> None:
    adv = advise([], 4, Q_CPU)
    assert adv.allocation == () and adv.placement == ()
    assert adv.io_load == 0.0
