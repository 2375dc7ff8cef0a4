"""The synthetic workload generator of the bandwidth-sharing paper ([BWS] §6.2.1).

Owns the construction of one synthetic instance: m = 60 applications, all with
b_i = B = 1 (volumes are seconds at full bandwidth), in three classes of mean
iteration length µ — ``n_small`` small (1000), 20 medium (10,000) and
40 − ``n_small`` big (100,000) — with σ′ = µσ, noise ν and trace length h.

Draws follow the reference generator ([BWS-SIM] generate.py: ``generate``) in
the same order, so that ``generate(..., seed=s)`` writes the same values as the
reference script after ``random.seed(s)``:

1. u_k ~ U[0, 1] for all 60 applications; φ_i = u_i·W_GOAL / Σ_k u_k;
2. per application, in line order: ω_i ~ N(µ_i, µ_iσ), redrawn while ω_i ≤ 2;
   n_i = ⌈h/ω_i⌉; offset w_i^(0) ~ U[0, ω_i]; then for j = 1..n_i
   v^(j) = (1 + γ_io)·φ_iω_i and w^(j) = (1 + γ_cpu)·(1 − φ_i)ω_i with
   γ ~ U[−ν, ν] (the I/O's γ drawn first).

Lines read ``App<i> 1 0 0 0 2n+1 ω W offset (io cpu)×n``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from burstctl.simulator.bws.instance import WORK_FIRST, Application

APPLICATIONS = 60  # m
MEDIUM = 20
SMALL_MEAN = 1_000.0
MEDIUM_MEAN = 10_000.0
BIG_MEAN = 100_000.0
HORIZON = 2_000_000.0  # h, the trace length (not a decision horizon)
MIN_ITERATION = 2.0  # the reference redraws ω while ω <= 2


@dataclass(frozen=True, slots=True)
class GeneratorParams:
    """One setting of the synthetic campaign ([BWS] Figure 2 defaults)."""

    pressure: float  # W_GOAL
    n_small: int = 20
    sigma: float = 0.5  # σ: ω's standard deviation as a fraction of µ
    nu: float = 0.5  # ν: per-phase noise amplitude
    horizon: float = HORIZON  # h

    def __post_init__(self) -> None:
        if not (math.isfinite(self.pressure) and self.pressure > 0.0):
            raise ValueError(f"pressure must be > 0, got {self.pressure}")
        if not 0 <= self.n_small <= APPLICATIONS - MEDIUM:
            raise ValueError(f"n_small must be in [0, {APPLICATIONS - MEDIUM}], got {self.n_small}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0.0):
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if not (math.isfinite(self.nu) and 0.0 <= self.nu <= 1.0):
            raise ValueError(f"nu must be in [0, 1], got {self.nu}")
        if not (math.isfinite(self.horizon) and self.horizon > 0.0):
            raise ValueError(f"horizon must be > 0, got {self.horizon}")


def class_means(n_small: int) -> list[float]:
    """µ_i per application, in line order: small, medium, big."""
    big = APPLICATIONS - MEDIUM - n_small
    return [SMALL_MEAN] * n_small + [MEDIUM_MEAN] * MEDIUM + [BIG_MEAN] * big


def generate(params: GeneratorParams, seed: int) -> list[Application]:
    """One instance; the same ``seed`` gives the same instance."""
    rng = random.Random(seed)
    u = [rng.uniform(0.0, 1.0) for _ in range(APPLICATIONS)]
    total = sum(u)
    phi = [x * (params.pressure / total) for x in u]  # φ_i = u_i·W/Σu
    if max(phi) >= 1.0:
        # t_cpu = (1 − φ_i)ω_i would not be positive
        raise ValueError(f"pressure {params.pressure} gives an I/O fraction φ >= 1 (seed {seed})")
    apps = []
    for i, mu in enumerate(class_means(params.n_small)):
        omega = 0.0
        while omega <= MIN_ITERATION:  # N(µ, µσ) truncated (reference: > 2)
            omega = rng.normalvariate(mu, mu * params.sigma)
        n = math.ceil(params.horizon / omega)  # n_i = ⌈h/ω_i⌉
        values = [rng.uniform(0.0, omega)]  # offset work w_i^(0) ~ U[0, ω_i]
        t_cpu = omega * (1.0 - phi[i])
        t_io = omega * phi[i]
        for _ in range(n):
            values.append((1.0 + rng.uniform(-params.nu, params.nu)) * t_io)
            values.append((1.0 + rng.uniform(-params.nu, params.nu)) * t_cpu)
        apps.append(
            Application(
                name=f"App{i}",
                bandwidth=1.0,
                age=0.0,
                progress=0.0,
                age_phase=0.0,
                w_iter=omega,
                initial_type=WORK_FIRST,
                values=tuple(values),
            )
        )
    return apps
