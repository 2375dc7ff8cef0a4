"""The model of [DIST-IO] §III: identical I/O resources, applications with a bandwidth
profile b_j(n), I/O-Stress, the characteristic counts n_perf and n_sys, I/O-load and
CPUload. Pure: no I/O, no clock, no threads.

Units are the caller's: ``v_io`` in bytes (or any volume) and a ``Profile`` in the same
volume per second; ``t_cpu`` in seconds. Only ratios enter the allocators.

The domain of b_j(n), which the paper leaves open ([DIST-IO] §V-A), is settled here, see
``Profile``: b_j is known on 1..n_max (measured, interpolated between measured counts, or
scaled down linearly below the smallest measured count) and **capped** beyond n_max:
b_j(n) = b_j(n_max) for n > n_max. n_perf and n_sys are searched on 1..min(n_max, N) only, so
they never leave the known part; an allocator that ignores b_j (Random, Static) may give more
than n_max, and such a count is costed with the capped value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class Profile:
    """b_j as a function of the resource count n: ``values[n - 1]`` is b_j(n) for
    n = 1..n_max (every value > 0); ``measured`` the counts that were actually measured (the
    others were filled by ``from_points``).

    Beyond n_max, b_j(n) = b_j(n_max) (capped: the paper's OST data cover 1..8 OSTs while
    Static may give 15 of 20 resources, [DIST-IO] §V-A). A capped count
    never beats n_max (same bandwidth, more resources, strictly more I/O-Stress), so n_perf
    and n_sys stay within 1..n_max.
    """

    values: tuple[float, ...]
    measured: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a profile needs b(1) at least")
        for n, b in enumerate(self.values, start=1):
            if not (math.isfinite(b) and b > 0):
                raise ValueError(f"b({n}) must be a positive finite number, got {b!r}")
        if not self.measured:
            object.__setattr__(self, "measured", frozenset(range(1, len(self.values) + 1)))

    @classmethod
    def from_points(cls, points: Mapping[int, float]) -> Profile:
        """A profile from measured counts ``{n: b(n)}`` (n ≥ 1, b > 0). Between two measured
        counts b is interpolated linearly; below the smallest measured count n_lo it is
        b(n_lo)·n/n_lo (each resource delivering what it delivered at n_lo); above the largest
        it is capped (see the class)."""
        if not points:
            raise ValueError("a profile needs at least one measured count")
        for n, b in points.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"resource counts must be integers ≥ 1, got {n!r}")
            if not (math.isfinite(b) and b > 0):
                raise ValueError(f"b({n}) must be a positive finite number, got {b!r}")
        counts = sorted(points)
        lo, hi = counts[0], counts[-1]
        values = [0.0] * hi
        for n in range(1, lo):
            values[n - 1] = points[lo] * n / lo
        for a, c in itertools.pairwise(counts):
            for n in range(a, c):
                values[n - 1] = points[a] + (points[c] - points[a]) * (n - a) / (c - a)
        values[hi - 1] = points[hi]
        return cls(tuple(float(v) for v in values), frozenset(counts))

    @classmethod
    def flat(cls, b: float) -> Profile:
        """A profile with no impact of n (b(n) = b for every n)."""
        return cls((float(b),))

    @property
    def n_max(self) -> int:
        """The largest count b is known at; beyond it b is capped."""
        return len(self.values)

    def __call__(self, n: int) -> float:
        """b(n) for n ≥ 1 (capped beyond ``n_max``)."""
        if n < 1:
            raise ValueError(f"resource count must be ≥ 1, got {n}")
        return self.values[min(n, len(self.values)) - 1]

    def scaled(self, factor: float) -> Profile:
        """The same shape with every bandwidth multiplied by ``factor`` (> 0)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be positive, got {factor!r}")
        return Profile(tuple(v * factor for v in self.values), self.measured)

    def array(self, N: int) -> NDArray[np.float64]:
        """b(1..N) as an array (capped beyond ``n_max``)."""
        out = np.empty(N, dtype=np.float64)
        m = min(N, len(self.values))
        out[:m] = self.values[:m]
        out[m:] = self.values[-1]
        return out


