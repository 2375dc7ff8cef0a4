"""Synthetic Intrepid and Mira sets ([PERSCHED] §4.4, Table 5).

Per set: start with all ``N`` cores free; while some are free, draw an integer ``x``
uniformly in ``1 … max(1, free/4096 - 1)`` and add an application on ``4096·x`` cores,
with ``w`` uniform in ``[2, 7500]`` s on Intrepid (``[0.5, 1875]`` s on Mira, whose
nodes are about four times faster) and ``vol_io`` uniform in ``[100 GB, 35 TB]``.

[PERSCHED] gives no seed and [PERSCHED-SIM]'s ``generate_sets.py`` is not in its
repository, so the sets here are new draws from the same distributions, not the
authors' sets 11–110. Volumes are in GB (35 TB = 35,000 GB).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from burstctl.policies.persched.model import App, Platform
from burstctl.policies.persched.sets import AppSet


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    B: float  # GB/s
    b: float  # GB/s per core
    N: int  # cores
    w_range: tuple[float, float]  # s


# [PERSCHED] Table 5 and §4.4
INTREPID = Machine("intrepid", 64.0, 0.0125, 40_960, (2.0, 7_500.0))
MIRA = Machine("mira", 240.0, 0.03125, 49_152, (0.5, 1_875.0))
MACHINES = {m.name: m for m in (INTREPID, MIRA)}
VOL_RANGE = (100.0, 35_000.0)  # GB
CORES_STEP = 4096


def synthetic_set(machine: Machine, seed: int, *, compute_speedup: float = 1.0) -> AppSet:
    """One random set filling ``machine.N`` cores; the same seed gives the same set.

    ``compute_speedup`` divides every ``w`` (the GFlops/node scaling of [PERSCHED]
    Fig. 9).
    """
    if compute_speedup <= 0:
        raise ValueError(f"compute_speedup: must be > 0, got {compute_speedup}")
    rng = random.Random(seed)
    free = machine.N
    apps: list[App] = []
    while free > 0:
        x = rng.randint(1, max(1, free // CORES_STEP - 1))
        beta = CORES_STEP * x
        w = rng.uniform(*machine.w_range) / compute_speedup
        vol = rng.uniform(*VOL_RANGE)
        apps.append(App(f"app{len(apps)}", w, vol, float(beta)))
        free -= beta
    return AppSet(Platform(machine.B, machine.b), tuple(apps))
