"""The allocation step of [DIST-IO] §IV-A: how many I/O resources each application gets.

Every allocator has one signature, ``(apps, N, q_cpu, rng) -> list[int]`` (a count in 1..N
per application, in the order of ``apps``); ``ALLOCATORS`` maps the command-line names to
them and ``allocate`` looks one up. ``rng`` is used by ``random`` only. Pure: no I/O, no
clock, no threads.

Readings of the paper's gaps (docs/placement.md, "Readings"):

- Random draws uniformly in 1..N (b_j is defined there, capped beyond n_max).
- Static rounds Q_j·N/Q^cpu half up, then clamps to 1..N.
- TCPU-Allocator, Algorithm 1 line 15: the gain of a candidate n is measured against π(i),
  CPUload(i, n) − CPUload(i, π(i)) (the stated intent, "maximise the sum of CPUload"), not
  against the intermediate π̃(i) of the literal layout. The feasibility test is written
  I/O-load ≤ 1 − ΔStress/N. Ties in argmax go to the lowest index.
- MCKP (Bez et al., [DIST-IO] §V-B, §VII-A): maximise Σ_j b_j(n_j) subject to Σ_j n_j ≤ C, n_j ≥ 1,
  with C = N·⌈K/N⌉: exclusive resources when K ≤ N, and otherwise the fewest applications per
  resource that lets every application have one. Exact, by dynamic programming over
  (applications × capacity).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .model import App, cpu_row, n_perf, n_sys, stress_row

Allocator = Callable[[Sequence[App], int, int, random.Random], list[int]]


def _check(N: int, q_cpu: int) -> None:
    if N < 1:
        raise ValueError(f"N (I/O resources) must be ≥ 1, got {N}")
    if q_cpu < 1:
        raise ValueError(f"q_cpu (compute resources) must be ≥ 1, got {q_cpu}")


def random_allocation(apps: Sequence[App], N: int, q_cpu: int, rng: random.Random) -> list[int]:
    """Random: each application gets a count drawn uniformly in 1..N."""
    _check(N, q_cpu)
    return [rng.randint(1, N) for _ in apps]


def static(apps: Sequence[App], N: int, q_cpu: int, rng: random.Random) -> list[int]:
    """Static: n_j = Q_j·N/Q^cpu rounded half up to the closest positive integer (at most N),
    a static mapping of compute nodes to I/O nodes."""
    _check(N, q_cpu)
    return [min(N, max(1, math.floor(a.q * N / q_cpu + 0.5))) for a in apps]


def best_bdw(apps: Sequence[App], N: int, q_cpu: int, rng: random.Random) -> list[int]:
    """BestBdw: n_j = n_perf^j (needs argmax b_j: a profile or ``n_perf_hint``)."""
    _check(N, q_cpu)
    return [n_perf(a, N) for a in apps]


def nsys_allocator(apps: Sequence[App], N: int, q_cpu: int, rng: random.Random) -> list[int]:
    """Nsys-Allocator: n_j = n_sys^j, i.e. π_sys, the allocation of least I/O-load (needs
    V_io, T_cpu and b_j)."""
    _check(N, q_cpu)
    return [n_sys(a, N) for a in apps]


@dataclass(frozen=True, slots=True)
class Tables:
    """I/O-Stress and CPUload per (application, count) as K × N arrays (column n − 1), with
    n_perf and n_sys per application: what TCPU-Allocator reads, computed once."""

    stress: NDArray[np.float64]
    cpu: NDArray[np.float64]
    n_perf: list[int]
    n_sys: list[int]

    @classmethod
    def build(cls, apps: Sequence[App], N: int) -> Tables:
        """The tables of ``apps`` over 1..N (every application needs level-2 data)."""
        K = len(apps)
        stress = np.empty((K, N), dtype=np.float64)
        cpu = np.empty((K, N), dtype=np.float64)
        perf: list[int] = []
        sys_: list[int] = []
        for i, a in enumerate(apps):
            stress[i] = stress_row(a, N)
            cpu[i] = cpu_row(a, N)
            p = n_perf(a, N)
            perf.append(p)
            sys_.append(int(np.argmin(stress[i, :p])) + 1)
        return cls(stress, cpu, perf, sys_)


def _candidate(
    s: NDArray[np.float64], c: NDArray[np.float64], cur: int, top: int, load: float, N: int
) -> tuple[int, float, float, float]:
    """Algorithm 1, lines 8–15, for one application at count ``cur`` under I/O-load ``load``:
    the first n in cur+1..top with load ≤ 1 − (S(n) − S(cur))/N and CPUload(n) ≥ CPUload(cur).

    Returns (n, gain, lo, hi), n = 0 when there is none. The answer depends on the load
    only through the feasibility test, so it stays the same for every load in (lo, hi]: hi is
    the limit of n (above it n is infeasible), lo the largest limit of an earlier count with
    a non-negative gain (at or below it that count becomes the answer)."""
    if cur >= top:
        return 0, -1.0, -math.inf, math.inf
    seg_s = s[cur:top]  # counts cur+1..top
    seg_c = c[cur:top]
    limits = 1.0 - (seg_s - s[cur - 1]) / N
    ok_gain = seg_c >= c[cur - 1]
    hits = np.flatnonzero(ok_gain & (load <= limits))
    if hits.size == 0:
        usable = limits[ok_gain]
        return 0, -1.0, (float(usable.max()) if usable.size else -math.inf), math.inf
    k = int(hits[0])
    before = limits[:k][ok_gain[:k]]
    lo = float(before.max()) if before.size else -math.inf
    return cur + 1 + k, float(seg_c[k] - c[cur - 1]), lo, float(limits[k])


def tcpu_allocator(apps: Sequence[App], N: int, q_cpu: int, rng: random.Random) -> list[int]:
    """TCPU-Allocator ([DIST-IO] Algorithm 1): start at π_sys; each round, every application
    i proposes the first count above π(i) (up to n_perf^i) that keeps I/O-load ≤ 1 with only
    i changed and does not lower CPUload(i); the proposal of largest CPUload gain (ties: lowest
    index) is committed; stop when none is left. Needs V_io, T_cpu and b_j.

    Exact and fast: each application's proposal is cached with the interval of I/O-load over
    which it stays the same (it depends on the load only through the feasibility test), so a
    round recomputes only the applications whose interval the new load left."""
    _check(N, q_cpu)
    return tcpu_from_tables(Tables.build(apps, N), N)


def tcpu_from_tables(tables: Tables, N: int) -> list[int]:
    """TCPU-Allocator on precomputed ``Tables`` (see ``tcpu_allocator``)."""
    S, C = tables.stress, tables.cpu
    K = len(tables.n_perf)
    pi = list(tables.n_sys)
    load = float(sum(S[i, pi[i] - 1] for i in range(K))) / N
    version = [0] * K
    gains: list[tuple[float, int, int, int]] = []  # (−gain, i, version, n)
    above: list[tuple[float, int, int]] = []  # min-heap on hi: stale when load > hi
    below: list[tuple[float, int, int]] = []  # max-heap on lo: stale when load ≤ lo

    def refresh(i: int) -> None:
        version[i] += 1
        n, gain, lo, hi = _candidate(S[i], C[i], pi[i], tables.n_perf[i], load, N)
        v = version[i]
        if n:
            heapq.heappush(gains, (-gain, i, v, n))
        if hi != math.inf:
            heapq.heappush(above, (hi, i, v))
        if lo != -math.inf:
            heapq.heappush(below, (-lo, i, v))

    for i in range(K):
        refresh(i)
    while True:
        # recompute the applications whose cached proposal the current load invalidated
        while above and (above[0][2] != version[above[0][1]] or load > above[0][0]):
            _, i, v = heapq.heappop(above)
            if v == version[i]:
                refresh(i)
        while below and (below[0][2] != version[below[0][1]] or load <= -below[0][0]):
            _, i, v = heapq.heappop(below)
            if v == version[i]:
                refresh(i)
        while gains and gains[0][2] != version[gains[0][1]]:
            heapq.heappop(gains)
        if not gains:
            return pi
        _, i, _, n = heapq.heappop(gains)
        load += (S[i, n - 1] - S[i, pi[i] - 1]) / N
        pi[i] = n
        refresh(i)


def tcpu_reference(apps: Sequence[App], N: int, q_cpu: int, rng: random.Random) -> list[int]:
    """Algorithm 1 transcribed round by round (O(K·N) per round), with the same line-15
    reading and feasibility test as ``tcpu_allocator``: the specification the fast version is
    tested against, and a way to count rounds (``tcpu_rounds``)."""
    return tcpu_rounds(apps, N, q_cpu)[0]


def tcpu_rounds(apps: Sequence[App], N: int, q_cpu: int) -> tuple[list[int], int]:
    """``tcpu_reference``'s allocation and the number of rounds that committed a step."""
    _check(N, q_cpu)
    t = Tables.build(apps, N)
    S, C = t.stress, t.cpu
    K = len(apps)
    pi = list(t.n_sys)
    load = float(sum(S[i, pi[i] - 1] for i in range(K))) / N
    rounds = 0
    while True:
        load_diff = [-1.0] * K
        proposal = list(pi)
        for i in range(K):
            n = pi[i]
            while n != t.n_perf[i] and load_diff[i] < 0:
                n += 1
                if load <= 1.0 - (S[i, n - 1] - S[i, pi[i] - 1]) / N:
                    gain = float(C[i, n - 1] - C[i, pi[i] - 1])
                    if gain >= 0:
                        load_diff[i] = gain
                        proposal[i] = n
        idx = max(range(K), key=lambda j: (load_diff[j], -j)) if K else 0
        if K == 0 or load_diff[idx] < 0:
            return pi, rounds
        load += (S[idx, proposal[idx] - 1] - S[idx, pi[idx] - 1]) / N
        pi[idx] = proposal[idx]
        rounds += 1