@dataclass(frozen=True, slots=True)
class App:
    """One application 𝒜_j of [DIST-IO] Table I (in burstctl: a job).

    ``q`` Q_j compute resources (always known: the resource manager gives it); ``t_cpu``
    T_cpu^j (s) and ``v_io`` V_io^j (volume), accumulated over the ``phases`` p_j phases;
    ``profile`` b_j; ``n_perf_hint`` the count of best bandwidth when only that is known
    (information level 1, [DIST-IO] §IV-C). ``None`` marks what is unknown.
    """

    app_id: str
    q: int
    t_cpu: float | None = None
    v_io: float | None = None
    phases: int = 1
    profile: Profile | None = None
    n_perf_hint: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.q, bool) or not isinstance(self.q, int) or self.q < 1:
            raise ValueError(f"{self.app_id}: q (compute resources) must be an integer ≥ 1")
        if self.phases < 1:
            raise ValueError(f"{self.app_id}: phases must be ≥ 1")
        if self.t_cpu is not None and not (math.isfinite(self.t_cpu) and self.t_cpu >= 0):
            raise ValueError(f"{self.app_id}: t_cpu must be a finite number ≥ 0")
        if self.v_io is not None and not (math.isfinite(self.v_io) and self.v_io > 0):
            raise ValueError(f"{self.app_id}: v_io must be a finite number > 0")
        if self.n_perf_hint is not None and self.n_perf_hint < 1:
            raise ValueError(f"{self.app_id}: n_perf_hint must be ≥ 1")

    @property
    def level(self) -> int:
        """The information level of this application ([DIST-IO] Table II, §IV-C):
        2 with V_io, T_cpu and b_j; 1 with n_perf only (a hint or a profile without V_io or
        T_cpu); 0 with Q_j only."""
        if self.profile is not None and self.t_cpu is not None and self.v_io is not None:
            return 2
        if self.profile is not None or self.n_perf_hint is not None:
            return 1
        return 0


def _require(app: App) -> tuple[Profile, float, float]:
    if app.profile is None or app.t_cpu is None or app.v_io is None:
        raise ValueError(f"{app.app_id}: needs V_io, T_cpu and b_j (information level 2)")
    return app.profile, app.t_cpu, app.v_io


def _check_n(n: int, N: int | None = None) -> None:
    if n < 1 or (N is not None and n > N):
        raise ValueError(f"resource count must be in 1..{N or '∞'}, got {n}")


def t_cf_io(app: App, n: int) -> float:
    """T_cf_io^j(n) = V_io^j / b_j(n): the congestion-free I/O time on n resources."""
    profile, _, v_io = _require(app)
    _check_n(n)
    return v_io / profile(n)


def io_stress(app: App, n: int) -> float:
    """I/O-Stress(j, n) = n·T_cf_io(n) / (T_cpu + T_cf_io(n)) ([DIST-IO] §III-B)."""
    _, t_cpu, _ = _require(app)
    t = t_cf_io(app, n)
    return n * t / (t_cpu + t)


def cpu_load(app: App, n: int) -> float:
    """CPUload(j, n) = Q_j·T_cpu / (T_cpu + T_cf_io(n)) ([DIST-IO] §IV-A, TCPU-Allocator)."""
    _, t_cpu, _ = _require(app)
    return app.q * t_cpu / (t_cpu + t_cf_io(app, n))


def n_perf(app: App, N: int) -> int:
    """n_perf^j = argmax_n b_j(n) over 1..min(n_max, N), ties toward the smallest n. Without a
    profile, the ``n_perf_hint`` capped at N."""
    _check_n(N)
    if app.profile is None:
        if app.n_perf_hint is None:
            raise ValueError(f"{app.app_id}: neither b_j nor n_perf is known")
        return min(app.n_perf_hint, N)
    values = app.profile.values[: min(app.profile.n_max, N)]
    return int(np.argmax(values)) + 1  # numpy returns the first maximum


def stress_row(app: App, N: int) -> NDArray[np.float64]:
    """I/O-Stress(j, n) for n = 1..N as an array (index n − 1)."""
    profile, t_cpu, v_io = _require(app)
    t = v_io / profile.array(N)
    return np.arange(1, N + 1, dtype=np.float64) * t / (t_cpu + t)


def cpu_row(app: App, N: int) -> NDArray[np.float64]:
    """CPUload(j, n) for n = 1..N as an array (index n − 1)."""
    profile, t_cpu, v_io = _require(app)
    t = v_io / profile.array(N)
    return app.q * t_cpu / (t_cpu + t)


def n_sys(app: App, N: int) -> int:
    """n_sys^j = argmin_n I/O-Stress(j, n), ties toward the smallest n.

    Searched on 1..n_perf: for n > n_perf, T_cf_io(n) ≥ T_cf_io(n_perf) and n > n_perf, so
    the stress is strictly larger (Lemma 1 of [DIST-IO] §III-B, whose proof the paper omits);
    restricting the search makes n_sys ≤ n_perf hold exactly in floating point too, and the
    minimum is that over 1..N."""
    top = n_perf(app, N)
    row = stress_row(app, top)
    return int(np.argmin(row)) + 1


def io_load(apps: Sequence[App], pi: Sequence[int], N: int) -> float:
    """I/O-load(π) = (1/N)·Σ_j I/O-Stress(j, π(j)) ([DIST-IO] eq. (3)); > 1: saturated."""
    if len(apps) != len(pi):
        raise ValueError(f"{len(apps)} applications but {len(pi)} counts")
    _check_n(N)
    total = 0.0
    for app, n in zip(apps, pi, strict=True):
        _check_n(n, N)
        total += io_stress(app, n)
    return total / N
