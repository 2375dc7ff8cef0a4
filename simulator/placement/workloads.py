"""The [DIST-IO] workload generator (§V-C; docs/simulator.md, "[DIST-IO] placement").

A set is K applications on N = 20 I/O resources and Q^cpu = 480 compute resources:

- K depends on the target I/O-load Θ, because the bound b of X exists only for
  c = Θ·N/K < 1: K is the smallest multiple of 10 with c ≤ ``C_MAX`` (= 0.8), and at
  least 10 (Θ ≤ 0.4 → K = 10, Θ = 0.5 → 20, Θ = 1 → 30, Θ = 2 → 50). A multiple of 10
  makes the paper's size classes whole numbers of applications.
- Size classes: 10 % / 30 % / 60 % of the applications (large / medium / small) use
  75 % / 20 % / 5 % of Q^cpu. A class's share is split equally: each application gets
  the floor of share/count, the remainder goes one by one to the first applications of
  the class, and every application gets at least 1 (so for K > 40 the small class holds
  more than its 24 cores; Q^cpu stays 480).
- p_j uniform in {2, …, 20}; a bandwidth curve b_j from one of the four profile shapes
  (``burstctl.policies.placement.profiles``), the shape drawn uniformly.
- Horizon 5,000 s: X ~ U[0, b] with log(1+b) = b·Θ·N/K (``x_bound``), then
  V_io = 5000·b_j(1)/(1+X) and T_cpu = 5000·(1 − 1/(1+X)), so
  T_cpu + T_cf_io(1) = 5000 and E[I/O-Stress(j, 1)] = log(1+b)/b = Θ·N/K, hence
  E[I/O-load(π_1)] = Θ. The phases split T_cpu and V_io equally.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

N_RESOURCES = 20  # N
Q_CPU = 480  # Q^cpu
HORIZON = 5000.0  # s, T_cpu + T_cf_io(1)
MIN_PHASES, MAX_PHASES = 2, 20
C_MAX = 0.8  # the largest Θ·N/K the generator uses
CLASSES = ((0.1, 0.75), (0.3, 0.20), (0.6, 0.05))  # (share of apps, share of Q^cpu)
MAX_LOAD = 2.0  # --load is in (0, MAX_LOAD]


def x_bound(c: float) -> float:
    """The b > 0 with log(1 + b) = c·b, for 0 < c < 1 (b = −1 − W₋₁(−c·e^{−c})/c).

    g(b) = log(1 + b) − c·b is concave with g(0) = 0 and g'(0) = 1 − c > 0, so it has
    one positive root, found by bisection to machine precision.
    """
    if not 0.0 < c < 1.0:
        raise ValueError(f"no bound for c = {c}: need 0 < c < 1")

    def g(b: float) -> float:
        return math.log1p(b) - c * b

    lo, hi = 0.0, 1.0
    while g(hi) > 0.0:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            break
        if g(mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def apps_for_load(load: float, n: int = N_RESOURCES) -> int:
    """K for a target I/O-load Θ: the smallest multiple of 10 with Θ·N/K ≤ C_MAX."""
    if not 0.0 < load <= MAX_LOAD:
        raise ValueError(f"load must be in (0, {MAX_LOAD:g}], got {load}")
    return 10 * max(1, math.ceil(load * n / (10 * C_MAX) - 1e-12))


def class_sizes(k: int, q_cpu: int = Q_CPU) -> list[int]:
    """Q_j of K applications: large first, then medium, then small (module docstring)."""
    counts = [round(k * frac) for frac, _ in CLASSES]
    counts[-1] = k - sum(counts[:-1])
    sizes: list[int] = []
    for count, (_, share) in zip(counts, CLASSES, strict=True):
        if count == 0:
            continue
        cores = round(q_cpu * share)
        base, extra = divmod(cores, count)
        sizes += [max(1, base + (1 if i < extra else 0)) for i in range(count)]
    return sizes


Curve = Callable[[int], float]


@dataclass(frozen=True, slots=True)
class GenApp:
    """One generated application: the model's inputs and its profile's shape."""

    name: str
    shape: str
    q: int  # Q_j
    phases: int  # p_j
    t_cpu: float  # T_cpu^j, s (all phases)
    v_io: float  # V_io^j (all phases), in the curve's volume unit
    bandwidth: tuple[float, ...]  # b_j(1..N)
    x: float  # X = T_cpu / T_cf_io(1)


def generate(
    load: float,
    rng: random.Random,
    draw_curve: Callable[[random.Random], tuple[str, Sequence[float]]],
    n: int = N_RESOURCES,
    q_cpu: int = Q_CPU,
) -> list[GenApp]:
    """One set of applications for target I/O-load ``load`` (module docstring).

    ``draw_curve(rng)`` returns (shape, [b(1), …, b(n)]).
    """
    k = apps_for_load(load, n)
    b = x_bound(load * n / k)
    apps = []
    for j, q in enumerate(class_sizes(k, q_cpu)):
        shape, curve = draw_curve(rng)
        bandwidth = tuple(float(v) for v in curve)
        if len(bandwidth) != n or min(bandwidth) <= 0.0:
            raise ValueError(f"curve of {shape!r} must give {n} positive values")
        phases = rng.randint(MIN_PHASES, MAX_PHASES)
        x = rng.uniform(0.0, b)
        apps.append(
            GenApp(
                name=f"app{j}",
                shape=shape,
                q=q,
                phases=phases,
                t_cpu=HORIZON * (1.0 - 1.0 / (1.0 + x)),
                v_io=HORIZON * bandwidth[0] / (1.0 + x),
                bandwidth=bandwidth,
                x=x,
            )
        )
    return apps


def io_load_one(apps: Sequence[GenApp], n: int = N_RESOURCES) -> float:
    """I/O-load(π_1) = (1/N)·Σ_j T_cf_io(1)/(T_cpu + T_cf_io(1)), straight from the draw."""
    total = 0.0
    for a in apps:
        t_io = a.v_io / a.bandwidth[0]
        total += t_io / (a.t_cpu + t_io)
    return total / n
