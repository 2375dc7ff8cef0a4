"""The periodic-scheduling model ([PERSCHED] §2).

Units: rates in GB/s (``B`` for the platform, ``b`` per core), volumes in GB, times
in seconds. ``beta`` is a number of cores and may be fractional (the Jupiter sets of
[PERSCHED] §4.2 divide the Intrepid core counts by 64).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class App:
    """One periodic application: compute ``w`` s, then move ``vol_io`` GB, on ``beta`` cores."""

    name: str
    w: float
    vol_io: float
    beta: float


@dataclass(frozen=True, slots=True)
class Platform:
    """``B`` GB/s to storage in total, ``b`` GB/s per core; ``N`` cores for SysEff's 1/N.

    ``N`` is ``None`` for "the cores of the set": Σβ (every Jupiter set uses all 640
    cores, [PERSCHED] §4.2, and [PERSCHED-SIM] divides by 640).
    """

    B: float
    b: float
    N: float | None = None

    def cores(self, apps: Sequence[App]) -> float:
        return self.N if self.N is not None else sum(app.beta for app in apps)


def cap(app: App, platform: Platform) -> float:
    """The application's aggregate rate limit min(β·b, B) ([PERSCHED] §2)."""
    return min(app.beta * platform.b, platform.B)


def time_io(app: App, platform: Platform) -> float:
    """The dedicated-mode I/O time vol_io / min(β·b, B) ([PERSCHED] §2)."""
    return app.vol_io / cap(app, platform)


def rho(app: App, platform: Platform) -> float:
    """The congestion-free efficiency w / (w + time_io) ([PERSCHED] §2)."""
    return app.w / (app.w + time_io(app, platform))


def periodic_efficiency(app: App, n_per: int, period: float) -> float:
    """ρ̃_per = n_per·w / T ([PERSCHED] eq. (3))."""
    return n_per * app.w / period


def upper_bound(apps: Sequence[App], platform: Platform) -> float:
    """SysEff with ρ̃ replaced by ρ: (1/N) Σ β·ρ ([PERSCHED] eq. (5))."""
    return sum(app.beta * rho(app, platform) for app in apps) / platform.cores(apps)


def sys_eff(apps: Sequence[App], counts: Sequence[int], period: float, platform: Platform) -> float:
    """SysEff of a pattern: (1/N) Σ β·n_per·w / T ([PERSCHED] eq. (1) with eq. (3))."""
    total = sum(app.beta * n * app.w for app, n in zip(apps, counts, strict=True))
    return total / period / platform.cores(apps)


def slowdown(app: App, n_per: int, period: float, platform: Platform) -> float:
    """ρ̃_per/ρ = n_per·(w + time_io)/T, the inverse of an application's dilation."""
    return n_per * (app.w + time_io(app, platform)) / period


def dilation(
    apps: Sequence[App], counts: Sequence[int], period: float, platform: Platform
) -> float:
    """max_k ρ/ρ̃_per ([PERSCHED] eq. (2)); ``inf`` when an application has no instance."""
    worst = min(
        (slowdown(app, n, period, platform) for app, n in zip(apps, counts, strict=True)),
        default=1.0,
    )
    return math.inf if worst <= 0.0 else 1.0 / worst
