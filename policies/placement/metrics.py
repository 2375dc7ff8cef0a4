"""The objective metrics of [DIST-IO] §III-C: I/O-SlowDown ρ_j and its parts
ρ_j^io and ρ_j^con, Mean- and Max-I/O-SlowDown, I/O-spread and Machine-IdleTime. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .model import Profile


def _positive(name: str, x: float) -> None:
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a positive finite number, got {x!r}")


def best_bandwidth(profile: Profile, N: int) -> float:
    """b_j(n_perf^j) on 1..N: the bandwidth the slowdowns are measured against."""
    return max(profile.values[: min(profile.n_max, N)])


@dataclass(frozen=True, slots=True)
class SlowDown:
    """ρ_j = T/(V/b_j(n_perf)) and its decomposition ρ_j = ρ_j^io + ρ_j^con, where
    ρ_j^io = b_j(n_perf)/b_j(n_j) (not using n_perf) and ρ_j^con the rest (congestion)."""

    rho: float
    rho_io: float
    rho_con: float


def slowdown(io_time: float, volume: float, n: int, profile: Profile, N: int) -> SlowDown:
    """The slowdown of an application that moved ``volume`` in a measured (congested) I/O
    time ``io_time`` on ``n`` resources. ρ ≥ ρ_io ≥ 1 whenever ``io_time`` is at least the
    congestion-free time V/b_j(n)."""
    _positive("io_time", io_time)
    _positive("volume", volume)
    if not 1 <= n <= N:
        raise ValueError(f"count {n} is outside 1..{N}")
    best = best_bandwidth(profile, N)
    rho = io_time * best / volume
    rho_io = best / profile(n)
    return SlowDown(rho, rho_io, rho - rho_io)


def mean_slowdown(rhos: Sequence[float]) -> float:
    """Mean-I/O-SlowDown = (Σ_j ρ_j)/K ([DIST-IO] eq. (4))."""
    if not rhos:
        raise ValueError("no slowdowns")
    return sum(rhos) / len(rhos)


def max_slowdown(rhos: Sequence[float]) -> float:
    """Max-I/O-SlowDown, read as max_j ρ_j ([DIST-IO] does not define it)."""
    if not rhos:
        raise ValueError("no slowdowns")
    return max(rhos)


def resource_occupancy(busy: Sequence[float], horizon: float) -> list[float]:
    """I/O-res-occ O_i: the fraction of ``horizon`` each resource spent doing I/O."""
    _positive("horizon", horizon)
    return [b / horizon for b in busy]


def io_spread(occupancy: Sequence[float]) -> float:
    """I/O-spread = max_i O_i − min_i O_i ([DIST-IO] eq. (5)): the imbalance of the
    resources."""
    if not occupancy:
        raise ValueError("no resources")
    return max(occupancy) - min(occupancy)


def machine_idle_time(
    io_times: Sequence[float], qs: Sequence[int], horizon: float, q_cpu: int
) -> float:
    """Machine-IdleTime = Σ_i L^i·Q_i/(t·Q^cpu): the fraction of compute capacity idle
    because applications wait for I/O (L^i: application i's total I/O time in [0, t],
    congestion included). Lower is better."""
    _positive("horizon", horizon)
    if q_cpu < 1:
        raise ValueError(f"q_cpu must be ≥ 1, got {q_cpu}")
    if len(io_times) != len(qs):
        raise ValueError(f"{len(io_times)} I/O times but {len(qs)} sizes")
    return sum(t * q for t, q in zip(io_times, qs, strict=True)) / (horizon * q_cpu)