def mckp(apps: Sequence[App], N: int, q_cpu: int, rng: random.Random) -> list[int]:
    """MCKP, the baseline of Bez et al. as [DIST-IO] §V-B runs it (reading in the module
    docstring): maximise Σ_j b_j(n_j) with Σ_j n_j ≤ N·⌈K/N⌉ and every n_j ≥ 1, exactly, by
    dynamic programming. Ties: the smallest total count, then the smallest counts for the
    first applications. Needs b_j (a profile) for every application."""
    _check(N, q_cpu)
    return mckp_with_capacity(apps, N, N * math.ceil(len(apps) / N))


def mckp_with_capacity(apps: Sequence[App], N: int, cap: int) -> list[int]:
    """The exact multiple-choice knapsack of ``mckp`` with an explicit capacity ``cap``
    (≥ the number of applications): maximise Σ_j b_j(n_j) with Σ_j n_j ≤ cap, 1 ≤ n_j ≤ N."""
    K = len(apps)
    if K == 0:
        return []
    if cap < K:
        raise ValueError(f"capacity {cap} cannot give {K} applications one resource each")
    rows: list[NDArray[np.float64]] = []
    for a in apps:
        if a.profile is None:
            raise ValueError(f"{a.app_id}: MCKP needs b_j (a bandwidth profile)")
        rows.append(a.profile.array(min(N, a.profile.n_max)))
    # best[c] = best total bandwidth of the applications so far using exactly c resources
    neg = -math.inf
    best = np.full(cap + 1, neg)
    best[0] = 0.0
    choice = np.zeros((K, cap + 1), dtype=np.int32)
    for j, row in enumerate(rows):
        new = np.full(cap + 1, neg)
        pick = np.zeros(cap + 1, dtype=np.int32)
        for n in range(len(row), 0, -1):  # descending so that ties keep the smallest n
            cand = np.full(cap + 1, neg)
            cand[n:] = best[: cap + 1 - n] + row[n - 1]
            better = cand >= new
            new = np.where(better, cand, new)
            pick = np.where(better, n, pick)
        best = new
        choice[j] = pick
    # the best total, smallest capacity used on ties
    c = int(np.argmax(best))
    out = [0] * K
    for j in range(K - 1, -1, -1):
        n = int(choice[j, c])
        out[j] = n
        c -= n
    return out


ALLOCATORS: dict[str, Allocator] = {
    "random": random_allocation,
    "static": static,
    "best-bdw": best_bdw,
    "nsys-allocator": nsys_allocator,
    "tcpu-allocator": tcpu_allocator,
    "mckp": mckp,
}
"""The allocators by their command-line names ([DIST-IO] §IV-A and the MCKP baseline)."""

REQUIRED_LEVEL: dict[str, int] = {
    "random": 0,
    "static": 0,
    "best-bdw": 1,
    "nsys-allocator": 2,
    "tcpu-allocator": 2,
    "mckp": 2,
}
"""The information level each allocator needs for an application ([DIST-IO] Table II; MCKP
needs b_j, which in burstctl only comes with level-2 data)."""


def allocate(
    name: str, apps: Sequence[App], N: int, q_cpu: int, rng: random.Random | None = None
) -> list[int]:
    """The allocation of ``apps`` by the allocator called ``name`` (a key of
    ``ALLOCATORS``); ``rng`` defaults to ``random.Random(0)``."""
    try:
        fn = ALLOCATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown allocator {name!r}; known: {', '.join(sorted(ALLOCATORS))}"
        ) from None
    return fn(apps, N, q_cpu, rng if rng is not None else random.Random(0))
