"""The synthetic Intrepid/Mira sets of [PERSCHED] §4.4: shape, determinism, validity."""

from __future__ import annotations

import pytest

from burstctl.policies.persched import persched, validate
from burstctl.policies.persched.synthetic import INTREPID, MIRA, Machine, synthetic_set


@pytest.mark.parametrize("machine", [INTREPID, MIRA])
def test_sets_fill_the_machine(machine: Machine) -> None:
    sizes = set()
    for seed in range(40):
        s = synthetic_set(machine, seed)
        assert (s.platform.B, s.platform.b) == (machine.B, machine.b)
        assert sum(a.beta for a in s.apps) == machine.N
        for app in s.apps:
            assert app.beta % 4096 == 0
            assert machine.w_range[0] <= app.w <= machine.w_range[1]
            assert 100.0 <= app.vol_io <= 35_000.0
        sizes.add(len(s.apps))
    assert len(sizes) > 2  # the number of applications varies


def test_same_seed_same_set() -> None:
    assert synthetic_set(MIRA, 3) == synthetic_set(MIRA, 3)
    assert synthetic_set(MIRA, 3) != synthetic_set(MIRA, 4)
    fast = synthetic_set(MIRA, 3, compute_speedup=4.0)
    assert [a.w * 4 for a in fast.apps] == pytest.approx([a.w for a in synthetic_set(MIRA, 3).apps])


@pytest.mark.parametrize("seed", range(8))
def test_persched_on_mira_sets_validates(seed: int) -> None:
    s = synthetic_set(MIRA, seed)
    result = persched(s.apps, s.platform)
    assert validate(result.pattern, s.platform, sys_eff=result.sys_eff) == []
    assert 0 < result.sys_eff <= result.upper_bound
